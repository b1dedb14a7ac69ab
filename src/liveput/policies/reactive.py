"""``reactive``: the throughput-optimized baseline of the Parcae paper, and Varuna's morphing.

Model: the job always wants the best configuration for the instances it has, and it reacts to
every change of that count after the fact, as both systems do (a membership change relaunches
every worker):

- when a preemption takes instances, the job stops and restarts right away (the cloud's notice
  leaves time to save a checkpoint, so no work is rolled back) into the best configuration for
  the survivors, paying ``checkpoint save + restart + checkpoint load``; the save and load move
  the whole model's state through the checkpoint storage;
- when an interval starts with more instances than the job was last configured for (new ones
  have booted), it does the same restart to use them;
- a restart in progress cannot be cut short: the workers learn the new membership only when
  their rendezvous and load complete (or time out), so a change during a restart starts the next
  morph when the current one ends, and a morph always begins with a checkpoint (Varuna's
  procedure: checkpoint, then relaunch), so every change pays save + restart + load in turn.

Nothing is forecast and no migration is cheaper than a restart: that is what it costs to be
reactive.
"""

from __future__ import annotations

from liveput.perf.configuration import MigrationKind
from liveput.policies.base import POLICIES, Decision, Observation, PolicyContext
from liveput.policies.common import LookupPolicy, checkpoint_save_s, restart_s


@POLICIES.register("reactive")
class ReactivePolicy(LookupPolicy):
    """Restart (save, relaunch, load) into the best configuration on every change of the count."""

    name = "reactive"
    remembered = ("configured_for", "busy_until_s")

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.configured_for: int | None = None
        self.busy_until_s = 0.0

    def decide(self, observation: Observation) -> Decision:
        current = observation.current
        available = observation.num_available + observation.num_on_demand
        target = self.lookup.best_for(available)
        changed = available != self.configured_for
        self.configured_for = available
        if target == current and not changed:
            return Decision(
                current, expected_samples=self.lookup.throughput(current) * observation.remaining_s
            )
        now = observation.time_s
        if target is None:
            self.busy_until_s = now
            return Decision(
                None,
                migration=(MigrationKind.RESTART if current is not None else MigrationKind.NONE),
            )
        seconds = restart_s(self.context, target)
        seconds += max(self.busy_until_s - now, 0.0)
        if current is not None:
            seconds += checkpoint_save_s(self.context, current)
        self.busy_until_s = now + seconds
        return Decision(
            target,
            migration=MigrationKind.RESTART,
            downtime_s=seconds,
            expected_samples=self.lookup.throughput(target)
            * max(observation.remaining_s - seconds, 0.0),
        )
