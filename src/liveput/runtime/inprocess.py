"""Several instances' engines in threads of one process: scripted migrations without processes.

Used by the same-result tests and the runtime benchmark: each call to :meth:`ThreadCluster.migrate`
plans with the coordinator's planning function (:func:`planning.plan_generation`, from the layers
the engines really hold) to a target, fences the running generation
where asked, and runs every instance of the new plan in its own thread (gloo over loopback).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch.distributed as dist

from liveput.models.job import Job
from liveput.perf.configuration import Configuration
from liveput.perf.costs import MigrationCostModel
from liveput.perf.types import ModelProfile
from liveput.runtime import protocol
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint, reset_latest
from liveput.runtime.engine import Engine, EngineConfig, GenerationResult
from liveput.runtime.planning import PlanContext, plan_generation
from liveput.runtime.rendezvous import StoreRendezvous
from liveput.runtime.store import MemoryStore


@dataclass
class ThreadCluster:
    """Instances as threads sharing an in-memory store and a checkpoint directory."""

    job: Job
    """The job every instance trains (each engine copies its layers)."""
    profile: ModelProfile
    """What the planner plans with."""
    checkpoint_dir: str
    """Where checkpoints go."""
    end_step: int
    """The job's last step + 1."""
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    """Settings of every engine."""
    token: bytes = b"in-process"
    """Signs layer transfers."""
    tcp_rendezvous: bool = False
    """Meet through a TCPStore hosted by each generation's rank 0 and gloo over loopback sockets
    (as processes do), instead of one in-memory c10d store."""

    def __post_init__(self) -> None:
        self.store = MemoryStore()
        self.c10d = dist.HashStore()
        self.checkpointer = Checkpointer(self.store, self.checkpoint_dir, token=self.token)
        self.engines: dict[int, Engine] = {}
        self.plan: protocol.RuntimePlan | None = None
        self.last_applied = protocol.FRESH_START
        self.kinds: list[str] = []
        self.failures: dict[int, BaseException] = {}
        """Instances whose last generation stopped the job (the error each raised)."""

    def engine(self, instance: int) -> Engine:
        if instance not in self.engines:
            rendezvous = (
                StoreRendezvous(self.store, "127.0.0.1")
                if self.tcp_rendezvous
                else (lambda plan, rank: self.c10d)
            )
            self.engines[instance] = Engine(
                self.job,
                instance,
                self.store,
                rendezvous,
                self.checkpointer,
                self.engine_config,
                token=self.token,
            )
        return self.engines[instance]

    def migrate(
        self, target: Configuration, preempted: set[int], allocated: list[int], run_until: int
    ) -> dict[int, GenerationResult]:
        """Plan from the running plan to ``target`` and run it until step ``run_until``."""
        previous = self.plan
        start = self.last_applied + 1
        self.checkpointer.flush()
        epoch = 0 if previous is None else previous.epoch
        workers = [
            i for i in ([] if previous is None else previous.world) if i not in preempted
        ] + list(allocated)
        holdings = {
            i: tuple(self.engines[i].layers)
            for i in workers
            if i in self.engines
            and (self.engines[i].epoch, self.engines[i].last_applied) == (epoch, start - 1)
        }
        context = PlanContext(
            generation=0 if previous is None else previous.generation + 1,
            epoch=epoch,
            start_step=start,
            end_step=self.end_step,
            hosts={},
            latest_checkpoint=latest_checkpoint(self.store),
            stages_before=0 if previous is None else previous.pipeline_stages,
        )
        plan = plan_generation(
            self.profile,
            MigrationCostModel(),
            target,
            context,
            workers,
            holdings,
            previous=previous,
        )
        if plan.epoch != context.epoch:
            assert plan.restore_step is not None  # a plan of a new epoch restores a checkpoint
            protocol.record_restore(self.store, plan.epoch, start - 1, plan.restore_step)
            reset_latest(self.store, plan.epoch, plan.restore_step)
        for instance in preempted:
            self.engines.pop(instance, None)
        if run_until < self.end_step:
            protocol.fence(self.store, plan.generation, run_until, plan.num_working)
        protocol.publish_plan(self.store, plan)
        results: dict[int, GenerationResult] = {}
        self.failures = {}

        def run(instance: int) -> None:
            try:
                results[instance] = self.engine(instance).run_generation(plan)
            except protocol.JobFailure as failure:
                self.failures[instance] = failure

        threads = [threading.Thread(target=run, args=(i,)) for i in plan.world]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.failures:
            raise next(iter(self.failures.values()))
        working = [r for i, r in results.items() if plan.slots[i] is not None]
        self.last_applied = min(r.last_applied for r in working)
        self.plan = plan
        self.kinds.append(plan.kind)
        return results
