"""``auto``: combine persistence and the Markov model by their rolling errors on the history seen.

Members: persistence (``p``) and the Markov burst model (``m``). At every call both forecast; a
forecast made at interval s is scored at step h once ``count[s + h]`` is known (walk-forward: no
look-ahead). Scores are kept per step h over the last ``window`` origins (intervals).

Distribution (CRPS-optimal mixture). The predictive CDF at step h is
``F = w_h F_m + (1 - w_h) F_p``. Its CRPS against an outcome y is quadratic in w:

    CRPS(w) = sum_k (w (F_m - F_p)(k) + (F_p - O_y)(k))^2 = w^2 A + 2 w B + C,

with ``A = sum (F_m - F_p)^2``, ``B = sum (F_m - F_p)(F_p - O_y)``, ``O_y(k) = 1[k >= y]`` (sums
over counts k, so A and B are in instances). Summing A and B over the window gives the exact
minimizer ``w_h = clip(-sum B / sum A, 0, 1)``; until ``min_scored`` steps are scored,
``w_h = prior_weight``. (Tried and no better on balance: gating the weight by the evidence rule
below, a cap or a pseudo-count prior on it, one weight per origin state (at capacity, empty, in
between), one weight pooled over the steps, and the weight maximizing a one-standard-error lower
bound of the CRPS gain: on traces with a few zone-wide events the fit is noisy whichever way it
is shrunk, and shrinking costs the gains on traces with structure.)

Point (MAE). Most intervals see no change, and a forecast that drifts off the last value loses.
The candidate point is the median of the mixture ``F`` itself (the MAE-optimal point under the
predictive distribution; it moves off the last value only when the mixture as a whole says so,
less often than the Markov median). Step h uses it only when its rolling paired error beats
persistence's with evidence (the evidence rule): with ``d = |e_mix| - |e_p|`` over the window,
``mean(d) < -margin * mean(|e_p|)`` and ``mean(d) / (std(d) / sqrt(n / h)) < -z``; overlapping
h-step forecasts share errors, hence the effective count ``n / h``, and the test runs only once
``n / h >= min_effective`` (30: the sample size at which the normal approximation of a mean is
usual; fewer let early noise switch steps on). Otherwise the point is persistence's. On top of
the evidence rule, a stop-loss (``forecast.stoploss``): step h issues persistence's point whenever
the points auto actually issued have, summed over all its history, more absolute error than
``1 + slack`` times persistence's (``slack = 0.005``). The evidence rule looks at a rolling window
and a market that changes can still fool it for a while; the stop-loss bounds what that costs.
The distribution has one too: step h's weight is 0 (persistence's distribution) whenever the
distributions auto issued have more summed CRPS than ``1 + crps_slack`` times persistence's
(``crps_slack = 0.05``). On the p3 trace at 300-s intervals the market shrinks for its last
three hours and the Markov model keeps expecting refills; there it cuts auto's CRPS ratio from
1.109 to 1.060 (1.045 with a slack of 0.02, which cost 0.5 to 1.5 points of CRPS on generated
default, volatile and calm traces; 0.05 costs at most 0.35). Replayed forecasts (below) never
reached a caller, so the stop-losses count only those returned.

The state assumes successive calls extend the same history; a call that does not (an earlier or
altered history) resets it and replays the recent past walk-forward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor, check_request, crps, pmf_median
from liveput.forecast.markov import MarkovPredictor
from liveput.forecast.persistence import PersistencePredictor
from liveput.forecast.stoploss import StopLoss
from liveput.traces.trace import IntervalTrace


@PREDICTORS.register("auto")
class AutoPredictor(Predictor):
    """CRPS-optimal mixture of persistence and Markov; evidence-gated mixture median as the point
    (module docstring)."""

    name = "auto"

    def __init__(self, window: int = 720, margin: float = 0.01, z: float = 1.0,
                 min_scored: int = 60, prior_weight: float = 0.5, replay: int = 180,
                 min_effective: int = 30, slack: float = 0.005,
                 crps_slack: float = 0.05) -> None:
        self.window = window
        self.margin = margin
        self.z = z
        self.min_scored = min_scored
        self.min_effective = min_effective
        self.prior_weight = prior_weight
        self.replay = replay
        self.slack = slack
        self.crps_slack = crps_slack
        self.persistence = PersistencePredictor()
        self.markov = MarkovPredictor()
        self._reset(0)

    def _reset(self, horizon: int) -> None:
        self._horizon = horizon
        self._seen = np.zeros(0, dtype=np.int64)
        # Origin -> what was made there, until scored at every step.
        self._made: dict[int, _Made] = {}
        # Per step h: paired absolute errors (persistence, mixture median) and the mixture's CRPS
        # coefficients.
        self._error_p = [deque(maxlen=self.window) for _ in range(horizon)]
        self._error_mix = [deque(maxlen=self.window) for _ in range(horizon)]
        self._coef_a = [deque(maxlen=self.window) for _ in range(horizon)]
        self._coef_b = [deque(maxlen=self.window) for _ in range(horizon)]
        self._stop_loss = StopLoss(horizon, self.slack)
        self._crps_stop_loss = StopLoss(horizon, self.crps_slack)

    def _extends_seen(self, counts: np.ndarray, horizon: int) -> bool:
        seen = self._seen
        return (horizon == self._horizon and len(counts) > len(seen)
                and np.array_equal(counts[: len(seen)], seen))

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
                cdf_m = np.cumsum(made.markov.pmf[h])
                observed = (np.arange(len(cdf_p)) >= truth).astype(float)
                gap = cdf_m - cdf_p
                self._coef_a[h].append(float(gap @ gap))
                self._coef_b[h].append(float(gap @ (cdf_p - observed)))
                if made.issued:
                    self._settle(h, truth, error_p, made)
            if step >= self._horizon:
                del self._made[made_at]

    def _settle(self, h: int, truth: int, error_p: float, made: _Made) -> None:
        """Charge step h of a forecast auto returned to the stop-loss records."""
        self._stop_loss.settle(h, error_p, abs(made.issued_point[h] - truth))
        # Scored as the backtest scores it: the truth clipped to the forecast's support.
        clipped = min(truth, made.issued_pmf.shape[1] - 1)
        score_p, score_issued = crps(np.stack([made.persistence.pmf[h], made.issued_pmf[h]]),
                                     np.array([clipped, clipped]))
        self._crps_stop_loss.settle(h, float(score_p), float(score_issued))

    def mixture_weights(self) -> np.ndarray:
        """``w_h``: the Markov model's weight in the distribution at each step."""
        weights = np.full(self._horizon, self.prior_weight)
        for h in range(self._horizon):
            n = len(self._coef_a[h])
            if n < self.min_scored:
                continue
            total_a = float(np.sum(self._coef_a[h]))
            weight = (float(np.clip(-np.sum(self._coef_b[h]) / total_a, 0.0, 1.0))
                      if total_a > 1e-12 else 0.0)
            weights[h] = weight
        return weights

    def mixture_point_steps(self) -> np.ndarray:
        """Steps whose point forecast is the mixture's median (evidence rule)."""
        chosen = np.zeros(self._horizon, dtype=bool)
        for h in range(self._horizon):
            n = len(self._error_p[h])
            if n < max(self.min_scored, self.min_effective * (h + 1)):
                continue
            base = np.asarray(self._error_p[h])
            diff = np.asarray(self._error_mix[h]) - base
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

    def _observe(self, history: IntervalTrace, horizon: int, capacity: int,
                 issued: bool) -> Forecast:
        """Score what is due, then make (and remember) the forecast of now; ``issued``: whether
        it is returned to a caller (else it is replayed, and the stop-loss records skip it)."""
        counts = history.count
        self._seen = counts.copy()
        self._score(counts)
        persistence = self.persistence.forecast(history, horizon, capacity)
        markov = self.markov.forecast(history, horizon, capacity)
        width = max(persistence.pmf.shape[1], markov.pmf.shape[1])
        pmf_p, pmf_m = _widen(persistence.pmf, width), _widen(markov.pmf, width)
        weights = np.where(self._crps_stop_loss.open_steps(), self.mixture_weights(), 0.0)
        pmf = weights[:, None] * pmf_m + (1 - weights[:, None]) * pmf_p
        candidate = pmf_median(pmf)
        use_mixture = self.mixture_point_steps() & self._stop_loss.open_steps()
        point = np.where(use_mixture, candidate, persistence.point)
        self._made[len(counts) - 1] = _Made(persistence, markov, candidate, point, pmf, issued)
        return Forecast(
            point=point,
            pmf=pmf,
            expected_preempted=weights * markov.expected_preempted
            + (1 - weights) * persistence.expected_preempted,
            expected_allocated=weights * markov.expected_allocated
            + (1 - weights) * persistence.expected_allocated,
            method=f"auto(mixture point at {int(use_mixture.sum())}/{horizon} steps, "
                   f"weight {float(weights.mean()):.2f})",
        )


@dataclass(frozen=True)
class _Made:
    """A forecast made at one origin, kept until every step is scored."""

    persistence: Forecast
    markov: Forecast
    candidate: np.ndarray
    """The median of the distribution returned, whose errors the evidence rule tracks."""
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
