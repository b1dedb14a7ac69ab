"""The predictor contract: forecast the instances a job will have in the next H intervals.

A forecast made at interval ``t`` sees only the history up to and including ``t`` (the
``IntervalTrace`` window ``[0, t]``: ``count[t]`` is the count now; ``preempted[t]`` and
``allocated[t]`` are *not yet known* at the start of interval ``t`` and must not be used; callers
pass ``history = trace.head(t + 1)`` and predictors use ``history.count`` fully and the event
arrays only up to ``t - 1``).

Step ``h`` (1..H) of a forecast is the count at the start of interval ``t + h``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.registry import Registry
from liveput.traces.trace import IntervalTrace


@dataclass(frozen=True)
class Forecast:
    """A point forecast and a predictive distribution for each of the next H intervals."""

    point: np.ndarray
    """Point forecast of the count at step h = 1..H, shape (H,) (float, instances)."""
    pmf: np.ndarray
    """Probability of each count 0..capacity at step h, shape (H, capacity + 1); rows sum to 1."""
    expected_preempted: np.ndarray
    """Expected instances preempted during each of the next H intervals, shape (H,)."""
    expected_allocated: np.ndarray
    """Expected instances allocated during each of the next H intervals, shape (H,)."""
    method: str = ""
    """The predictor that made it (for ``auto``, the one selected or ``auto``)."""

    def __post_init__(self) -> None:
        pmf = np.asarray(self.pmf, dtype=float)
        if pmf.ndim != 2 or pmf.shape[0] != len(self.point):
            raise ValueError("forecast pmf must have shape (horizon, capacity + 1)")
        if not np.allclose(pmf.sum(axis=1), 1.0, atol=1e-6):
            raise ValueError("forecast pmf rows must sum to 1")

    @property
    def horizon(self) -> int:
        return len(self.point)

    @property
    def capacity(self) -> int:
        return self.pmf.shape[1] - 1

    def quantile(self, q: float) -> np.ndarray:
        """The q-quantile of the count at each step, shape (H,)."""
        cdf = np.cumsum(self.pmf, axis=1)
        return np.argmax(cdf >= q - 1e-12, axis=1).astype(float)

    @classmethod
    def certain(cls, counts: np.ndarray, capacity: int, method: str = "oracle") -> Forecast:
        """A forecast that puts all mass on known counts (the true future, for the oracle)."""
        counts = np.asarray(counts, dtype=np.int64)
        pmf = np.zeros((len(counts), capacity + 1))
        pmf[np.arange(len(counts)), np.clip(counts, 0, capacity)] = 1.0
        zeros = np.zeros(len(counts))
        return cls(counts.astype(float), pmf, zeros, zeros, method)


class Predictor(ABC):
    """Forecasts the available count from the history seen so far (pure: no I/O, no clock)."""

    name: str = ""

    @abstractmethod
    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        """Forecast the next ``horizon`` intervals after ``history`` (whose last interval is now).

        ``capacity`` bounds the counts of the predictive distribution (the instances requested).
        """


PREDICTORS: Registry[type[Predictor]] = Registry("predictor")


def check_request(history: IntervalTrace, horizon: int, min_history: int = 1) -> None:
    """Raise a clear error for a request no predictor can answer."""
    if horizon < 1:
        raise LiveputError(f"forecast horizon must be >= 1, got {horizon}")
    if len(history) < min_history:
        raise LiveputError(
            f"forecast needs at least {min_history} intervals of history, got {len(history)}"
        )
