"""Plot a trace: available instances over time, with preemption and allocation marks."""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from liveput.files import write_bytes_atomic
from liveput.traces.trace import Trace

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """matplotlib's pyplot on its file backend, imported as a figure is first drawn, not with
    the modules that draw: the CLI imports them at start-up, and ``liveput simulate`` prints the
    report's tables without a figure (pyplot's imports took 0.6 s of each such command)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def plot_trace(trace: Trace, path: str | Path) -> Path:
    """Write a PNG of ``trace`` to ``path`` and return the path."""
    starts, counts = trace.step_function()
    hours = list(starts / 3600.0) + [trace.hours]
    figure, axis = pyplot().subplots(figsize=(10, 3.6), dpi=110)
    axis.step(
        hours,
        list(counts) + [counts[-1]],
        where="post",
        color="#1f5f9e",
        lw=1.4,
        label="available instances",
    )
    after = trace.counts
    lost = trace.removed > 0
    gained = trace.added > 0
    axis.scatter(
        trace.times_s[lost] / 3600.0,
        after[lost],
        marker="v",
        color="#c0392b",
        s=14,
        label="preemption",
        zorder=3,
    )
    axis.scatter(
        trace.times_s[gained] / 3600.0,
        after[gained],
        marker="^",
        color="#27ae60",
        s=14,
        label="allocation",
        zorder=3,
    )
    axis.set_xlabel("time (hours)")
    axis.set_ylabel("instances")
    axis.set_title(trace.name)
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="lower left", fontsize=8, ncols=3)
    return save_figure(figure, path)


def save_figure(figure: Figure, path: str | Path) -> Path:
    """Lay out ``figure``, write it as PNG to ``path`` (atomically: no half-written image is
    ever left) and free it."""
    figure.tight_layout()
    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png")
    finally:
        pyplot().close(figure)
    return write_bytes_atomic(path, buffer.getvalue())
