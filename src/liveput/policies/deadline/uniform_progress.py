"""``uniform-progress``: spot while ahead of the uniform progress line, on-demand while behind.

Model (Uniform Progress of Can't Be Late, Wu et al., NSDI 2024, with a cluster): the line asks
for ``W * t / deadline`` samples by time t (W: the work). Ahead of it, the job holds every spot
instance and no on-demand one; behind it, it switches to the on-demand cluster that trains the
whole work in the deadline (the ``on-demand`` policy's count), keeping its spot instances only
until that cluster is up. Back to spot needs a lead over the line of one launch's worth of
samples (the paper's hysteresis, so it does not flap). Safety net: when the slack (time to the
deadline minus the time the rest takes on the largest allowed on-demand cluster) is less than one
interval plus a launch (the restart overhead), it stays on on-demand to the end."""

from __future__ import annotations

from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlineContext, DeadlinePolicy


@DEADLINE_POLICIES.register("uniform-progress")
class UniformProgressPolicy(DeadlinePolicy):
    """On-demand whenever progress falls behind the uniform line."""

    name = "uniform-progress"

    def __init__(self, context: DeadlineContext) -> None:
        super().__init__(context)
        self.cluster: int | None = None
        self.on_demand_mode = False
        self.safety: int | None = None

    def provision(self, observation: Observation) -> Provisioning:
        work = self.context.target_samples
        deadline_s = self.context.objective.deadline_s
        if self.cluster is None:
            fewest = self.fewest_on_demand(work, deadline_s - self.context.lead_s)
            self.cluster = self.context.on_demand_max if fewest is None else fewest
        remaining = observation.samples_remaining
        if self.safety is None:
            slack_s = observation.seconds_to_deadline - self.on_demand_finish_s(remaining)
            overhead_s = self.context.policy.interval_s + self.launch_s(self.cluster)
            if slack_s < overhead_s:
                fewest = self.fewest_on_demand(
                    remaining, observation.seconds_to_deadline - self.context.lead_s
                )
                self.safety = self.context.on_demand_max if fewest is None else fewest
        if self.safety is not None:
            return self._on_demand(observation, max(self.safety, self.cluster))
        elapsed_s = deadline_s - observation.seconds_to_deadline
        lead = observation.samples_done - work * elapsed_s / deadline_s
        hysteresis = self.throughput(self.cluster) * self.launch_s(self.cluster)
        if lead < 0:
            self.on_demand_mode = True
        elif lead >= hysteresis:
            self.on_demand_mode = False
        if self.on_demand_mode:
            return self._on_demand(observation, self.cluster)
        return Provisioning(spot=observation.num_available, on_demand=0)

    @staticmethod
    def _on_demand(observation: Observation, count: int) -> Provisioning:
        up = observation.num_on_demand >= count
        return Provisioning(
            spot=0 if up else observation.num_available,
            on_demand=count,
            spot_hold=0 if up else None,
        )
