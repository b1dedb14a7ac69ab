"""``greedy``: spot until the slack is gone, then on-demand to the end.

Model (the greedy policy of Can't Be Late, Wu et al., NSDI 2024, with a cluster): the slack is
the time to the deadline minus the time the remaining work takes on the largest allowed
on-demand cluster asked for now (launch lead time, a launch, training). While the slack is at
least one interval (the next decision would still be in time), it holds every spot instance and
no on-demand one; once it is not, it switches for good to the fewest on-demand instances that
still finish in time (at most ``on_demand_max``) and releases its spot instances."""

from __future__ import annotations

from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlineContext, DeadlinePolicy


@DEADLINE_POLICIES.register("greedy")
class GreedyPolicy(DeadlinePolicy):
    """Spot while the slack lasts, then on-demand only."""

    name = "greedy"

    def __init__(self, context: DeadlineContext) -> None:
        super().__init__(context)
        self.switched: int | None = None

    def provision(self, observation: Observation) -> Provisioning:
        if self.switched is None:
            remaining = observation.samples_remaining
            slack_s = observation.seconds_to_deadline - self.on_demand_finish_s(remaining)
            if slack_s >= self.context.policy.interval_s:
                return Provisioning(spot=observation.num_available, on_demand=0)
            seconds = observation.seconds_to_deadline - self.context.lead_s
            fewest = self.fewest_on_demand(remaining, seconds)
            self.switched = self.context.on_demand_max if fewest is None else fewest
        # Spot keeps training until the on-demand cluster is up, then goes.
        up = observation.num_on_demand >= self.switched
        return Provisioning(
            spot=0 if up else observation.num_available,
            on_demand=self.switched,
            spot_hold=0 if up else None,
        )
