"""``omniscient``: the least-cost schedule of a policy that knows the whole trace (the bound).

Model: at its first decision it reads the true future (``Observation.future``, only an executor
that knows it fills it) and solves the deadline program of :mod:`liveput.plan.deadline` over the
intervals before the deadline less the on-demand lead time (its reserve to react). Its choice for
each block of ``BLOCK_INTERVALS`` intervals is a cluster size m (0 to the spot count plus
``on_demand_max``), filled with spot instances first (they are cheaper), on-demand ones for the
rest: ``s = min(m_used, n_k)`` spot and ``o = m_used - s`` on-demand in interval k, where
``m_used`` is what the best (D, P) on m instances uses and ``n_k = count[k] - preempted[k]`` (the
count that lasts the whole interval). It trains ``thr(m) * T`` samples and costs ``T * (s * spot
price + o * on-demand price)``. Migrations and launch delays are not in the program (they only
raise the cost of a real run), so its value is a lower bound of any policy's cost with the same
choices. Executed, it reads the program's choice table with the work actually left (closed loop:
a migration that cost samples is made up for), asks for on-demand instances the launch lead time
ahead (the most any of the next intervals of the lead time wants), and when no schedule can
finish any more, takes the largest cluster allowed."""

from __future__ import annotations

import math

import numpy as np

from liveput.plan.deadline import DeadlineSchedule, solve_deadline
from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlineContext, DeadlinePolicy

MAX_WORK_UNITS = 20_000
"""Most work units of the program (memory: intervals x units of the choice table)."""
BLOCK_INTERVALS = 5
"""Intervals one choice of the program lasts: a choice every interval would change the cluster
(and pay a migration the program does not see) every minute."""
UNITS_PER_INTERVAL = 16
"""Work units per interval at least: rounding down loses under one unit an interval, so the
program's schedules waste at most 1/16 of an interval's work each."""


@DEADLINE_POLICIES.register("omniscient")
class OmniscientPolicy(DeadlinePolicy):
    """Knows the whole trace: the least-cost schedule that meets the deadline."""

    name = "omniscient"

    def __init__(self, context: DeadlineContext) -> None:
        super().__init__(context)
        self.schedule: DeadlineSchedule | None = None
        self.counts = np.zeros(0, dtype=np.int64)
        self.unit = 1.0
        self.bound_usd = math.inf
        self.block = -1
        self.now: int | None = None

    def _plan(self, observation: Observation) -> None:
        base = self.context.policy
        interval_s = base.interval_s
        history, future = observation.history, observation.future
        counts, lost = history.count, history.preempted
        if future is not None and len(future):
            counts = np.concatenate([counts, future.count])
            lost = np.concatenate([lost, future.preempted])
        # The count that lasts each whole interval: its start minus what it loses.
        counts = counts - lost
        # Done a reaction early (the on-demand lead time), as the liveput policy plans: the
        # executed run pays migrations the program does not see, and makes them up then.
        num_intervals = int(
            math.floor(
                (self.context.objective.deadline_s - self.context.lead_s) / interval_s + 1e-9
            )
        )
        if len(counts) < num_intervals:
            counts = np.concatenate([counts, np.full(num_intervals - len(counts), counts[-1])])
        self.counts = np.maximum(counts, 0)
        start = observation.interval_index
        cap = self.context.on_demand_max
        max_size = len(self.rate_by_size) - 1
        sizes = np.arange(max_size + 1)
        window = self.counts[start:num_intervals]
        units = int(min(MAX_WORK_UNITS, max(UNITS_PER_INTERVAL * max(len(window), 1), 2000)))
        self.unit = observation.samples_remaining / units
        used = self.used_by_size[sizes]
        spot = np.minimum(used[None, :], window[:, None])
        on_demand = used[None, :] - spot
        allowed = sizes[None, :] <= window[:, None] + cap
        samples = np.where(allowed, self.rate_by_size[None, :] * interval_s, 0.0)
        costs = np.where(
            allowed,
            interval_s
            / 3600.0
            * (spot * base.spot_price_usd_per_hour + on_demand * base.on_demand_price_usd_per_hour),
            1e18,
        )  # a size beyond what can be rented: never chosen
        # One choice per block of intervals (the last block may be shorter).
        blocks = np.arange(0, len(window), BLOCK_INTERVALS)
        samples = np.add.reduceat(samples, blocks, axis=0)
        costs = np.add.reduceat(costs, blocks, axis=0)
        gains = np.floor(samples / self.unit + 1e-9).astype(np.int64)
        self.offset = start
        self.schedule = solve_deadline(gains, np.minimum(costs, 1e18), units)
        self.bound_usd = self.schedule.cost

    def provision(self, observation: Observation) -> Provisioning:
        if self.schedule is None:
            self._plan(observation)
        assert self.schedule is not None
        left = int(math.ceil(observation.samples_remaining / self.unit - 1e-9))
        cap = self.context.on_demand_max
        lead = int(round(self.context.lead_s / self.context.policy.interval_s))
        t = observation.interval_index
        block = (t - self.offset) // BLOCK_INTERVALS
        if block != self.block or self.now is None:
            # The table is read at block starts only: one choice (one migration) a block.
            self.block, self.now = block, self.schedule.choice(block, left)
        now = self.now
        if now is None:
            return Provisioning(spot=observation.num_available, on_demand=cap)
        wanted = 0
        for ahead in range(lead + 1):
            later = (t + ahead - self.offset) // BLOCK_INTERVALS
            choice = now if later == block else self.schedule.choice(later, left)
            if choice is None:
                break
            count = int(self.counts[min(t + ahead, len(self.counts) - 1)])
            wanted = max(
                wanted, int(self.used_by_size[choice]) - min(int(self.used_by_size[choice]), count)
            )
        spot = min(int(self.used_by_size[now]), observation.num_available)
        return Provisioning(
            spot=spot, on_demand=min(wanted, cap), spot_hold=int(self.used_by_size[now])
        )
