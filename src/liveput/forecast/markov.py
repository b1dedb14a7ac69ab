"""A Markov model of the spot market: preemption bursts and allocations that refill a deficit.

Learned online from the history seen so far (nothing after the current interval). With ``n``
instances of a capacity ``C`` (the instances requested), in one interval:

- a preemption burst happens with probability ``p_pre`` and removes ``L`` instances, ``L`` drawn
  from the observed burst sizes (at most n);
- an allocation burst happens with probability ``p_alloc(C - n)`` and adds ``G`` instances, ``G``
  drawn from the observed allocation sizes (at most C - n). ``p_alloc`` depends on the deficit
  (outstanding requests are granted more often the more there are): estimated per deficit bin.

Each probability is a Beta-smoothed frequency blended between the whole history and a recent
window (``recent``, the market's current regime). This gives a transition matrix ``M[n, n']`` over
counts; the predictive distribution is ``pmf_1 = M[n_now]``, ``pmf_{h+1} = pmf_h M``, its median
the point forecast, and ``E[L]`` under ``pmf_h`` the expected preemptions.
"""

from __future__ import annotations

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor, check_request, pmf_median
from liveput.traces.trace import IntervalTrace

DEFICIT_BINS = np.array([1, 2, 4, 8, 16, 10**9])
"""Upper bounds (inclusive) of the deficit bins of the allocation probability."""


def _size_distribution(sizes: np.ndarray, limit: int, mean_prior: float = 2.0) -> np.ndarray:
    """pmf over 1..limit of burst sizes: observed sizes plus a geometric prior of weight 1."""
    weights = np.zeros(limit + 1)
    if limit < 1:
        return weights  # no room for a burst
    if len(sizes):
        counts = np.bincount(np.clip(sizes, 1, limit), minlength=limit + 1)
        weights += counts[: limit + 1]
    support = np.arange(1, limit + 1)
    prior = (1 / mean_prior) * (1 - 1 / mean_prior) ** (support - 1)
    weights[1:] += prior / prior.sum()
    weights[0] = 0
    return weights / weights.sum()


def _blend(successes: float, trials: float, recent_successes: float, recent_trials: float,
           prior: float) -> float:
    whole = (successes + prior) / (trials + 1)
    recent = (recent_successes + prior) / (recent_trials + 1)
    weight = recent_trials / (recent_trials + 30)
    return float(weight * recent + (1 - weight) * whole)


@PREDICTORS.register("markov")
class MarkovPredictor(Predictor):
    """Burst model of preemptions and deficit-driven allocations (module docstring)."""

    name = "markov"

    def __init__(self, recent: int = 120, window: int = 2880) -> None:
        self.recent = recent
        self.window = window

    def transition_matrix(self, history: IntervalTrace, capacity: int) -> np.ndarray:
        """``M[n, n']`` learned from the known intervals of ``history``."""
        return self._learn(history, capacity)[0]

    def _learn(self, history: IntervalTrace,
               capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(M, loss_mean, gain_mean)``: the transition matrix and, from each count, the
        expected instances preempted and allocated in one interval."""
        start = max(0, len(history) - 1 - self.window)
        known = slice(start, len(history) - 1)  # the current interval's events are unknown
        counts = history.count[known]
        preempted = history.preempted[known]
        allocated = history.allocated[known]
        recent = slice(max(0, len(counts) - self.recent), len(counts))
        p_pre = _blend((preempted > 0).sum(), len(counts), (preempted[recent] > 0).sum(),
                       len(counts[recent]), 0.05)
        loss = _size_distribution(preempted[preempted > 0], capacity)
        gain = _size_distribution(allocated[allocated > 0], capacity)
        deficit = capacity - counts
        bins = np.searchsorted(DEFICIT_BINS, np.maximum(deficit, 0))
        p_alloc_bins = np.zeros(len(DEFICIT_BINS) + 1)
        overall = ((allocated > 0) & (deficit > 0)).sum() / max((deficit > 0).sum(), 1)
        for index in range(len(DEFICIT_BINS)):
            mask = (bins == index) & (deficit > 0)
            recent_mask = mask.copy()
            recent_mask[: max(0, len(mask) - self.recent)] = False
            p_alloc_bins[index] = _blend((allocated[mask] > 0).sum(), mask.sum(),
                                         (allocated[recent_mask] > 0).sum(), recent_mask.sum(),
                                         overall)
        size = capacity + 1
        # Losses first: L[n, n - l] (stay with 1 - p_pre, else lose l, capped at n).
        losses = np.zeros((size, size))
        losses[np.arange(size), np.arange(size)] = 1 - p_pre
        losses[0, 0] += p_pre
        for n in range(1, size):
            capped = np.zeros(n + 1)
            capped[1:] = loss[1 : n + 1]
            capped[n] += loss[n + 1 :].sum()
            losses[n, n - np.arange(n + 1)] += p_pre * capped
        # Then allocations, driven by the deficit left: G[m, m + g].
        grants = np.zeros((size, size))
        for m in range(size):
            room = capacity - m
            if room <= 0:
                grants[m, m] = 1.0
                continue
            p_alloc = p_alloc_bins[np.searchsorted(DEFICIT_BINS, room)]
            granted = np.zeros(room + 1)
            granted[1:] = gain[1 : room + 1]
            granted[room] += gain[room + 1 :].sum()
            grants[m, m] = 1 - p_alloc
            grants[m, m + np.arange(room + 1)] += p_alloc * granted
        matrix = losses @ grants
        loss_mean = p_pre * np.array(
            [np.dot(np.arange(1, n + 1), loss[1 : n + 1]) + n * loss[n + 1 :].sum()
             for n in range(size)])
        gain_mean = (matrix * (np.arange(size)[None, :] - np.arange(size)[:, None])
                     ).sum(axis=1) + loss_mean
        return matrix, loss_mean, gain_mean

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        check_request(history, horizon)
        capacity = max(capacity, history.max_count)
        matrix, loss_mean, gain_mean = self._learn(history, capacity)
        state = np.zeros(capacity + 1)
        state[int(history.count[-1])] = 1.0
        pmf = np.zeros((horizon, capacity + 1))
        preempted = np.zeros(horizon)
        allocated = np.zeros(horizon)
        for step in range(horizon):
            preempted[step] = state @ loss_mean
            allocated[step] = state @ gain_mean
            state = state @ matrix
            pmf[step] = state / state.sum()
        return Forecast(pmf_median(pmf), pmf, preempted, allocated, self.name)
