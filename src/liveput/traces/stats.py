"""Summary statistics of a trace: what `liveput trace stats` prints and the generator matches."""

from __future__ import annotations

from typing import Any

import numpy as np

from liveput.traces.trace import DEFAULT_INTERVAL_S, Trace


def trace_stats(trace: Trace, interval_s: float = DEFAULT_INTERVAL_S) -> dict[str, Any]:
    """Statistics of ``trace``; counts of preemptions and allocations are instances, not events.

    ``mean_nodes`` is time-weighted over the trace's span; ``allocations`` exclude the instances
    present at the start. The ``*_interval_*`` figures use intervals of ``interval_s``.
    """
    resampled = trace.resample(interval_s)
    hours = trace.hours
    preemptions = int(trace.removed.sum())
    allocations = int(trace.added.sum())
    preempted = resampled.preempted
    allocated = resampled.allocated
    mean_nodes = trace.mean_count()
    return {
        "name": trace.name,
        "hours": hours,
        "interval_s": interval_s,
        "intervals": len(resampled),
        "initial_nodes": trace.initial_count,
        "mean_nodes": mean_nodes,
        "min_nodes": trace.min_count(),
        "max_nodes": trace.max_count(),
        "preemptions": preemptions,
        "allocations": allocations,
        "preemptions_per_hour": preemptions / hours if hours else 0.0,
        "allocations_per_hour": allocations / hours if hours else 0.0,
        "preemptions_per_instance_hour": (
            preemptions / (mean_nodes * hours) if hours and mean_nodes else 0.0
        ),
        "fraction_of_intervals_with_preemption": float((preempted > 0).mean()),
        "fraction_of_intervals_with_allocation": float((allocated > 0).mean()),
        "mean_preemption_burst": float(preempted[preempted > 0].mean()) if preempted.any() else 0.0,
        "mean_allocation_burst": float(allocated[allocated > 0].mean()) if allocated.any() else 0.0,
        "fraction_of_time_empty": float(_time_fraction(trace, lambda c: c == 0)),
    }


def _time_fraction(trace: Trace, predicate: Any) -> float:
    if trace.end_s <= 0:
        return float(predicate(np.array([trace.initial_count]))[0])
    starts, counts = trace.step_function()
    durations = np.diff(np.concatenate((starts, [trace.end_s])))
    return float(durations[predicate(counts)].sum() / trace.end_s)
