"""Deadline policies: finish a job's work by its deadline at the least cost.

A deadline policy is pure, like every policy: it reads an :class:`Observation` (samples done and
remaining, seconds to the deadline, spot instances available, on-demand ones held and launching)
and returns a :class:`Decision` whose :class:`Provisioning` says how many spot instances to hold
and how many on-demand instances to hold from the next interval on, beside the (D, P) to run on
the mix. Policies differ only in :meth:`DeadlinePolicy.provision` (and ``liveput`` in how it picks
(D, P)); what every one shares lives here:

- *Configuration*: the best (D, P) on the spot instances kept plus the on-demand ones already
  running (those still launching cannot be used yet); the running one is kept unless another is
  faster. Idle spot spares are released (they cost money and train nothing; released, they are
  gone for the next interval).
- *Recovery* after a loss inside an interval: the liveput optimizer's
  :meth:`~liveput.plan.optimizer.LiveputOptimizer.recover` (regroup, failover or restart), the
  same for every policy, so the comparison is about provisioning.
- *Caps*: on-demand instances are at most ``on_demand_max`` and what the budget allows (per hour,
  or the total budget left spread over the hours to the deadline).
- *Lead time*: an on-demand instance asked for now is usable at the first interval start after
  its launch delay: ``lead_s = T * ceil(launch_delay_max / T)`` later at worst.

Policies are registered by name in :data:`DEADLINE_POLICIES` (the names the simulator reports).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.configuration import Configuration, MigrationKind, ObservationEvent
from liveput.plan import LiveputOptimizer, OptimizerConfig
from liveput.plan.costs import migration_kind
from liveput.policies.base import Decision, Observation, PolicyContext, Provisioning
from liveput.policies.common import ConfigurationLookup, restart_s
from liveput.policies.objective import JobObjective
from liveput.policies.recovery import plan_recovery
from liveput.registry import Registry


@dataclass(frozen=True)
class DeadlineContext:
    """What a deadline policy knows before the job starts."""

    policy: PolicyContext
    """Model, configurations, costs, prices, interval and horizon (as for every policy)."""
    objective: JobObjective
    """Deadline, work and budget."""
    target_samples: float
    """The work in samples (the objective's steps times the global batch)."""
    on_demand_max: int
    """Most on-demand instances held at once (the objective's, or the trace's peak count)."""
    launch_delay_max_s: float = 90.0
    """Longest launch of an on-demand instance, seconds (CM-DARE measured 70 to 92 s)."""

    def __post_init__(self) -> None:
        if not self.target_samples > 0:
            raise LiveputError(f"target samples must be positive, got {self.target_samples}")
        if self.on_demand_max < 0 or self.launch_delay_max_s < 0:
            raise LiveputError("on-demand maximum and launch delay must be >= 0")

    @property
    def lead_s(self) -> float:
        """Seconds from asking for an on-demand instance to the interval it is usable in."""
        interval_s = self.policy.interval_s
        return interval_s * math.ceil(self.launch_delay_max_s / interval_s - 1e-9)


class DeadlinePolicy(ABC):
    """Decides provisioning and configuration each interval; recovers after a loss."""

    name: str = ""

    def __init__(self, context: DeadlineContext) -> None:
        self.context = context
        base = context.policy
        self.lookup = ConfigurationLookup(base)
        self.optimizer = LiveputOptimizer(
            base.profile,
            base.table,
            base.costs,
            OptimizerConfig(horizon=base.horizon, interval_s=base.interval_s),
        )
        sizes = range(self.lookup.max_instances + 1)
        best = [self.lookup.best_for(size) for size in sizes]
        self.rate_by_size = np.array([self.lookup.throughput(c) for c in best])
        """Samples/s of the best configuration on m instances, m = 0..max."""
        self.used_by_size = np.array([0 if c is None else c.num_instances for c in best])
        """Instances that configuration uses (the others are idle spares)."""

    # --- what each policy decides -----------------------------------------------------------
    @abstractmethod
    def provision(self, observation: Observation) -> Provisioning:
        """Spot instances to hold and on-demand instances to hold next (before the caps)."""

    def configure(
        self,
        observation: Observation,
        num_spot: int,
        num_on_demand: int,
    ) -> tuple[Configuration | None, MigrationKind, float, float]:
        """(D, P) on ``num_spot`` spot and ``num_on_demand`` running on-demand instances:
        the configuration, its migration kind and seconds, and its expected samples."""
        room = num_spot + num_on_demand
        current = observation.current
        best = self.lookup.best_for(room)
        if (
            current is not None
            and current.num_instances <= room
            and self.lookup.throughput(current) >= self.lookup.throughput(best)
        ):
            best = current
        return self._move(current, best, room, observation.remaining_s)

    # --- shared ------------------------------------------------------------------------------
    def decide(self, observation: Observation) -> Decision:
        if observation.event == ObservationEvent.PREEMPTION:
            return self._recover(observation)
        wanted = self.provision(observation)
        spot = min(wanted.spot, observation.num_available)
        on_demand = min(wanted.on_demand, self.on_demand_cap(observation, spot))
        usable_on_demand = min(observation.num_on_demand, on_demand)
        chosen, migration, seconds, expected = self.configure(observation, spot, usable_on_demand)
        if chosen is not None:
            spot = min(spot, max(chosen.num_instances - usable_on_demand, 0))
        hold = wanted.spot_hold
        return Decision(
            chosen,
            migration=migration,
            downtime_s=seconds,
            expected_samples=expected,
            release=observation.num_available - spot,
            provisioning=Provisioning(
                spot, on_demand, spot_hold=None if hold is None else max(hold, spot)
            ),
        )

    def on_demand_cap(self, observation: Observation, num_spot: int | None = None) -> int:
        """Most on-demand instances now: ``on_demand_max`` and what the budget leaves beside
        ``num_spot`` spot instances (default: all those available)."""
        objective = self.context.objective
        base = self.context.policy
        cap = self.context.on_demand_max
        if objective.budget_usd_per_hour is not None:
            rate = objective.budget_usd_per_hour
        elif objective.budget_usd is not None:
            hours = max(observation.seconds_to_deadline, base.interval_s) / 3600.0
            rate = max(objective.budget_usd - observation.usd_spent, 0.0) / hours
        else:
            return cap
        num_spot = observation.num_available if num_spot is None else num_spot
        spot_usd = num_spot * base.spot_price_usd_per_hour
        room = max(rate - spot_usd, 0.0) / max(base.on_demand_price_usd_per_hour, 1e-12)
        return min(cap, int(room))

    def throughput(self, num_instances: int) -> float:
        """Samples/s of the best configuration on ``num_instances`` instances."""
        return self.lookup.throughput(self.lookup.best_for(num_instances))

    def launch_s(self, num_instances: int) -> float:
        """Seconds of a full launch (restart and checkpoint load) on ``num_instances``."""
        best = self.lookup.best_for(num_instances)
        return 0.0 if best is None else restart_s(self.context.policy, best)

    def fewest_on_demand(
        self, samples: float, seconds: float, num_spot: int = 0, cap: int | None = None
    ) -> int | None:
        """The fewest on-demand instances (with ``num_spot`` spot ones) that train ``samples``
        in ``seconds``, a launch included; None when even ``cap`` do not."""
        cap = self.context.on_demand_max if cap is None else cap
        for count in range(cap + 1):
            room = num_spot + count
            if self.throughput(room) * max(seconds - self.launch_s(room), 0.0) >= samples:
                return count
        return None

    def on_demand_finish_s(self, samples: float, cap: int | None = None) -> float:
        """Seconds to train ``samples`` on the largest allowed on-demand cluster, asked for
        now: the lead time, a launch, then training (inf when it trains nothing)."""
        cap = self.context.on_demand_max if cap is None else cap
        rate = self.throughput(cap)
        if rate <= 0:
            return math.inf
        return self.context.lead_s + self.launch_s(cap) + samples / rate

    def _move(
        self,
        current: Configuration | None,
        target: Configuration | None,
        room: int,
        remaining_s: float,
    ) -> tuple[Configuration | None, MigrationKind, float, float]:
        # The spares are released: the move involves the instances the target uses.
        seconds = (
            self.optimizer.migration_s(current, target, target.num_instances) if target else 0.0
        )
        kind = migration_kind(
            0 if current is None else current.data_parallel,
            0 if current is None else current.pipeline_stages,
            0 if target is None else target.data_parallel,
            0 if target is None else target.pipeline_stages,
        )
        expected = self.lookup.throughput(target) * max(remaining_s - seconds, 0.0)
        return target, kind, seconds, expected

    def _recover(self, observation: Observation) -> Decision:
        """Regroup the survivors, fail over or restart (the liveput optimizer's recovery)."""
        recovery = plan_recovery(self.context.policy, observation)
        plan = self.optimizer.recover(
            recovery.start,
            observation.num_available,
            observation.remaining_s,
            observation.num_on_demand,
            salvage_stages=recovery.salvage_stages,
        )
        runs = plan.configuration is not None
        return Decision(
            plan.configuration,
            migration=plan.migration,
            downtime_s=plan.migration_s,
            expected_samples=plan.expected_samples,
            checkpoint_s=recovery.checkpoint_s if runs else 0.0,
            rollback_s=recovery.rollback_s if runs else 0.0,
        )


DEADLINE_POLICIES: Registry[type[DeadlinePolicy]] = Registry("deadline policy")


def make_deadline_policy(name: str, context: DeadlineContext) -> DeadlinePolicy:
    """A new deadline policy by name (an unknown name is a one-line error)."""
    return DEADLINE_POLICIES.get(name)(context)
