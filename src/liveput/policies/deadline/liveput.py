"""``liveput`` (deadline): the least expected cost meeting the deadline, re-planned each interval.

Notation (at the start of interval t). W: samples still to train; K = floor(L / T) whole
intervals to the deadline (L seconds); n_j: spot instances available in interval t + j (n_0
known, n_1..n_H the predictor's distribution ``pmf``, later ones the history's distribution of
counts, with a prior worth an hour of history that the capacity asked for is granted, and a
hedge: an outage (no spot) with probability ``OUTAGE`` that the history may not have shown yet:
the long run); ``rate(m)``: samples/s of the best (D, P) on m instances, ``used(m)`` the
instances it uses; ``lag = lead_s / T``: an on-demand instance asked for now is usable from
interval t + lag (launch delay), the ones running or launching already from t + 1; ``e``: the
job's efficiency so far (samples trained over the samples of the configurations it ran: what
migrations, restarts and losses cost), 0.9 before there is evidence.

Choices a: a spot cap m (hold at most m spot instances, no on-demand; m <= capacity), or a
top-up to M (spot first, on-demand for the rest: ``o_j = min(M - min(n_j, M), cap)``, so
on-demand runs where spot is short, as the omniscient schedule does). In interval j it trains
``S_j(a) = T * E_n[rate(min(n_j, M) + o_j)]`` and costs ``U_j(a) = T * E_n[min(used, min(n_j,
M)) * spot price + o_j * on-demand price]`` with ``o_j`` the on-demand instances usable then
(before ``lag``: at most those held, or launching, already; a release is at once, an addition
waits for the launch).

Objective: minimize ``sum_j U_j(a)`` (expected dollars to the deadline).
Constraints: (1) expected work ``e * sum_j S_j(a) >= (1 + margin) * W`` (with a constant choice
for the rest of the job: re-solved every interval, so the choices actually made adapt to the
spot that shows up); (2) o <= the on-demand cap (``on_demand_max``, the budget); (3) hard
deadline: the work is still done if spot falls to its ``q``-quantile from the next interval on
(n_j at the forecast's, then the long run's, low quantile) while the job holds o on-demand at
interval ``lag`` and the cap from the interval after (the earliest it could react): when the
choice of (1) fails this, o rises to the fewest that pass (the cap when none does): on-demand
capacity is added in time, launch delay included. When no choice meets (1), the largest one.

(D, P) on the mix: the liveput MPC optimizer (:mod:`liveput.plan.optimizer`) over the next H
intervals, with the forecast capped at m, on the spot kept plus the on-demand instances running.
Source: the objective (deadline as a hard constraint, least expected cost), Can't Be
Late's observation (NSDI 2024) that on-demand is worth adding only where the slack cannot absorb
a bad spot outcome, and the cost per sample that falls with fewer instances (``rate(m) / m``
decreases): with slack, a smaller spot cluster trains cheaper.
"""

from __future__ import annotations

import math

import numpy as np

from liveput.forecast.base import Forecast
from liveput.forecast.shared import SharedPredictor
from liveput.perf.configuration import Configuration, MigrationKind
from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlineContext, DeadlinePolicy

MARGIN = 0.03
"""Extra expected work asked for (constraint 1): the forecast's own error."""
LOW_QUANTILE = 0.1
"""q of the bad spot outcome the hard deadline must survive (constraint 3)."""
OUTAGE = 0.1
"""Probability the plan gives a spot outage in any interval past the forecast (a hedge)."""
PRIOR_INTERVALS = 60
"""Weight, in intervals of history, of the long-run distribution's prior (the capacity)."""
PRIOR_EFFICIENCY = 0.9
"""Efficiency assumed before the job has run ten intervals."""


@DEADLINE_POLICIES.register("liveput")
class LiveputDeadlinePolicy(DeadlinePolicy):
    """Least expected cost meeting the deadline: spot cap, on-demand and (D, P), each interval."""

    name = "liveput"

    def __init__(self, context: DeadlineContext) -> None:
        super().__init__(context)
        self.predictor = SharedPredictor(context.policy.predictor)  # see forecast.shared
        self.nominal_samples = 0.0
        self.last_rate = 0.0
        self.spot_cap = 0
        self.forecast: Forecast | None = None

    def efficiency(self, observation: Observation) -> float:
        """Samples trained over the samples the configurations run would give, so far."""
        interval_s = self.context.policy.interval_s
        self.nominal_samples += self.last_rate * interval_s
        if self.nominal_samples < 10 * interval_s * max(self.last_rate, 1e-9):
            return PRIOR_EFFICIENCY
        return float(np.clip(observation.samples_done / self.nominal_samples, 0.5, 1.0))

    def provision(self, observation: Observation) -> Provisioning:
        base = self.context.policy
        interval_s = base.interval_s
        efficiency = self.efficiency(observation)
        # An executor's history may hold more than the capacity the context was made for (a
        # runtime counts the instances that joined): the forecast's support must cover it.
        capacity = max(
            base.capacity, observation.num_available, int(observation.history.count.max(initial=0))
        )
        forecast = self.predictor.forecast(observation.history, base.horizon, capacity)
        self.forecast = forecast
        remaining = observation.samples_remaining
        lag = max(int(round(self.context.lead_s / interval_s)), 1)
        # Plan to be done a reaction early: the lead time of on-demand and one more interval.
        reserve_s = self.context.lead_s + interval_s
        intervals = max(
            int(math.floor((observation.seconds_to_deadline - reserve_s) / interval_s + 1e-9)), 1
        )
        cap = self.on_demand_cap(observation)
        # Rows: distributions of n_j and how many intervals each stands for.
        counts = np.clip(observation.history.count, 0, capacity)
        long_run = np.bincount(counts, minlength=capacity + 1)[: capacity + 1].astype(float)
        # A prior worth PRIOR_INTERVALS of history: the capacity asked for is granted. A job
        # that starts in a drought does not conclude spot never comes; the history soon rules.
        long_run[capacity] += PRIOR_INTERVALS
        long_run /= long_run.sum()
        # Hedge: an outage of spot may come that the history has not shown (the longer the job
        # runs, the likelier); the plan counts on it with probability OUTAGE.
        long_run = (1.0 - OUTAGE) * long_run
        long_run[0] += OUTAGE
        now = np.zeros(capacity + 1)
        now[min(observation.num_available, capacity)] = 1.0
        ahead = min(base.horizon, intervals - 1)
        rows = np.vstack([now[None, :], forecast.pmf[:ahead], long_run[None, :]])
        weights = np.concatenate([[1.0], np.ones(ahead), [max(intervals - 1 - ahead, 0)]])
        index = np.arange(len(rows))
        # On-demand usable in each row: held now, held and launching from j = 1, chosen from lag.
        launched = observation.num_on_demand + observation.on_demand_pending
        chosen_from = index >= lag
        # Choices: spot cap m = 0..capacity (no on-demand), then top-up to M = 1..capacity + cap
        # (spot first, on-demand for the rest, at most cap).
        caps = np.concatenate([np.arange(capacity + 1), np.arange(1, capacity + cap + 1)])
        topup = np.concatenate(
            [np.zeros(capacity + 1, dtype=bool), np.ones(capacity + cap, dtype=bool)]
        )
        spot = np.minimum(np.arange(capacity + 1)[None, :], caps[:, None])  # (A, n)
        wants = np.where(topup[:, None], np.minimum(caps[:, None] - spot, cap), 0)  # (A, n)
        # Releasing is at once, adding takes the lead time.
        before = np.where(index == 0, observation.num_on_demand, launched)
        limit = np.where(chosen_from, np.iinfo(np.int64).max // 4, before)  # (rows,)
        on_demand = np.minimum(wants[:, None, :], limit[None, :, None])  # (A, rows, n)
        size = np.minimum(spot[:, None, :] + on_demand, len(self.rate_by_size) - 1)
        rate = self.rate_by_size[size]  # (A, rows, n)
        spot_used = np.minimum(self.used_by_size[size], spot[:, None, :])
        dollars = (
            spot_used * base.spot_price_usd_per_hour + on_demand * base.on_demand_price_usd_per_hour
        )
        samples = efficiency * interval_s * np.einsum("arn,rn,r->a", rate, rows, weights)
        cost = interval_s / 3600.0 * np.einsum("arn,rn,r->a", dollars, rows, weights)
        feasible = samples >= (1.0 + MARGIN) * remaining
        choice = (
            int(np.argmin(np.where(feasible, cost, np.inf)))
            if feasible.any()
            else int(np.argmax(samples))
        )
        spot_cap = int(caps[choice])
        now_spot = min(observation.num_available, capacity)
        wanted = int(wants[choice, now_spot])
        wanted = self._hard_deadline(
            observation, rows, lag, wanted, cap, efficiency, intervals, capacity
        )
        if wanted > int(wants[choice, now_spot]):
            spot_cap = capacity
        self.spot_cap = spot_cap
        return Provisioning(
            spot=min(spot_cap, observation.num_available),
            on_demand=wanted,
            spot_hold=None if spot_cap >= capacity else spot_cap,
        )

    def _hard_deadline(
        self,
        observation: Observation,
        rows: np.ndarray,
        lag: int,
        wanted: int,
        cap: int,
        efficiency: float,
        intervals: int,
        capacity: int,
    ) -> int:
        """The fewest on-demand instances >= ``wanted`` that still finish if spot falls to its
        low quantile (constraint 3)."""
        interval_s = self.context.policy.interval_s
        low = np.argmax(np.cumsum(rows, axis=1) >= LOW_QUANTILE - 1e-12, axis=1)
        low[0] = observation.num_available
        ahead = len(rows) - 2
        # n_j of every interval to the deadline: row j for j <= ahead, the long run after.
        per_interval = np.concatenate(
            [low[: ahead + 1], np.full(max(intervals - 1 - ahead, 0), low[-1])]
        )
        launched = observation.num_on_demand + observation.on_demand_pending
        on_demand = np.full(len(per_interval), cap)
        on_demand[0] = observation.num_on_demand
        on_demand[1:lag] = launched
        top = len(self.rate_by_size) - 1
        for count in range(wanted, cap + 1):
            on_demand[lag : lag + 1] = count
            sizes = np.minimum(per_interval + on_demand, top)
            trained = efficiency * interval_s * self.rate_by_size[sizes].sum()
            if trained >= observation.samples_remaining:
                return count
        return cap

    def configure(
        self,
        observation: Observation,
        num_spot: int,
        num_on_demand: int,
    ) -> tuple[Configuration | None, MigrationKind, float, float]:
        forecast = self._capped(self.forecast, self.spot_cap) if self.forecast else None
        if forecast is None:
            return super().configure(observation, num_spot, num_on_demand)
        plan = self.optimizer.decide(observation.current, num_spot, forecast, num_on_demand)
        room = num_spot + num_on_demand
        chosen = plan.configuration
        if chosen is not None and chosen.num_instances > room:
            chosen = next(
                (
                    a.configuration
                    for a in plan.alternatives
                    if a.configuration is None or a.configuration.num_instances <= room
                ),
                None,
            )
        result = self._move(observation.current, chosen, room, observation.remaining_s)
        self.last_rate = self.lookup.throughput(chosen)
        return result

    @staticmethod
    def _capped(forecast: Forecast, spot_cap: int) -> Forecast:
        """The forecast of the spot instances the job keeps: counts above the cap are the cap."""
        pmf = forecast.pmf.copy()
        if spot_cap < pmf.shape[1] - 1:
            pmf[:, spot_cap] += pmf[:, spot_cap + 1 :].sum(axis=1)
            pmf[:, spot_cap + 1 :] = 0.0
        return Forecast(
            np.minimum(forecast.point, spot_cap),
            pmf,
            forecast.expected_preempted,
            forecast.expected_allocated,
            forecast.method,
        )
