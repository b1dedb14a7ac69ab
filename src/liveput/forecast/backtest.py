"""Walk-forward backtests: forecast at every interval after a warm-up, score against the truth."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.forecast.base import PREDICTORS, crps
from liveput.traces.trace import IntervalTrace


@dataclass(frozen=True)
class MethodScore:
    """Errors of one method over a backtest."""

    mae: np.ndarray
    """Mean absolute error at each step h = 1..H (instances)."""
    crps: np.ndarray
    """Mean CRPS at each step (instances)."""
    ms_per_forecast: float
    """Mean wall time of one forecast (ms), for the benchmark."""

    @property
    def mae_mean(self) -> float:
        return float(self.mae.mean())

    @property
    def crps_mean(self) -> float:
        return float(self.crps.mean())


def backtest(trace: IntervalTrace, methods: list[str], horizon: int = 12, warmup: int = 60,
             capacity: int | None = None,
             on_step: Callable[[], None] | None = None) -> dict[str, MethodScore]:
    """Score ``methods`` forecasting at every interval t in [warmup, len - 2]."""
    if horizon < 1:
        raise LiveputError(f"horizon must be >= 1, got {horizon}")
    if warmup < 1:
        raise LiveputError(f"warm-up must be >= 1 interval, got {warmup}")
    if len(trace) < warmup + 2:
        raise LiveputError(f"trace {trace.name} has {len(trace)} intervals, fewer than the "
                           f"warm-up ({warmup}) plus 2")
    capacity = capacity or trace.max_count
    predictors = {name: PREDICTORS.get(name)() for name in methods}
    counts = trace.count
    errors = {name: [[] for _ in range(horizon)] for name in methods}
    scores = {name: [[] for _ in range(horizon)] for name in methods}
    elapsed = dict.fromkeys(methods, 0.0)
    calls = 0
    for now in range(warmup, len(trace) - 1):
        history = trace.head(now + 1)
        steps = min(horizon, len(trace) - 1 - now)
        truth = counts[now + 1 : now + 1 + steps]
        for name, predictor in predictors.items():
            start = time.perf_counter()
            forecast = predictor.forecast(history, horizon, capacity)
            elapsed[name] += time.perf_counter() - start
            width = forecast.pmf.shape[1]
            step_crps = crps(forecast.pmf[:steps], np.minimum(truth, width - 1))
            for h in range(steps):
                errors[name][h].append(abs(forecast.point[h] - truth[h]))
                scores[name][h].append(step_crps[h])
        calls += 1
        if on_step is not None:
            on_step()
    return {
        name: MethodScore(np.array([np.mean(e) for e in errors[name]]),
                          np.array([np.mean(s) for s in scores[name]]),
                          elapsed[name] / max(calls, 1) * 1e3)
        for name in methods
    }
