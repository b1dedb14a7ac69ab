"""``on-demand``: the same instance budget rented on-demand instead of spot.

Model: the job's budget is ``context.on_demand_budget`` instances (the simulator sets it to the
spot job's mean available count plus any on-demand instances held, so both hold about the same
instance-hours). It runs the best configuration for that budget from the start (paying one launch:
a restart and a checkpoint load), renting on-demand exactly the instances the configuration uses
(none when no configuration fits the budget: nothing is trained and nothing paid), is never
preempted, and releases every spot instance, so it pays only the on-demand price."""

from __future__ import annotations

from liveput.perf.configuration import MigrationKind
from liveput.policies.base import POLICIES, Decision, Observation, PolicyContext
from liveput.policies.common import LookupPolicy, restart_s


@POLICIES.register("on-demand")
class OnDemandPolicy(LookupPolicy):
    """The same instance budget rented on-demand: never preempted, on-demand price."""

    name = "on-demand"

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.configuration = self.lookup.best_for(context.on_demand_budget)

    def decide(self, observation: Observation) -> Decision:
        target = self.configuration
        launch = target is not None and observation.current != target
        return Decision(
            target,
            migration=MigrationKind.CHECKPOINT_RESTORE if launch else MigrationKind.NONE,
            downtime_s=restart_s(self.context, target) if launch and target is not None else 0.0,
            release=observation.num_available,
            num_on_demand=0 if target is None else target.num_instances,
            expected_samples=self.lookup.throughput(target) * observation.remaining_s,
        )
