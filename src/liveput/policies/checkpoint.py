"""``checkpoint``: what torchrun / TorchElastic and SkyPilot managed jobs give a user.

Model:

- *Fixed configuration.* The user launches the best configuration for the instances available at
  the first interval where anything fits, and keeps it: it is never resized.
- *Periodic checkpoints.* Every ``period`` seconds of training the job saves a checkpoint
  (``checkpoint_save_s`` of lost time). The period follows Young's rule,
  ``sqrt(2 * save_s * MTBF)``, with the job's mean time between failures estimated from the
  preemptions seen so far (the preemption rate per instance-second over the history, with a prior
  of 0.5 preemption per instance-hour weighted as one instance-hour, times the instances used):
  what a careful user would set.
- *Restart and roll back.* A preemption that hits an instance in use kills every worker (any
  membership change restarts torchrun's workers); the job rolls back to its last checkpoint (the
  training since then is re-done) and, once enough instances are there again, restarts (restart +
  checkpoint load). Until then it waits. Losing an idle spare changes nothing.
"""

from __future__ import annotations

import math

import numpy as np

from liveput.perf.configuration import Configuration, MigrationKind, ObservationEvent
from liveput.policies.base import POLICIES, Decision, Observation, PolicyContext
from liveput.policies.common import LookupPolicy, checkpoint_save_s, restart_s

PRIOR_PREEMPTIONS_PER_INSTANCE_HOUR = 0.5
"""Prior preemption rate of the MTBF estimate (the p3 trace measured 0.61, the v100 one 0.54)."""
PRIOR_WEIGHT_INSTANCE_S = 3600.0
"""Weight of the prior, instance-seconds."""


@POLICIES.register("checkpoint")
class CheckpointPolicy(LookupPolicy):
    """Fixed configuration, periodic checkpoints, restart and roll back on every loss."""

    name = "checkpoint"
    remembered = ("configuration", "trained_since_checkpoint_s", "running_since_s", "pending_s")

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.configuration: Configuration | None = None
        self.trained_since_checkpoint_s = 0.0
        self.running_since_s: float | None = None
        self.pending_s = 0.0

    def _period_s(self, observation: Observation, save_s: float) -> float:
        history = observation.history
        known = len(history) - 1  # the current interval's events are not known yet
        exposure = float(np.sum(history.count[:known])) * history.interval_s
        losses = float(np.sum(history.preempted[:known]))
        rate_per_s = (
            losses + PRIOR_PREEMPTIONS_PER_INSTANCE_HOUR * PRIOR_WEIGHT_INSTANCE_S / 3600.0
        ) / (exposure + PRIOR_WEIGHT_INSTANCE_S)
        used = self.configuration.num_instances if self.configuration else 1
        mtbf_s = 1.0 / max(rate_per_s * used, 1e-12)
        return math.sqrt(2.0 * save_s * mtbf_s)

    def _account(self, observation: Observation) -> None:
        """Training seconds since the last checkpoint, from this policy's own decisions."""
        if self.running_since_s is not None:
            elapsed = observation.time_s - self.running_since_s
            paid = min(self.pending_s, elapsed)
            self.pending_s -= paid
            self.trained_since_checkpoint_s += elapsed - paid
        self.running_since_s = observation.time_s if observation.current is not None else None

    def decide(self, observation: Observation) -> Decision:
        self._account(observation)
        available = observation.num_available + observation.num_on_demand
        if self.configuration is None:
            self.configuration = self.lookup.best_for(available)
        fixed = self.configuration
        current = observation.current
        rollback = 0.0
        if observation.event == ObservationEvent.PREEMPTION and observation.lost_slots:
            rollback = self.trained_since_checkpoint_s
            self.trained_since_checkpoint_s = 0.0
            current = None
        if fixed is None or fixed.num_instances > available:
            self.running_since_s = None
            self.pending_s += rollback
            return Decision(
                None,
                rollback_s=rollback,
                migration=(MigrationKind.NONE if current is None else MigrationKind.RESTART),
            )
        downtime = 0.0
        migration = MigrationKind.NONE
        if current != fixed:
            downtime = restart_s(self.context, fixed)
            migration = MigrationKind.RESTART
        save = checkpoint_save_s(self.context, fixed)
        checkpoint = 0.0
        if (
            observation.event == ObservationEvent.INTERVAL
            and self.trained_since_checkpoint_s >= self._period_s(observation, save)
        ):
            checkpoint = save
            self.trained_since_checkpoint_s = 0.0
        self.pending_s += downtime + rollback + checkpoint
        self.running_since_s = observation.time_s
        return Decision(
            fixed,
            migration=migration,
            downtime_s=downtime,
            rollback_s=rollback,
            checkpoint_s=checkpoint,
            expected_samples=self.lookup.throughput(fixed)
            * max(observation.remaining_s - downtime - rollback - checkpoint, 0.0),
        )
