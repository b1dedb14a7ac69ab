"""``auto``: pick, by their rolling error on the history seen so far, which model forecasts.

Members: ``persistence`` and ``markov``. At every call each member forecasts; a member's forecast
made at interval s is scored at step h once ``count[s + h]`` is known (walk-forward: no
look-ahead). Over the last ``window`` scored steps:

- the point forecast comes from the member with the lowest mean absolute error, but another
  member replaces persistence only if it is better by ``margin`` (3%): most intervals see no change,
  and a model that drifts off the last value loses;
- the distribution comes from the member with the lowest mean CRPS, under the same rule.

Until ``min_scored`` steps are scored, persistence is used. The state assumes successive calls
extend the same history; a call that does not (an earlier or altered history) resets it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from liveput.forecast.base import PREDICTORS, Forecast, Predictor, check_request, crps
from liveput.forecast.markov import MarkovPredictor
from liveput.forecast.persistence import PersistencePredictor
from liveput.traces.trace import IntervalTrace


@PREDICTORS.register("auto")
class AutoPredictor(Predictor):
    """Rolling-error selection between persistence and the Markov model."""

    name = "auto"

    def __init__(self, window: int = 720, margin: float = 0.03, min_scored: int = 240) -> None:
        self.window = window
        self.margin = margin
        self.min_scored = min_scored
        self.members: dict[str, Predictor] = {"persistence": PersistencePredictor(),
                                              "markov": MarkovPredictor()}
        self._reset()

    def _reset(self) -> None:
        self._seen = np.zeros(0, dtype=np.int64)
        self._made: dict[int, dict[str, Forecast]] = {}
        self._errors = {name: deque(maxlen=self.window) for name in self.members}
        self._scores = {name: deque(maxlen=self.window) for name in self.members}

    def _extends_seen(self, counts: np.ndarray) -> bool:
        seen = self._seen
        return len(counts) > len(seen) and np.array_equal(counts[: len(seen)], seen)

    def _score(self, counts: np.ndarray) -> None:
        now = len(counts) - 1
        for made_at in list(self._made):
            forecasts = self._made[made_at]
            step = now - made_at
            for name, forecast in forecasts.items():
                if 1 <= step <= forecast.horizon:
                    truth = counts[now]
                    self._errors[name].append(abs(forecast.point[step - 1] - truth))
                    pmf = forecast.pmf[step - 1]
                    self._scores[name].append(float(crps(pmf[None, :], np.array([truth]))[0])
                                              if truth < len(pmf) else float(truth))
            if step >= max(f.horizon for f in forecasts.values()):
                del self._made[made_at]

    def _pick(self, losses: dict[str, deque]) -> str:
        baseline = losses["persistence"]
        if len(baseline) < self.min_scored:
            return "persistence"
        means = {name: float(np.mean(values)) for name, values in losses.items()}
        best = min(means, key=means.get)
        if best != "persistence" and means[best] < (1 - self.margin) * means["persistence"]:
            return best
        return "persistence"

    def forecast(self, history: IntervalTrace, horizon: int, capacity: int) -> Forecast:
        check_request(history, horizon)
        counts = history.count
        if not self._extends_seen(counts):
            self._reset()
            # Replay what the members would have forecast on the history they saw: walk-forward
            # over a bounded recent past, so a fresh instance has rolling errors at once.
            start = max(1, len(counts) - self.window // 4)
            for length in range(start, len(counts)):
                self._observe(history.head(length), horizon, capacity)
        forecasts = self._observe(history, horizon, capacity)
        point_from = self._pick(self._errors)
        pmf_from = self._pick(self._scores)
        point, pmf = forecasts[point_from], forecasts[pmf_from]
        return Forecast(point.point, pmf.pmf, pmf.expected_preempted, pmf.expected_allocated,
                        f"auto({point_from},{pmf_from})")

    def _observe(self, history: IntervalTrace, horizon: int,
                 capacity: int) -> dict[str, Forecast]:
        counts = history.count
        self._seen = counts.copy()
        self._score(counts)
        capacity = max(capacity, history.max_count)
        forecasts = {name: member.forecast(history, horizon, capacity)
                     for name, member in self.members.items()}
        self._made[len(counts) - 1] = forecasts
        return forecasts
