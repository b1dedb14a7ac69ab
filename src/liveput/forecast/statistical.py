"""Classical time-series forecasts from statsmodels: ARIMA and damped-trend exponential smoothing.

Both fit on the last ``window`` counts and refit every ``refit_every`` intervals; in between,
ARIMA re-filters the new data with its fitted parameters (``ARIMAResults.apply``) and ETS runs the
damped Holt recursion with its fitted smoothing parameters:

    level_t = a y_t + (1 - a)(level_{t-1} + phi trend_{t-1})
    trend_t = b (level_t - level_{t-1}) + (1 - b) phi trend_{t-1}
    y_{t+h} = level_t + (phi + ... + phi^h) trend_t

Distributions are the model's Gaussian predictive distribution (ARIMA) or a Gaussian whose
variance grows with h from the one-step residuals (ETS), discretized to counts. A model that
fails to fit falls back to persistence and says so in the log.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor, check_request, discretized_normal
from liveput.forecast.persistence import PersistencePredictor, preemption_rate_per_instance
from liveput.traces.trace import IntervalTrace

logger = logging.getLogger(__name__)


class _Refitting(Predictor):
    """Shared bookkeeping: when to refit, and falling back to persistence."""

    min_history = 12

    def __init__(self, window: int = 240, refit_every: int = 30) -> None:
        self.window = window
        self.refit_every = refit_every
        self._fitted_at: int | None = None
        self._fallback = PersistencePredictor()

    def _needs_refit(self, length: int) -> bool:
        return (
            self._fitted_at is None
            or length - self._fitted_at >= self.refit_every
            or length < self._fitted_at
        )

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        check_request(history, horizon)
        if len(history) < self.min_history or np.ptp(history.count[-self.window :]) == 0:
            return self._fallback.forecast(history, horizon, capacity)
        capacity = max(capacity, history.max_count)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mean, std = self._predict(
                    history.count[-self.window :].astype(float), len(history), horizon
                )
            if not (np.isfinite(mean).all() and np.isfinite(std).all()):
                raise ValueError("non-finite forecast")
        except Exception as error:  # statsmodels raises many kinds; any failure falls back
            logger.warning("%s failed to fit (%s); falling back to persistence", self.name, error)
            self._fitted_at = None
            return self._fallback.forecast(history, horizon, capacity)
        mean = np.clip(mean, 0, capacity)
        rate = preemption_rate_per_instance(history, self.window)
        return Forecast(
            mean, discretized_normal(mean, std, capacity), rate * mean, np.zeros(horizon), self.name
        )

    def _predict(
        self, values: np.ndarray, length: int, horizon: int
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


@PREDICTORS.register("arima")
class ArimaPredictor(_Refitting):
    """ARIMA(p, d, q) from statsmodels (default (1, 1, 0), as Parcae)."""

    name = "arima"

    def __init__(
        self, order: tuple[int, int, int] = (1, 1, 0), window: int = 240, refit_every: int = 30
    ) -> None:
        super().__init__(window, refit_every)
        self.order = tuple(order)
        self._results: Any = None
        """statsmodels' fitted ARIMA results, once fitted."""

    def _predict(
        self, values: np.ndarray, length: int, horizon: int
    ) -> tuple[np.ndarray, np.ndarray]:
        from statsmodels.tsa.arima.model import ARIMA

        if self._needs_refit(length):
            self._results = ARIMA(values, order=self.order).fit()
            self._fitted_at = length
            results = self._results
        else:
            results = self._results.apply(values)
        prediction = results.get_forecast(horizon)
        return (
            np.asarray(prediction.predicted_mean),
            np.sqrt(np.asarray(prediction.var_pred_mean)),
        )


@PREDICTORS.register("ets")
class DampedTrendPredictor(_Refitting):
    """Holt's damped-trend exponential smoothing from statsmodels."""

    name = "ets"

    def __init__(self, window: int = 240, refit_every: int = 30) -> None:
        super().__init__(window, refit_every)
        self._params: tuple[float, float, float] | None = None
        self._residual_std = 1.0

    def _predict(
        self, values: np.ndarray, length: int, horizon: int
    ) -> tuple[np.ndarray, np.ndarray]:
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        if self._needs_refit(length) or self._params is None:
            fit = ExponentialSmoothing(values, trend="add", damped_trend=True).fit()
            params = fit.params
            self._params = (
                float(params["smoothing_level"]),
                float(params["smoothing_trend"]),
                float(params["damping_trend"]),
            )
            self._residual_std = float(np.std(fit.resid)) or 0.5
            self._fitted_at = length
        alpha, beta, phi = self._params
        level, trend = values[0], 0.0
        for value in values[1:]:
            previous = level
            level = alpha * value + (1 - alpha) * (level + phi * trend)
            trend = beta * (level - previous) + (1 - beta) * phi * trend
        steps = np.arange(1, horizon + 1)
        damping = np.cumsum(phi**steps)
        return level + damping * trend, self._residual_std * np.sqrt(steps)
