"""Persistence: the count stays the same, with the empirical distribution of its own errors.

Point: ``count[t]`` for every step. Distribution at step h: ``count[t] + e`` with ``e`` drawn from
the errors ``count[s + h] - count[s]`` observed in the last ``window`` intervals of history (the
fair probabilistic baseline). Expected preemptions per interval: the recent per-instance rate
times the point forecast.
"""

from __future__ import annotations

import numpy as np

from liveput.forecast.base import (
    PREDICTORS,
    Forecast,
    Predictor,
    check_request,
    empirical_pmf,
    step_errors,
)
from liveput.traces.trace import IntervalTrace


def recent_rates(history: IntervalTrace, window: int) -> tuple[float, float]:
    """Preempted and allocated instances per interval over the known recent past (the events of
    the current interval are not known yet)."""
    known = slice(max(0, len(history) - 1 - window), len(history) - 1)
    if known.stop <= known.start:
        return 0.0, 0.0
    return float(history.preempted[known].mean()), float(history.allocated[known].mean())


def preemption_rate_per_instance(history: IntervalTrace, window: int) -> float:
    known = slice(max(0, len(history) - 1 - window), len(history) - 1)
    if known.stop <= known.start:
        return 0.0
    counts = history.count[known]
    return float(history.preempted[known].sum() / max(counts.sum(), 1))


@PREDICTORS.register("persistence")
class PersistencePredictor(Predictor):
    """The last count, with its own empirical error distribution."""

    name = "persistence"

    def __init__(self, window: int = 720) -> None:
        self.window = window

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        check_request(history, horizon)
        counts = history.count[-self.window :]
        last = int(history.count[-1])
        capacity = max(capacity, history.max_count)
        pmf = empirical_pmf(last, step_errors(counts, horizon), capacity)
        rate = preemption_rate_per_instance(history, self.window)
        _, allocated = recent_rates(history, self.window)
        return Forecast(
            point=np.full(horizon, float(last)),
            pmf=pmf,
            expected_preempted=np.full(horizon, rate * last),
            expected_allocated=np.full(horizon, allocated),
            method=self.name,
        )
