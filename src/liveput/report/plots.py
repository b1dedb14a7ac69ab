"""The report's figures, one PNG each, from a :class:`SimulationResult`:

- ``available.png``: spot instances available at the start of each interval;
- ``configurations.png``: each policy's configuration over time (instances used, D x P, one
  panel per policy, annotated with D x P where the pipeline depth changes);
- ``samples.png``: cumulative samples trained by each policy;
- ``cost.png``: cumulative dollars paid by each policy, and dollars per 1,000 samples so far.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from liveput.files import write_bytes_atomic
from liveput.sim.result import SimulationResult
from liveput.traces.plot import pyplot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


COLORS = {
    "liveput": "#1f5f9e",
    "liveput-oracle": "#6aa6d8",
    "reactive": "#c0392b",
    "bamboo": "#8e44ad",
    "checkpoint": "#d68910",
    "on-demand": "#27ae60",
    "ideal": "#555555",
}


def _hours(result: SimulationResult, length: int) -> np.ndarray:
    return np.arange(length + 1) * result.interval_s / 3600.0


def _color(name: str) -> str:
    return COLORS.get(name, "#34495e")


def _single(title: str) -> tuple[Figure, Axes]:
    figure, axis = pyplot().subplots(figsize=(10, 3.6), dpi=110)
    axis.set_title(title)
    axis.set_xlabel("time (hours)")
    axis.grid(alpha=0.3)
    return figure, axis


def _finish(figure: Figure, axis: Axes) -> Figure:
    axis.set_ylim(bottom=0)
    figure.tight_layout()
    return figure


def _available(result: SimulationResult) -> Figure:
    figure, axis = _single(f"available instances: {result.trace}")
    run = next(iter(result.runs.values()))
    hours = _hours(result, len(run.available))
    counts = np.append(run.available, run.available[-1])
    axis.step(hours, counts, where="post", color="#1f5f9e", lw=1.3)
    axis.fill_between(hours, counts, step="post", alpha=0.15, color="#1f5f9e")
    axis.set_ylabel("spot instances")
    return _finish(figure, axis)


def _cumulative(result: SimulationResult, field: str, label: str, title: str) -> Figure:
    figure, axis = _single(title)
    for name, run in result.runs.items():
        values = getattr(run, field)
        hours = _hours(result, len(values))[1:]
        axis.plot(
            hours,
            values,
            label=name,
            color=_color(name),
            lw=1.5,
            ls="--" if name == "ideal" else "-",
        )
    axis.set_ylabel(label)
    axis.legend(fontsize=8, ncols=4, loc="upper left")
    return _finish(figure, axis)


def _samples(result: SimulationResult) -> Figure:
    return _cumulative(result, "cumulative_samples", "samples trained", "cumulative samples")


def _cost(result: SimulationResult) -> Figure:
    """Dollars paid so far (top) and dollars per 1,000 samples trained so far (bottom): spot
    policies that hold the same instances pay the same, and differ in what they get for it."""
    figure, (paid, rate) = pyplot().subplots(2, 1, figsize=(10, 6), dpi=110, sharex=True)
    for name, run in result.runs.items():
        hours = _hours(result, len(run.cumulative_cost_usd))[1:]
        style = dict(label=name, color=_color(name), lw=1.5, ls="--" if name == "ideal" else "-")
        paid.plot(hours, run.cumulative_cost_usd, **style)
        trained = run.cumulative_samples > 0
        rate.plot(
            hours[trained],
            run.cumulative_cost_usd[trained] / run.cumulative_samples[trained] * 1000,
            **style,
        )
    paid.set_title("cost: dollars paid so far, and per 1,000 samples trained so far")
    paid.set_ylabel("dollars")
    rate.set_ylabel("$ / 1k samples")
    rate.set_xlabel("time (hours)")
    paid.legend(fontsize=8, ncols=4, loc="upper left")
    for axis in (paid, rate):
        axis.grid(alpha=0.3)
        axis.set_ylim(bottom=0)
    top = max(
        (
            float(
                np.percentile(
                    run.cumulative_cost_usd[run.cumulative_samples > 0]
                    / run.cumulative_samples[run.cumulative_samples > 0],
                    50,
                )
            )
            * 1000
            for run in result.runs.values()
            if (run.cumulative_samples > 0).any()
        ),
        default=1.0,
    )
    rate.set_ylim(0, 3 * top)  # the first minutes of a run (few samples) would dwarf the rest
    figure.tight_layout()
    return figure


def _configurations(result: SimulationResult) -> Figure:
    names = list(result.runs)
    figure, axes = pyplot().subplots(
        len(names), 1, figsize=(10, 1.35 * len(names) + 0.8), dpi=110, sharex=True, squeeze=False
    )
    for axis, name in zip(axes[:, 0], names, strict=True):
        run = result.runs[name]
        hours = _hours(result, len(run.available))
        used = run.data_parallel * run.pipeline_stages
        axis.step(
            hours,
            np.append(run.available, run.available[-1]),
            where="post",
            color="#bbbbbb",
            lw=1.0,
        )
        axis.step(hours, np.append(used, used[-1]), where="post", color=_color(name), lw=1.5)
        changes = np.flatnonzero(np.diff(np.concatenate(([-1], run.pipeline_stages))) != 0)
        spacing_h = hours[-1] / 24  # at most about 24 labels a panel, so they stay legible
        last_h = -np.inf
        for index in changes:
            if run.pipeline_stages[index] > 0 and hours[index] - last_h >= spacing_h:
                last_h = hours[index]
                axis.annotate(
                    f"{run.data_parallel[index]}x{run.pipeline_stages[index]}",
                    (hours[index], used[index]),
                    fontsize=6,
                    color=_color(name),
                    xytext=(1, 2),
                    textcoords="offset points",
                )
        axis.set_ylabel(name, fontsize=8, rotation=0, ha="right", va="center")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0, 0].set_title(
        "configuration over time: instances used (D x P where the depth changes); grey: available"
    )
    axes[-1, 0].set_xlabel("time (hours)")
    figure.tight_layout()
    return figure


FIGURES: dict[str, Callable[[SimulationResult], Figure]] = {
    "available": _available,
    "configurations": _configurations,
    "samples": _samples,
    "cost": _cost,
}
"""Each figure of the report, by file stem."""


def write_figures(result: SimulationResult, directory: str | Path) -> dict[str, Path]:
    """Write every figure as PNG into ``directory``; returns their paths by name."""
    directory = Path(directory)
    directory.mkdir(exist_ok=True)
    paths: dict[str, Path] = {}
    for name, draw in FIGURES.items():
        figure = draw(result)
        buffer = io.BytesIO()
        try:
            figure.savefig(buffer, format="png")
        finally:
            pyplot().close(figure)
        paths[name] = write_bytes_atomic(directory / f"{name}.png", buffer.getvalue())
    return paths
