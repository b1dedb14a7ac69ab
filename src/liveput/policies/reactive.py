"""``reactive``: the throughput-optimized baseline of the Parcae paper, and Varuna's morphing.

Model: the job always wants the best configuration for the instances it has. It reacts only to
what already happened:

- when a preemption takes an instance the configuration uses, the job stops; it restarts right
  away (the cloud's notice leaves time to save a checkpoint, so no work is rolled back) into the
  best configuration for the survivors, paying ``checkpoint save + restart + checkpoint load``;
- when an interval starts with a count whose best configuration differs from the one running (new
  instances arrived, or a loss left spares it can now use), it does the same restart;
- losing an idle spare changes nothing.

Nothing is forecast and no migration is cheaper than a restart: that is what it costs to be
reactive.
"""

from __future__ import annotations

from liveput.policies.base import POLICIES, Decision, Observation, Policy, PolicyContext
from liveput.policies.common import ConfigurationLookup, checkpoint_save_s, restart_s


@POLICIES.register("reactive")
class ReactivePolicy(Policy):
    """Restart into the best configuration on every change that matters."""

    name = "reactive"

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.lookup = ConfigurationLookup(context)

    def decide(self, observation: Observation) -> Decision:
        current = observation.current
        hit = observation.event == "preemption" and bool(observation.lost_slots)
        target = self.lookup.best_for(observation.num_available + observation.num_on_demand)
        if target == current and not hit:
            return Decision(current, expected_samples=self.lookup.throughput(current)
                            * observation.remaining_s)
        if target is None:
            return Decision(None, migration="restart" if current is not None else "none")
        seconds = restart_s(self.context, target)
        if current is not None:
            seconds += checkpoint_save_s(self.context, current)
        return Decision(target, migration="restart", downtime_s=seconds,
                        expected_samples=self.lookup.throughput(target)
                        * max(observation.remaining_s - seconds, 0.0))
