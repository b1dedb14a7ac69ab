"""Availability forecasts: the predictor contract and its registered implementations."""

from liveput.forecast import auto, markov, persistence, statistical  # noqa: F401  (registration)
from liveput.forecast.base import PREDICTORS, Forecast, Predictor

DEFAULT_PREDICTOR = "auto"


def make_predictor(name: str = DEFAULT_PREDICTOR, **options: object) -> Predictor:
    """A new predictor instance by name (``persistence``, ``arima``, ``ets``, ``markov``,
    ``markov-stationary``, ``auto``)."""
    return PREDICTORS.get(name)(**options)


__all__ = ["DEFAULT_PREDICTOR", "PREDICTORS", "Forecast", "Predictor", "make_predictor"]
