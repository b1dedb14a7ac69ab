"""``on-demand``: the fewest on-demand instances that finish in time, at their best configuration.

Model: at its first decision it picks the smallest on-demand count ``o <= on_demand_max`` whose
best (D, P) trains the work by the deadline after the launch lead time and one launch (when none
does, ``on_demand_max``: the fastest it can); it holds those ``o`` instances to the end, is never
preempted and releases every spot instance. The baseline a user without spot would run."""

from __future__ import annotations

from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlineContext, DeadlinePolicy


@DEADLINE_POLICIES.register("on-demand")
class OnDemandDeadlinePolicy(DeadlinePolicy):
    """The fewest on-demand instances finishing by the deadline; no spot."""

    name = "on-demand"

    def __init__(self, context: DeadlineContext) -> None:
        super().__init__(context)
        self.count: int | None = None

    def provision(self, observation: Observation) -> Provisioning:
        if self.count is None:
            seconds = observation.seconds_to_deadline - self.context.lead_s
            fewest = self.fewest_on_demand(observation.samples_remaining, seconds)
            self.count = self.context.on_demand_max if fewest is None else fewest
        return Provisioning(spot=0, on_demand=self.count, spot_hold=0)
