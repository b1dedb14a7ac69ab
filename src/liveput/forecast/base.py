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
from collections.abc import Sequence
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
        # np.allclose(sums, 1.0, atol=1e-6) written out (its rtol 1e-5 times |1.0|): a policy
        # makes a forecast at every interval, and allclose's generality took a tenth of one.
        if not (np.abs(pmf.sum(axis=1) - 1.0) <= 1e-6 + 1e-5 * 1.0).all():
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

    def less_known_losses(self, ends_s: Sequence[float], interval_s: float) -> Forecast:
        """This forecast with instances known to go (a preemption notice each, ``ends_s``
        seconds from now) taken out: the count at step h (``h * interval_s`` from now) less
        those that ended by then, floored at 0, and each counted preempted in the interval
        it ends in (the forecast from the history alone expects them to stay)."""
        if not len(ends_s):
            return self
        ends = np.asarray(ends_s, dtype=float)
        steps = np.arange(1, self.horizon + 1)
        gone = (ends[None, :] <= steps[:, None] * interval_s).sum(axis=1)
        width = self.pmf.shape[1]
        pmf = np.zeros_like(self.pmf)
        for h, k in enumerate(np.minimum(gone, width - 1)):
            pmf[h, 0] = self.pmf[h, : k + 1].sum()
            pmf[h, 1 : width - k] = self.pmf[h, k + 1 :]
        # Interval i runs from i * interval_s to (i + 1) * interval_s; an end already due is now.
        ending = np.minimum(np.floor(np.maximum(ends, 0.0) / interval_s), self.horizon - 1)
        preempted = self.expected_preempted + np.bincount(
            ending.astype(np.int64), minlength=self.horizon
        )
        return Forecast(
            np.maximum(self.point - gone, 0.0),
            pmf,
            preempted,
            self.expected_allocated,
            f"{self.method}, less {len(ends)} noticed",
        )

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


def discretized_normal(mean: np.ndarray, std: np.ndarray, capacity: int) -> np.ndarray:
    """pmf over 0..capacity of N(mean, std^2) rounded to integers, tails folded into the ends."""
    from scipy.stats import norm

    edges = np.arange(capacity + 2) - 0.5
    edges[0], edges[-1] = -np.inf, np.inf
    std = np.maximum(np.asarray(std, dtype=float), 1e-6)
    cdf = norm.cdf((edges[None, :] - np.asarray(mean, dtype=float)[:, None]) / std[:, None])
    pmf = np.diff(cdf, axis=1)
    return pmf / pmf.sum(axis=1, keepdims=True)


def step_errors(counts: np.ndarray, horizon: int) -> list[np.ndarray]:
    """``errors[h-1]`` = count[t + h] - count[t] for every t with t + h in the history."""
    return [
        counts[h:] - counts[:-h] if len(counts) > h else np.zeros(0, dtype=counts.dtype)
        for h in range(1, horizon + 1)
    ]


def empirical_pmf(
    last: int, errors: list[np.ndarray], capacity: int, prior_weight: float = 1.0
) -> np.ndarray:
    """pmf of ``last + error`` at each step from observed errors, with a small prior mass
    spread over +-1 around ``last`` so an empty history still gives a usable distribution."""
    width = capacity + 1
    pmf = np.zeros((len(errors), width))
    if errors:
        # Every step's counts in one bincount: step s's values are offset by s rows. The
        # forecasters call this once per forecast, and a loop over steps was most of its time.
        rows = np.repeat(np.arange(len(errors)) * width, [len(e) for e in errors])
        values = np.clip(last + np.concatenate(errors), 0, capacity) + rows
        pmf[:] = np.bincount(values, minlength=len(errors) * width).reshape(len(errors), width)
    for offset, share in ((0, 0.5), (-1, 0.25), (1, 0.25)):
        pmf[:, min(max(last + offset, 0), capacity)] += prior_weight * share
    return pmf / pmf.sum(axis=1, keepdims=True)


def pmf_median(pmf: np.ndarray) -> np.ndarray:
    """Median of each row (the MAE-optimal point forecast)."""
    return np.argmax(np.cumsum(pmf, axis=1) >= 0.5, axis=1).astype(float)


def crps(pmf: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Continuous ranked probability score of integer pmfs against integer outcomes, per row."""
    support = np.arange(pmf.shape[1])
    cdf = np.cumsum(pmf, axis=1)
    observed = (support[None, :] >= np.asarray(truth)[:, None]).astype(float)
    return ((cdf - observed) ** 2).sum(axis=1)
