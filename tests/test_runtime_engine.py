"""Engine: the same result whatever (D, P) and whatever migrations, exactly once."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from liveput.plan.migration import plan_migration
from liveput.perf.costs import MigrationCostModel
from liveput.policies.base import Configuration
from liveput.runtime import protocol
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint
from liveput.runtime.engine import Ending, Engine, EngineConfig
from liveput.runtime.job import resolve_job
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import PlanContext, assignment_of, profile_job, to_runtime_plan
from liveput.runtime.schedule import StagePosition, apply_step, compute_gradients
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.store import MemoryStore

JOB = "tiny-gpt-small"


def reference_run(steps: int) -> list[dict[str, torch.Tensor]]:
    """An uninterrupted single-process run."""
    job = resolve_job(JOB)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    position = StagePosition(0, 0, 1, 1, None, None)
    for step in range(steps):
        compute_gradients(job, layers, position, None, step)
        apply_step(layers)
    return [layer.module.state_dict() for layer in layers]


class ThreadCluster:
    """Engines of several instances in threads of this process (gloo over loopback)."""

    def __init__(self, tmp_path, end_step: int, checkpoint_every: int) -> None:
        self.job = resolve_job(JOB)
        self.profile = profile_job(self.job, repeats=1)
        self.store = MemoryStore()
        self.c10d = dist.HashStore()
        self.checkpointer = Checkpointer(self.store, str(tmp_path / "ckpt"))
        self.config = EngineConfig(checkpoint_every=checkpoint_every, comm_timeout_s=20)
        self.engines: dict[int, Engine] = {}
        self.plan: protocol.RuntimePlan | None = None
        self.end_step = end_step
        self.kinds: list[str] = []

    def engine(self, instance: int) -> Engine:
        if instance not in self.engines:
            self.engines[instance] = Engine(self.job, instance, self.store,
                                            lambda plan, rank: self.c10d, self.checkpointer,
                                            self.config, token=b"secret")
        return self.engines[instance]

    def migrate(self, target: Configuration, preempted: set[int], allocated: list[int],
                run_until: int) -> protocol.RuntimePlan:
        """Plan from the running plan to ``target``, run it until step ``run_until``."""
        previous = self.plan
        start = 0 if previous is None else self.last_applied + 1
        self.checkpointer.flush()
        migration = plan_migration(self.profile, MigrationCostModel(), assignment_of(previous),
                                   preempted, allocated, target)
        context = PlanContext(
            generation=0 if previous is None else previous.generation + 1,
            epoch=0 if previous is None else previous.epoch, start_step=start,
            end_step=self.end_step, hosts={}, latest_checkpoint=latest_checkpoint(self.store),
            stages_before=0 if previous is None else previous.pipeline_stages)
        plan = to_runtime_plan(self.profile, migration, context)
        if plan.epoch != context.epoch:
            protocol.record_restore(self.store, plan.epoch, start - 1, plan.restore_step)
        for instance in preempted:
            self.engines.pop(instance, None)
        if run_until < self.end_step:
            protocol.fence(self.store, plan.generation, run_until, plan.num_working)
        protocol.publish_plan(self.store, plan)
        results = {}

        def run(instance: int) -> None:
            results[instance] = self.engine(instance).run_generation(plan)

        threads = [threading.Thread(target=run, args=(i,)) for i in plan.world]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert len(results) == len(plan.world)
        working = [r for i, r in results.items() if plan.slots[i] is not None]
        expected = Ending.FINISHED if run_until >= self.end_step else Ending.FENCED
        assert {r.ending for r in working} == {expected}
        self.last_applied = min(r.last_applied for r in working)
        assert {r.last_applied for r in working} == {min(run_until, self.end_step) - 1}
        self.plan = plan
        self.kinds.append(plan.kind)
        return plan

    def final_parameters(self) -> list[dict[str, torch.Tensor]]:
        return [self.checkpointer.load_layer_file(f"final/layer-{i}.pt")["module"]
                for i in range(self.job.num_layers)]


def assert_same(parameters, reference) -> None:
    for got, want in zip(parameters, reference, strict=True):
        for name in want:
            assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name


def test_every_migration_kind_gives_the_uninterrupted_result(tmp_path):
    steps = 12
    cluster = ThreadCluster(tmp_path, end_step=steps, checkpoint_every=3)
    cluster.migrate(Configuration(2, 2), set(), [0, 1, 2, 3], run_until=2)
    cluster.migrate(Configuration(1, 2), {3}, [], run_until=4)          # intra-stage
    cluster.migrate(Configuration(2, 2), set(), [4, 5], run_until=6)    # inter-stage
    cluster.migrate(Configuration(1, 4), set(), [], run_until=8)        # pipeline
    stage3 = cluster.plan.instance_at(0, 3)
    cluster.migrate(Configuration(1, 2), {stage3}, [], run_until=steps)  # checkpoint-restore
    assert cluster.kinds == ["start", "intra-stage", "inter-stage", "pipeline",
                             "checkpoint-restore"]
    assert cluster.plan.restore_step == 5  # checkpoints after steps 2 and 5; 6 and 7 are redone
    assert_same(cluster.final_parameters(), reference_run(steps))
    report = verify_ledger(cluster.store, cluster.job.global_batch_size, steps)
    assert report.exactly_once
    assert report.steps_rolled_back == 2
    assert report.restores == 1


def test_a_forged_layer_transfer_is_refused():
    from liveput.runtime.layer_state import decode_state, encode_state

    data = encode_state({"module": {"w": torch.ones(2)}, "optimizer": {}}, b"token")
    assert torch.equal(decode_state(data, b"token")["module"]["w"], torch.ones(2))
    with pytest.raises(ValueError, match="not signed"):
        decode_state(data, b"other")
    with pytest.raises(ValueError, match="not signed"):
        decode_state(data[32:], b"token")
