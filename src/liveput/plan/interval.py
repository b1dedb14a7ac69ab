"""Expected throughput of every candidate over an interval in which each spot instance is
preempted with probability q.

Notation as in :mod:`liveput.plan.liveput`: a candidate (D, P) runs on ``n`` spot instances and
``o`` on-demand ones; stage j has ``o_j`` on-demand slots and ``s_j = D - o_j`` spot ones, the other
``r = n - sum_j s_j`` spot instances are spares. The optimizer's per-count term is

    S(n) = sum_k Bin(k; n, q) * (thr + E[thr(min_j c_j) | k]) / 2

where, given k, the lost instances are a uniform k-subset of the n. A binomial number of losses
placed uniformly is the same as each instance lost independently with probability q, so the
mixture over k is an expectation under independent losses:

    S(n) = (thr + E_q[thr(min_j c_j)]) / 2,
    E_q[thr(min_j c_j)] = sum_{t=1..D} (thr(t) - thr(t - 1))
                          * prod_j F(s_j - max(0, t - o_j); s_j, q)

with F(l; s, q) = P(Bin(s, q) <= l) (0 for l < 0): stage j keeps t pipelines when it loses at
most ``D - t`` of its slots, its on-demand ones never. Spares drop out (their losses hurt no
stage), so S does not depend on n once the candidate fits: one value per candidate and rate,
instead of a table over instances x candidates x losses. (Term by term: ``Bin(k; n, q) /
C(n, k) * [x^k] poly(x) (1 + x)^r = sum_i poly_i q^i (1 - q)^{s - i}`` with ``s = sum_j s_j``.)
"""

from __future__ import annotations

import numpy as np

from liveput.plan.liveput import on_demand_per_stage


class _Terms:
    """The (candidate, t) terms of E_q for one on-demand count, as flat arrays in candidate
    order."""

    def __init__(
        self,
        owners: np.ndarray,
        starts: np.ndarray,
        gains: np.ndarray,
        high: np.ndarray,
        high_stages: np.ndarray,
        low: np.ndarray,
        low_stages: np.ndarray,
    ) -> None:
        self.owners = owners
        """The candidates that have terms (every running one), in order."""
        self.starts = starts
        """Index of each owner's first term."""
        self.gains = gains
        """thr(t) - thr(t - 1)."""
        self.high = high
        """Index into the table of log F(l; s, q) for the stages with one more on-demand slot
        (``ZERO`` when l < 0, ``ONE`` when there is no such stage)."""
        self.high_stages = high_stages
        """How many stages have one more on-demand slot (``o mod P``)."""
        self.low = low
        self.low_stages = low_stages
        self.uniform = not high_stages.any()


class IntervalThroughput:
    """``(thr(c) + E_q[thr after independent losses](c)) / 2`` for every candidate c."""

    def __init__(
        self, data_parallel: np.ndarray, stages: np.ndarray, throughput_grid: np.ndarray
    ) -> None:
        self.data_parallel = data_parallel
        self.stages = stages
        self.grid = throughput_grid
        self.throughput = np.array(
            [
                throughput_grid[d, p] if d > 0 else 0.0
                for d, p in zip(data_parallel, stages, strict=True)
            ]
        )
        self.max_spot = int(data_parallel.max(initial=0))
        size = self.max_spot + 1
        from scipy.special import gammaln  # on use: the CLI imports this package at start-up

        spot, lost = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        self._inside = lost <= spot
        self._log_ways = np.where(
            self._inside,
            gammaln(spot + 1.0) - gammaln(lost + 1.0) - gammaln(np.maximum(spot - lost, 0) + 1.0),
            -np.inf,
        )
        self._spot, self._lost = spot, lost
        self._terms: dict[int, _Terms] = {}
        self._cache: dict[tuple[float, int], np.ndarray] = {}

    @property
    def _zero(self) -> int:
        """Index of log F = -inf (F = 0) in the table of :meth:`_log_cdf`."""
        return (self.max_spot + 1) ** 2

    @property
    def _one(self) -> int:
        """Index of log F = 0 (F = 1)."""
        return self._zero + 1

    def _build_terms(self, num_on_demand: int) -> _Terms:
        width = self.max_spot + 1
        parts: list[tuple[np.ndarray, ...]] = []
        owners = np.flatnonzero(self.data_parallel > 0)
        for c in owners:
            d, p = int(self.data_parallel[c]), int(self.stages[c])
            per_stage = on_demand_per_stage(num_on_demand, d, p)
            low_on_demand = int(per_stage.min())
            high_stages = int(np.sum(per_stage > low_on_demand))
            t = np.arange(1, d + 1)

            def index(on_demand: int, stages: int, d: int = d, t: np.ndarray = t) -> np.ndarray:
                if stages == 0:
                    return np.full(d, self._one)  # no such stage: a factor 1
                spot = d - on_demand
                most_lost = spot - np.maximum(0, t - on_demand)
                return np.where(
                    most_lost >= 0, spot * width + np.clip(most_lost, 0, None), self._zero
                )

            gains = np.diff(self.grid[: d + 1, p])
            parts.append(
                (
                    gains,
                    index(low_on_demand + 1, high_stages),
                    np.full(d, high_stages),
                    index(low_on_demand, p - high_stages),
                    np.full(d, p - high_stages),
                )
            )
        if not parts:
            empty = np.zeros(0, dtype=int)
            return _Terms(empty, empty, np.zeros(0), empty, empty, empty, empty)
        lengths = self.data_parallel[owners]
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        columns = [np.concatenate(column) for column in zip(*parts, strict=True)]
        return _Terms(owners, starts, *columns)

    def _log_cdf(self, rate: float) -> np.ndarray:
        """``log F(l; s, rate)`` for s, l = 0..max D, flat, then log 0 and log 1 (``_zero``,
        ``_one``)."""
        spot, lost, inside = self._spot, self._lost, self._inside
        if rate <= 0.0:
            cdf = np.ones(spot.shape)
        elif rate >= 1.0:
            cdf = (lost >= spot).astype(float)
        else:
            log_pmf = self._log_ways + lost * np.log(rate) + (spot - lost) * np.log1p(-rate)
            pmf = np.where(inside, np.exp(log_pmf), 0.0)
            cdf = np.minimum(np.cumsum(pmf, axis=1), 1.0)
        with np.errstate(divide="ignore"):
            return np.concatenate((np.log(cdf.ravel()), [-np.inf, 0.0]))

    def per_candidate(self, rate: float, num_on_demand: int) -> np.ndarray:
        """Expected samples/s of every candidate over an interval of preemption probability
        ``rate`` (half at full speed, half with the survivors), once it fits; cached by rate
        (horizon steps often share it)."""
        key = (rate, num_on_demand)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        terms = self._terms.get(num_on_demand)
        if terms is None:
            terms = self._terms[num_on_demand] = self._build_terms(num_on_demand)
        log_cdf = self._log_cdf(rate)
        # prod_j F_j = exp(sum_j log F_j): one exp per term (a float power is several times
        # slower); a stage that surely breaks (F = 0) gives exp(-inf) = 0.
        log_survive = terms.low_stages * log_cdf[terms.low]
        if not terms.uniform:
            log_survive += terms.high_stages * log_cdf[terms.high]
        expected = np.zeros(len(self.stages))
        if len(terms.owners):
            expected[terms.owners] = np.add.reduceat(
                terms.gains * np.exp(log_survive), terms.starts
            )
        result = (self.throughput + expected) / 2
        if len(self._cache) > 512:
            self._cache.clear()
        self._cache[key] = result
        return result
