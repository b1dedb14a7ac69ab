"""The report of a deadline simulation: a summary table and two figures, self-contained:

- ``deadline_cost.png``: dollars each policy pays against the deadline (the job replayed at
  several deadlines; a hollow marker: the deadline was missed);
- ``mix.png``: the spot and on-demand instances each policy held over time (one panel a policy,
  the deadline as a line).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from liveput.files import write_bytes_atomic, write_text_atomic
from liveput.report.html import STYLE
from liveput.sim.result import SimulationResult
from liveput.sim.sweep import DeadlineSweepRow
from liveput.traces.plot import pyplot

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {
    "liveput": "#1f5f9e",
    "uniform-progress": "#c0392b",
    "greedy": "#d68910",
    "on-demand": "#27ae60",
    "spot-only": "#8e44ad",
    "omniscient": "#555555",
}

DEADLINE_HEADER = ["policy", "met", "late h", "done h", "$", "$ spot", "$ OD", "OD h"]
"""Columns of the deadline table (the CLI prints the same; short enough for 80 columns): met
the deadline, hours late, hours to done, dollars in all, for spot and for on-demand (OD), and
on-demand instance-hours."""


def deadline_rows(result: SimulationResult) -> list[list[str]]:
    """Rows of the deadline table."""
    rows = []
    for name, run in result.runs.items():
        rows.append(
            [
                name,
                "yes" if run.deadline_met else "no",
                f"{run.hours_late:.2f}",
                "-" if run.finished_hours is None else f"{run.finished_hours:.2f}",
                f"{run.cost_usd:,.2f}",
                f"{run.usd_spot:,.2f}",
                f"{run.usd_on_demand:,.2f}",
                f"{run.on_demand_hours:,.1f}",
            ]
        )
    return rows


def _cost_figure(rows: Sequence[DeadlineSweepRow]) -> Figure:
    figure, axis = pyplot().subplots(figsize=(10, 4), dpi=110)
    for name in dict.fromkeys(row.policy for row in rows):
        mine = sorted((row for row in rows if row.policy == name), key=lambda r: r.deadline_hours)
        hours = np.array([row.deadline_hours for row in mine])
        usd = np.array([row.usd for row in mine])
        met = np.array([row.deadline_met for row in mine])
        color = COLORS.get(name, "#34495e")
        axis.plot(hours, usd, color=color, lw=1.5, label=name)
        axis.scatter(hours[met], usd[met], color=color, s=25)
        axis.scatter(hours[~met], usd[~met], facecolors="none", edgecolors=color, s=40)
    axis.set_title("cost against the deadline (hollow: deadline missed)")
    axis.set_xlabel("deadline (hours)")
    axis.set_ylabel("dollars")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, ncols=3)
    figure.tight_layout()
    return figure


def _mix_figure(result: SimulationResult) -> Figure:
    names = list(result.runs)
    figure, axes = pyplot().subplots(
        len(names), 1, figsize=(10, 1.4 * len(names) + 0.8), dpi=110, sharex=True, squeeze=False
    )
    for axis, name in zip(axes[:, 0], names, strict=True):
        run = result.runs[name]
        hours = np.arange(len(run.spot) + 1) * result.interval_s / 3600.0
        spot = np.append(run.spot, run.spot[-1] if len(run.spot) else 0)
        total = spot + np.append(run.on_demand, run.on_demand[-1] if len(run.on_demand) else 0)
        axis.fill_between(hours, spot, step="post", color="#6aa6d8", alpha=0.8, lw=0)
        axis.fill_between(hours, spot, total, step="post", color="#e67e22", alpha=0.8, lw=0)
        axis.axvline(result.deadline_hours, color="#c0392b", lw=1.0, ls="--")
        axis.set_ylabel(name, fontsize=8, rotation=0, ha="right", va="center")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0, 0].set_title("instances held: spot (blue) and on-demand (orange); dashed: deadline")
    axes[-1, 0].set_xlabel("time (hours)")
    figure.tight_layout()
    return figure


def write_deadline_report(
    result: SimulationResult, curve: Sequence[DeadlineSweepRow], directory: str | Path
) -> Path:
    """Write ``index.html`` and its PNGs into ``directory`` (``curve``: the same job at several
    deadlines, for the cost-vs-deadline figure); returns the page's path."""
    directory = Path(directory)
    directory.mkdir(exist_ok=True)
    sections = []
    captions = {
        "deadline_cost": "Dollars paid against the deadline, for the same work.",
        "mix": "Spot and on-demand instances held over time by each policy.",
    }
    for name, figure in (("deadline_cost", _cost_figure(curve)), ("mix", _mix_figure(result))):
        buffer = io.BytesIO()
        try:
            figure.savefig(buffer, format="png")
        finally:
            pyplot().close(figure)
        write_bytes_atomic(directory / f"{name}.png", buffer.getvalue())
        encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
        sections.append(
            f'<figure><img alt="{name}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{html.escape(captions[name])}</figcaption></figure>"
        )
    header = "".join(f"<th>{html.escape(cell)}</th>" for cell in DEADLINE_HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in deadline_rows(result)
    )
    title = f"liveput deadline simulation: {result.model} on {result.trace}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{result.target_samples:,.0f} samples by {result.deadline_hours:.2f} h (the all-on-demand time
on {result.on_demand_max} instances: {result.fastest_hours:.2f} h). Every policy met the same
preemptions and on-demand launch delays.</p>
<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>
{"".join(sections)}
</body></html>
"""
    return write_text_atomic(directory / "index.html", page)
