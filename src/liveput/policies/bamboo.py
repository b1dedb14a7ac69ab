"""``bamboo``: redundant computation (Bamboo, NSDI 2023).

Model:

- *Redundancy in memory.* Every instance also holds the next stage of its pipeline (the last
  stage's successor is the first), so a configuration is feasible only when its most loaded stage
  fits in memory with one more stage's training state.
- *Overhead in normal operation.* Each instance runs the forward pass of its successor stage
  eagerly, in the pipeline's bubbles where it can. With ``m`` micro-batches, ``P`` stages and a
  forward share ``f`` of a stage's forward + backward time (from the profile's layers), an
  iteration of 1F1B has ``m + P - 1`` slots of which ``P - 1`` are bubble, so the redundant work
  adds ``max(0, m f - (P - 1))`` slots: ``throughput_factor = 1 - max(0, m f - (P - 1)) /
  (m + P - 1)``.
- *Depth fixed, width elastic.* The job launches the best such configuration for the instances
  it has, then keeps P and, at every interval, runs as many pipelines as fit (adding or dropping
  pipelines is a reconfiguration: rebuild of the groups plus, for new instances, two stages' state
  sent peer to peer).
- *Surviving a preemption.* When the lost instances never include two adjacent stages of one
  pipeline, each lost stage is taken over by its predecessor, which now runs two stages: the
  pipelines run at half speed (the slowest stage sets the pace of every synchronous replica) until
  the next interval, or, when better for the rest of the interval, the damaged pipelines are
  dropped (a rebuild). When two adjacent stages of a pipeline are lost together the state of a
  stage is gone from that pipeline and the job fails over to a full restart (restart + checkpoint
  load, into the widest configuration of the same depth that fits the survivors).
"""

from __future__ import annotations

import numpy as np

from liveput.perf.configuration import Configuration, MigrationKind, ObservationEvent
from liveput.policies.base import POLICIES, Decision, Observation, PolicyContext
from liveput.policies.common import LookupPolicy, restart_s, stage_state_bytes

DEGRADED_SPEED = 0.5
"""Throughput of a pipeline whose instance runs two stages, relative to normal."""


def redundancy_factor(
    context: PolicyContext, data_parallel: np.ndarray, stages: np.ndarray
) -> np.ndarray:
    """``1 - max(0, m f - (P - 1)) / (m + P - 1)`` for each configuration (module docstring)."""
    profile = context.profile
    forward = sum(layer.forward_s for layer in profile.layers)
    backward = sum(layer.backward_s for layer in profile.layers)
    share = forward / max(forward + backward, 1e-12)
    micro = np.ceil(
        profile.global_batch_size / (np.maximum(data_parallel, 1) * profile.micro_batch_size)
    )
    extra = np.maximum(0.0, micro * share - (stages - 1))
    return 1.0 - extra / (micro + stages - 1)


def adjacent_loss(configuration: Configuration, lost_slots: tuple[tuple[int, int], ...]) -> bool:
    """Whether some pipeline lost a stage and the stage after it (cyclically)."""
    depth = configuration.pipeline_stages
    lost = set(lost_slots)
    if depth == 1:
        return bool(lost)
    return any((pipeline, (stage + 1) % depth) in lost for pipeline, stage in lost)


@POLICIES.register("bamboo")
class BambooPolicy(LookupPolicy):
    """Redundant computation: absorb scattered losses, restart on adjacent ones."""

    name = "bamboo"
    remembered = ("stages", "degraded")

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        table = context.table
        memory_limit_gb = context.profile.instance_type.gpu_memory_gb
        total_bytes = float(context.profile.layer_state_bytes().sum())
        extra_gb = total_bytes / np.maximum(table.pipeline_stages, 1) / 1e9
        fits = table.feasible & (table.memory_gb + extra_gb <= memory_limit_gb)
        factor = redundancy_factor(context, table.data_parallel, table.pipeline_stages)
        self.throughput = np.zeros_like(self.lookup.grid)
        keep = fits & (table.data_parallel * table.pipeline_stages <= self.lookup.max_instances)
        self.throughput[table.data_parallel[keep], table.pipeline_stages[keep]] = (
            table.samples_per_s[keep] * factor[keep]
        )
        self.stages: int | None = None
        self.degraded = False

    def _launch_depth(self, num_instances: int) -> int | None:
        sizes = (
            np.arange(self.throughput.shape[0])[:, None]
            * np.arange(self.throughput.shape[1])[None, :]
        )
        candidates = np.where(sizes <= num_instances, self.throughput, 0.0)
        if candidates.max() <= 0:
            return None
        # Ties go to the shallower pipeline: the first maximum in stage order.
        best_per_depth = candidates.max(axis=0)
        return int(np.argmax(best_per_depth))

    def _widest(self, num_instances: int) -> Configuration | None:
        depth = self.stages
        if depth is None:
            return None
        widths = np.arange(self.throughput.shape[0])
        usable = (widths * depth <= num_instances) & (self.throughput[:, depth] > 0)
        if not usable.any():
            return None
        best = int(widths[usable][np.argmax(self.throughput[usable, depth])])
        return Configuration(best, depth)

    def _speed(self, configuration: Configuration | None) -> float:
        """Bamboo's throughput factor for a configuration (redundancy overhead)."""
        if configuration is None:
            return 1.0
        base = self.lookup.throughput(configuration)
        return (
            float(
                self.throughput[configuration.data_parallel, configuration.pipeline_stages] / base
            )
            if base > 0
            else 1.0
        )

    def _run(
        self,
        target: Configuration | None,
        migration: MigrationKind,
        downtime_s: float,
        remaining_s: float,
        slowdown: float = 1.0,
        num_instances_used: int | None = None,
    ) -> Decision:
        factor = self._speed(target) * slowdown
        return Decision(
            target,
            migration=migration,
            downtime_s=downtime_s,
            throughput_factor=factor,
            expected_samples=self.lookup.throughput(target)
            * factor
            * max(remaining_s - downtime_s, 0.0),
            num_instances_used=num_instances_used,
        )

    def decide(self, observation: Observation) -> Decision:
        available = observation.num_available + observation.num_on_demand
        current = observation.current
        if self.stages is None:
            self.stages = self._launch_depth(available)
        if observation.event == ObservationEvent.PREEMPTION:
            return self._absorb(observation, available)
        target = self._widest(available)
        remaining = observation.remaining_s
        if target is None:
            self.degraded = False
            return Decision(
                None, migration=(MigrationKind.NONE if current is None else MigrationKind.RESTART)
            )
        if current is None:
            self.degraded = False
            return self._run(
                target, MigrationKind.RESTART, restart_s(self.context, target), remaining
            )
        if target == current and not self.degraded:
            return self._run(current, MigrationKind.NONE, 0.0, remaining)
        repair = self.degraded
        self.degraded = False
        seconds = self.context.costs.rebuild_s(target.num_instances)
        if target.data_parallel > current.data_parallel or repair:
            seconds += self.context.costs.transfer_s(
                2 * stage_state_bytes(self.context, target.pipeline_stages)
            )
        return self._run(target, MigrationKind.RECONFIGURE, seconds, remaining)

    def _absorb(self, observation: Observation, available: int) -> Decision:
        current = observation.current
        remaining = observation.remaining_s
        lost = observation.lost_slots
        if current is None or not lost:
            return self._run(current, MigrationKind.NONE, 0.0, remaining)
        if adjacent_loss(current, lost):
            self.degraded = False
            target = self._widest(available)
            if target is None:
                return Decision(None, migration=MigrationKind.RESTART)
            return self._run(
                target, MigrationKind.RESTART, restart_s(self.context, target), remaining
            )
        damaged = len({pipeline for pipeline, _ in lost})
        intact = (
            Configuration(current.data_parallel - damaged, current.pipeline_stages)
            if current.data_parallel > damaged
            else None
        )
        rebuild = self.context.costs.rebuild_s(current.num_instances)
        keep_all = self.lookup.throughput(current) * DEGRADED_SPEED * remaining
        drop = self.lookup.throughput(intact) * max(remaining - rebuild, 0.0)
        if intact is not None and drop > keep_all:
            self.degraded = False
            return self._run(intact, MigrationKind.INTRA_STAGE, rebuild, remaining)
        self.degraded = True
        return self._run(
            current,
            MigrationKind.FAILOVER,
            0.0,
            remaining,
            slowdown=DEGRADED_SPEED,
            num_instances_used=current.num_instances - len(lost),
        )
