"""Plot a walk-forward pass: h-step forecasts with their 10-90% interval against the truth."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from liveput.forecast.backtest import Walk
from liveput.traces.plot import pyplot, save_figure
from liveput.traces.trace import IntervalTrace


def plot_forecasts(trace: IntervalTrace, walk: Walk, path: str | Path) -> Path:
    """Top: the true count and the forecasts made 1 and H steps earlier, with the H-step 10-90%
    band. Bottom: mean absolute error at each step h. Writes a PNG to ``path``."""
    hours_per_interval = trace.interval_s / 3600.0
    horizon = walk.point.shape[1]
    figure, (top, bottom) = pyplot().subplots(
        2, 1, figsize=(10, 6), dpi=110, gridspec_kw={"height_ratios": [2.2, 1]}
    )
    hours = np.arange(len(trace) + 1) * hours_per_interval
    top.step(
        hours,
        np.append(trace.count, trace.end_count),
        where="post",
        color="#222222",
        lw=1.3,
        label="true count",
    )
    for step, color in ((1, "#2e86c1"), (horizon, "#d35400")):
        # The forecast of interval t + h, drawn at t + h.
        at = (walk.origins + step) * hours_per_interval
        keep = ~np.isnan(walk.truth[:, step - 1])
        top.step(
            at[keep],
            walk.point[keep, step - 1],
            where="post",
            color=color,
            lw=1.0,
            label=f"forecast {step} step{'s' if step > 1 else ''} ahead",
        )
        if step == horizon:
            top.fill_between(
                at[keep],
                walk.low[keep, step - 1],
                walk.high[keep, step - 1],
                step="post",
                color=color,
                alpha=0.18,
                label=f"{horizon}-step 10-90% interval",
            )
    top.set_ylabel("instances")
    top.set_xlabel("time (hours)")
    top.set_title(f"{trace.name}: {walk.method} forecasts")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(loc="lower left", fontsize=8, ncols=2)
    mae = np.nanmean(np.abs(walk.point - walk.truth), axis=0)
    bottom.bar(np.arange(1, horizon + 1), mae, color="#5d6d7e")
    bottom.set_xlabel("steps ahead (h)")
    bottom.set_ylabel("MAE (instances)")
    bottom.grid(alpha=0.3, axis="y")
    return save_figure(figure, path)
