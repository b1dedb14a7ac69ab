"""Walk-forward backtests: forecast at every interval after a warm-up, score against the truth.

At every origin ``t`` in ``[warmup, len - 2]`` a predictor sees ``trace.head(t + 1)`` only (the
counts up to now; see ``forecast.base``) and forecasts steps ``h = 1..H``; step h is scored
against ``count[t + h]`` where the trace has it. Scores per step h, averaged over origins:

- MAE: ``|point_h - count[t + h]|`` (instances);
- CRPS: ``sum_k (F_h(k) - 1[k >= count[t + h]])^2`` over the integer support (instances), the
  probabilistic score of the whole predictive distribution (0 for a certain, right forecast).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from liveput.errors import LiveputError
from liveput.forecast.base import PREDICTORS, crps
from liveput.traces.trace import IntervalTrace

BASELINE = "persistence"
"""The method every other one is compared with."""


@dataclass(frozen=True)
class Walk:
    """The forecasts of one method at every origin of a walk-forward pass."""

    method: str
    origins: np.ndarray
    """Interval index t of each forecast, shape (n,)."""
    point: np.ndarray
    """Point forecast of steps 1..H at each origin, shape (n, H)."""
    low: np.ndarray
    """10% quantile, shape (n, H)."""
    high: np.ndarray
    """90% quantile, shape (n, H)."""
    truth: np.ndarray
    """True count at each step (NaN past the trace's end), shape (n, H)."""
    crps: np.ndarray
    """CRPS of each step (NaN past the trace's end), shape (n, H)."""
    ms_per_forecast: float
    """Mean wall time of one forecast (fit or update, and predict), ms."""


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


def check_backtest(trace: IntervalTrace, horizon: int, warmup: int) -> None:
    """Raise a one-line error for a backtest that cannot run."""
    if horizon < 1:
        raise LiveputError(f"horizon must be >= 1, got {horizon}")
    if warmup < 1:
        raise LiveputError(f"warm-up must be >= 1 interval, got {warmup}")
    if len(trace) < warmup + 2:
        raise LiveputError(
            f"trace {trace.name} has {len(trace)} intervals, fewer than the "
            f"warm-up ({warmup}) plus 2"
        )


def walk_forward(
    trace: IntervalTrace,
    method: str,
    horizon: int = 12,
    warmup: int = 60,
    capacity: int | None = None,
    on_step: Callable[[], None] | None = None,
) -> Walk:
    """Forecast with ``method`` at every origin after ``warmup`` (module docstring)."""
    check_backtest(trace, horizon, warmup)
    predictor = PREDICTORS.get(method)()
    capacity = capacity or trace.max_count
    origins = np.arange(warmup, len(trace) - 1)
    shape = (len(origins), horizon)
    point, low, high = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    truth, scores = np.full(shape, np.nan), np.full(shape, np.nan)
    counts = trace.count
    elapsed = 0.0
    for row, now in enumerate(origins.tolist()):
        history = trace.head(now + 1)
        start = time.perf_counter()
        forecast = predictor.forecast(history, horizon, capacity)
        elapsed += time.perf_counter() - start
        steps = min(horizon, len(trace) - 1 - now)
        observed = counts[now + 1 : now + 1 + steps]
        point[row] = forecast.point
        low[row] = forecast.quantile(0.1)
        high[row] = forecast.quantile(0.9)
        truth[row, :steps] = observed
        width = forecast.pmf.shape[1]
        scores[row, :steps] = crps(forecast.pmf[:steps], np.minimum(observed, width - 1))
        if on_step is not None:
            on_step()
    return Walk(
        method, origins, point, low, high, truth, scores, elapsed / max(len(origins), 1) * 1e3
    )


def backtest(
    trace: IntervalTrace,
    methods: list[str],
    horizon: int = 12,
    warmup: int = 60,
    capacity: int | None = None,
    on_step: Callable[[], None] | None = None,
) -> dict[str, MethodScore]:
    """Score ``methods`` by walking forward over ``trace`` (one pass per method)."""
    check_backtest(trace, horizon, warmup)
    scores = {}
    for name in methods:
        walk = walk_forward(trace, name, horizon, warmup, capacity, on_step)
        errors = np.abs(walk.point - walk.truth)
        scores[name] = MethodScore(
            np.nanmean(errors, axis=0), np.nanmean(walk.crps, axis=0), walk.ms_per_forecast
        )
    return scores


def backtest_summary(
    scores: dict[str, MethodScore], interval_s: float, horizon: int, default_method: str
) -> dict[str, Any]:
    """The JSON object of ``liveput predict backtest --json``."""
    baseline = scores[BASELINE]
    return {
        "interval_s": interval_s,
        "horizon": horizon,
        "methods": {
            name: {
                "mae": score.mae.tolist(),
                "mae_mean": score.mae_mean,
                "crps": score.crps.tolist(),
                "crps_mean": score.crps_mean,
                "mae_ratio_to_persistence": score.mae_mean / max(baseline.mae_mean, 1e-12),
                "crps_ratio_to_persistence": score.crps_mean / max(baseline.crps_mean, 1e-12),
                "ms_per_forecast": score.ms_per_forecast,
            }
            for name, score in scores.items()
        },
        "default_method": default_method,
    }
