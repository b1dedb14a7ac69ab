"""``auto``: combine persistence and two Markov models by their rolling errors on the history seen.

Members: persistence (``p``), the Markov burst model with a recent regime (``m``) and the same
model with whole-window rates (``s``, ``markov-stationary``). At every call all forecast; a
forecast made at interval s is scored at step h once ``count[s + h]`` is known (walk-forward: no
look-ahead). Scores are kept per step h over the last ``window`` origins (intervals).

Distribution (CRPS-optimal mixture). The predictive CDF at step h is
``F = F_p + w_m (F_m - F_p) + w_s (F_s - F_p)``; its CRPS is quadratic in ``w``, and the weights
minimizing the CRPS summed over the window, with ``w >= 0`` and ``w_m + w_s <= 1``, are solved
exactly (``forecast.combine``, notation there). The fitted weights of n scored forecasts are
averaged with the prior weights ``(1/2, 0)`` as if those were worth ``prior_forecasts = 180``
forecasts: ``w = (n w_fit + 180 w_prior) / (n + 180)``. Why both: with a few zone-wide events the
fit is noise (on generated v100-like traces the hindsight-best weight of ``m`` ranges over 0..1
across seeds), and the averaging cut auto's CRPS ratio to persistence there from 1.001 to 0.999
(12 h) at a cost of at most 0.5 points on the real traces. Why two Markov models: the recent
window follows a market whose rates change (the real v100 trace), and is noise where rates are
steady and events rare; with ``s`` in the mixture (prior weight 0: it must earn it), 48-h
v100-like traces went from 1.003 to 0.998 and 12-h calm ones from 0.985 to 0.979. (Tried and no
better on balance: gating the weight by the evidence rule below, one weight per origin state, one
weight pooled over the steps, a one-standard-error lower bound of the CRPS gain, a preemption
hazard by instance age.)

Point (MAE). Most intervals see no change, and a forecast that drifts off the last value loses.
The candidate point is the median of the mixture of ``p`` and ``m`` alone, ``m`` weighted as it
would be without ``s`` (the MAE-optimal point under that distribution; it moves off the last value
only when the mixture as a whole says so, less often than the Markov median). ``s`` is left out
because its median trails a market that changed: with it, steps 9-12 on the p3 trace went from
1-1.5% better than persistence to 0.5-0.9% worse. Step h uses it only when its rolling paired
error beats persistence's with evidence (the evidence rule): with ``d = |e_mix| - |e_p|`` over
the window, ``mean(d) < -margin * mean(|e_p|)`` and ``mean(d) / (std(d) / sqrt(n / h)) < -z``;
overlapping h-step forecasts share errors, hence the effective count ``n / h``, and the test runs
only once ``n / h >= min_effective`` (30: the sample size at which the normal approximation of a
mean is usual; fewer let early noise switch steps on). Otherwise the point is persistence's. On
top of the evidence rule, a stop-loss (``forecast.stoploss``): step h issues persistence's point
whenever the points auto actually issued have, summed over all its history, more absolute error than
``1 + slack`` times persistence's (``slack = 0.005``). The evidence rule looks at a rolling window
and a market that changes can still fool it for a while; the stop-loss bounds what that costs.
The distribution has one too: step h's weight is 0 (persistence's distribution) whenever the
distributions auto issued have more summed CRPS than ``1 + crps_slack`` times persistence's
(``crps_slack = 0.05``). On the p3 trace at 300-s intervals the market shrinks for its last
three hours and the Markov model keeps expecting refills; there it cuts auto's CRPS ratio from
1.072 to 1.042 (a slack of 0.02 cost 0.5 to 1.5 points of CRPS on generated default, volatile
and calm traces, measured before ``s`` and the prior; 0.05 cost at most 0.35). Replayed
forecasts (below) never reached a caller, so the stop-losses count only those returned.

The state assumes successive calls extend the same history; a call that does not (an earlier or
altered history) resets it and replays the recent past walk-forward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor, check_request, crps, pmf_median
from liveput.forecast.combine import simplex_weights_stack
from liveput.forecast.markov import MarkovPredictor, StationaryMarkovPredictor
from liveput.forecast.persistence import PersistencePredictor
from liveput.forecast.stoploss import StopLoss
from liveput.traces.trace import IntervalTrace


@PREDICTORS.register("auto")
class AutoPredictor(Predictor):
    """CRPS-optimal mixture of persistence and two Markov models; evidence-gated mixture median
    as the point (module docstring)."""

    name = "auto"

    def __init__(
        self,
        window: int = 720,
        margin: float = 0.01,
        z: float = 1.0,
        min_scored: int = 60,
        prior_weights: tuple[float, ...] = (0.5, 0.0),
        prior_forecasts: float = 180.0,
        replay: int = 180,
        min_effective: int = 30,
        slack: float = 0.005,
        crps_slack: float = 0.05,
    ) -> None:
        self.window = window
        self.margin = margin
        self.z = z
        self.min_scored = min_scored
        self.min_effective = min_effective
        self.prior_weights = np.asarray(prior_weights, dtype=float)
        self.prior_forecasts = prior_forecasts
        self.replay = replay
        self.slack = slack
        self.crps_slack = crps_slack
        self.persistence = PersistencePredictor()
        self.members: tuple[Predictor, ...] = (MarkovPredictor(), StationaryMarkovPredictor())
        if (
            len(self.prior_weights) != len(self.members)
            or np.any(self.prior_weights < 0)
            or self.prior_weights.sum() > 1
        ):
            raise ValueError(
                f"auto: prior_weights must be {len(self.members)} non-negative "
                f"weights summing to at most 1, got {prior_weights}"
            )
        self._reset(0)

    def _reset(self, horizon: int) -> None:
        self._horizon = horizon
        self._seen = np.zeros(0, dtype=np.int64)
        # Origin -> what was made there, until scored at every step.
        self._made: dict[int, _Made] = {}
        # Per step h: paired absolute errors (persistence, mixture median) and the CRPS
        # coefficients of the members against persistence (``forecast.combine``).
        self._error_p = [_Window(self.window) for _ in range(horizon)]
        self._error_mix = [_Window(self.window) for _ in range(horizon)]
        self._coefficients = [_RollingSums(self.window, len(self.members)) for _ in range(horizon)]
        self._stop_loss = StopLoss(horizon, self.slack)
        self._crps_stop_loss = StopLoss(horizon, self.crps_slack)

    def _extends_seen(self, counts: np.ndarray, horizon: int) -> bool:
        seen = self._seen
        return (
            horizon == self._horizon
            and len(counts) > len(seen)
            and np.array_equal(counts[: len(seen)], seen)
        )

    def _score(self, counts: np.ndarray) -> None:
        now = len(counts) - 1
        truth = int(counts[now])
        for made_at in list(self._made):
            step = now - made_at
            made = self._made[made_at]
            if 1 <= step <= self._horizon:
                h = step - 1
                error_p = abs(made.persistence.point[h] - truth)
                self._error_p[h].append(error_p)
                self._error_mix[h].append(abs(made.candidate[h] - truth))
                cdf_p = np.cumsum(made.persistence.pmf[h])
                gaps = np.cumsum(made.members[:, h], axis=1) - cdf_p
                observed = (np.arange(len(cdf_p)) >= truth).astype(float)
                self._coefficients[h].add(gaps @ gaps.T, gaps @ (cdf_p - observed))
                if made.issued:
                    self._settle(h, truth, error_p, made)
            if step >= self._horizon:
                del self._made[made_at]

    def _settle(self, h: int, truth: int, error_p: float, made: _Made) -> None:
        """Charge step h of a forecast auto returned to the stop-loss records."""
        self._stop_loss.settle(h, error_p, abs(made.issued_point[h] - truth))
        # Scored as the backtest scores it: the truth clipped to the forecast's support.
        clipped = min(truth, made.issued_pmf.shape[1] - 1)
        score_p, score_issued = crps(
            np.stack([made.persistence.pmf[h], made.issued_pmf[h]]), np.array([clipped, clipped])
        )
        self._crps_stop_loss.settle(h, float(score_p), float(score_issued))

    def mixture_weights(self, members: list[int] | None = None) -> np.ndarray:
        """``w[h, j]``: the weight of member ``members[j]`` (default: all) in the distribution at
        step h (persistence has the rest): the CRPS-optimal weights on the scored window,
        averaged with ``prior_weights`` as if those were worth ``prior_forecasts`` scored
        forecasts."""
        index = list(range(len(self.members))) if members is None else members
        prior = self.prior_weights[index]
        weights = np.tile(prior, (self._horizon, 1))
        scored = [(h, sums) for h, sums in enumerate(self._coefficients) if sums.count]
        if not scored:
            return weights
        if members is None:  # every member: the whole sums (indexing them copied them again)
            grams = np.stack([sums.gram for _, sums in scored])
            linears = np.stack([sums.linear for _, sums in scored])
        else:
            grams = np.stack([sums.gram[np.ix_(index, index)] for _, sums in scored])
            linears = np.stack([sums.linear[index] for _, sums in scored])
        fitted = simplex_weights_stack(grams, linears)
        for (h, sums), fitted_h in zip(scored, fitted):
            weights[h] = (sums.count * fitted_h + self.prior_forecasts * prior) / (
                sums.count + self.prior_forecasts
            )
        return weights

    def mixture_point_steps(self) -> np.ndarray:
        """Steps whose point forecast is the mixture's median (evidence rule)."""
        chosen = np.zeros(self._horizon, dtype=bool)
        for h in range(self._horizon):
            n = len(self._error_p[h])
            if n < max(self.min_scored, self.min_effective * (h + 1)):
                continue
            base = self._error_p[h].values()
            diff = self._error_mix[h].values() - base
            if diff.mean() < -self.margin * base.mean() and _significant(diff, h, self.z):
                chosen[h] = True
        return chosen

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        check_request(history, horizon)
        counts = history.count
        capacity = max(capacity, history.max_count)
        if not self._extends_seen(counts, horizon):
            self._reset(horizon)
            # Replay what the members would have forecast on the recent past, walk-forward, so
            # a fresh instance has rolling errors at once.
            for length in range(max(1, len(counts) - self.replay), len(counts)):
                self._observe(history.head(length), horizon, capacity, issued=False)
        return self._observe(history, horizon, capacity, issued=True)

    def _observe(
        self, history: IntervalTrace, horizon: int, capacity: int, issued: bool
    ) -> Forecast:
        """Score what is due, then make (and remember) the forecast of now; ``issued``: whether
        it is returned to a caller (else it is replayed, and the stop-loss records skip it)."""
        counts = history.count
        self._seen = counts.copy()
        self._score(counts)
        persistence = self.persistence.forecast(history, horizon, capacity)
        members = [member.forecast(history, horizon, capacity) for member in self.members]
        width = max(forecast.pmf.shape[1] for forecast in [persistence, *members])
        pmf_p = _widen(persistence.pmf, width)
        pmf_members = np.stack([_widen(forecast.pmf, width) for forecast in members])
        open_steps = self._crps_stop_loss.open_steps()
        weights = self.mixture_weights() * open_steps[:, None]
        pmf = pmf_p + np.einsum("hj,jhc->hc", weights, pmf_members - pmf_p[None])
        # The point candidate weighs persistence and the recent-regime Markov model only: the
        # stationary model's median trails a market that changed (on the p3 trace, steps 9-12 of
        # the point went from 1-1.5% better than persistence to 0.5-0.9% worse with it).
        point_weight = self.mixture_weights([0])[:, 0] * open_steps
        candidate = pmf_median(pmf_p + point_weight[:, None] * (pmf_members[0] - pmf_p))
        use_mixture = self.mixture_point_steps() & self._stop_loss.open_steps()
        point = np.where(use_mixture, candidate, persistence.point)
        self._made[len(counts) - 1] = _Made(persistence, pmf_members, candidate, point, pmf, issued)
        rest = 1 - weights.sum(axis=1)
        return Forecast(
            point=point,
            pmf=pmf,
            expected_preempted=rest * persistence.expected_preempted
            + sum(
                weights[:, j] * forecast.expected_preempted for j, forecast in enumerate(members)
            ),
            expected_allocated=rest * persistence.expected_allocated
            + sum(
                weights[:, j] * forecast.expected_allocated for j, forecast in enumerate(members)
            ),
            method=f"auto(mixture point at {int(use_mixture.sum())}/{horizon} steps, "
            f"member weights {np.round(weights.mean(axis=0), 2).tolist()})",
        )


class _Window:
    """The last ``size`` numbers appended, oldest first, as a deque of that length holds them
    (an array kept in place: the evidence rule reads every step's window at every interval,
    and turning a deque into an array took a tenth of a forecast)."""

    def __init__(self, size: int) -> None:
        self._values = np.zeros(max(size, 0))
        self._appended = 0

    def __len__(self) -> int:
        return min(self._appended, len(self._values))

    def append(self, value: float) -> None:
        if len(self._values):
            self._values[self._appended % len(self._values)] = value
            self._appended += 1

    def values(self) -> np.ndarray:
        if self._appended <= len(self._values):
            return self._values[: self._appended]
        oldest = self._appended % len(self._values)
        return np.concatenate((self._values[oldest:], self._values[:oldest]))


class _RollingSums:
    """Sums of the CRPS coefficients ``A`` and ``b`` over the last ``window`` scored forecasts
    of one step (kept as running sums: the window is summed at every interval)."""

    def __init__(self, window: int, members: int) -> None:
        self._records: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._window = window
        self.gram = np.zeros((members, members))
        self.linear = np.zeros(members)

    @property
    def count(self) -> int:
        return len(self._records)

    def add(self, gram: np.ndarray, linear: np.ndarray) -> None:
        self._records.append((gram, linear))
        self.gram += gram
        self.linear += linear
        if len(self._records) > self._window:
            old_gram, old_linear = self._records.popleft()
            self.gram -= old_gram
            self.linear -= old_linear


@dataclass(frozen=True)
class _Made:
    """A forecast made at one origin, kept until every step is scored."""

    persistence: Forecast
    members: np.ndarray
    """The members' pmfs, shape (members, H, counts)."""
    candidate: np.ndarray
    """The median of persistence mixed with the recent-regime Markov model alone (the point
    candidate), whose errors the evidence rule tracks."""
    issued_point: np.ndarray
    """The point auto returned (the candidate where the evidence rule and the stop-loss allow)."""
    issued_pmf: np.ndarray
    """The distribution auto returned."""
    issued: bool
    """Whether it was returned to a caller (not replayed)."""


def _significant(differences: np.ndarray, step_index: int, z: float) -> bool:
    """Whether the mean of paired differences (candidate - persistence) is below zero by ``z``
    standard errors, counting ``n / h`` effective samples for overlapping h-step forecasts."""
    n = len(differences)
    if n < 2:
        return False
    spread = float(differences.std(ddof=1)) / np.sqrt(max(n / (step_index + 1), 1.0))
    return spread > 0 and float(differences.mean()) / spread < -z


def _widen(pmf: np.ndarray, width: int) -> np.ndarray:
    if pmf.shape[1] == width:
        return pmf
    out = np.zeros((pmf.shape[0], width))
    out[:, : pmf.shape[1]] = pmf
    return out
