"""A stage lost without a notice comes back from its buddy's memory, with real agent processes:
the restore reads no object store, redoes only the steps since the copy, and trains exactly once
to the parameters of an uninterrupted run."""

from __future__ import annotations

import json
import logging

import pytest
from runtime_cluster import (
    JOB,
    TOKEN,
    AgentProcesses,
    assert_same_parameters,
    final_parameters,
    reference_parameters,
    run_to_end,
    run_until,
)

from liveput.models.jobs import resolve_job
from liveput.runtime import keys, protocol
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.launch import JobSpec, publish_spec
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.memory_copies import CopyRecord
from liveput.runtime.planning import profile_job
from liveput.runtime.store import SignedStore, TCPStoreBackend, readers

STEPS = 60
EVERY = 3


@pytest.fixture(autouse=True)
def coordinator_log(caplog):
    caplog.set_level(logging.INFO, logger="liveput")


@pytest.mark.process
def test_a_stage_lost_without_notice_comes_back_from_its_buddys_memory(tmp_path, process_tier):
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), checkpoint_every=EVERY))
    agents = AgentProcesses(hosted.url, tmp_path)
    try:
        job = resolve_job(JOB)
        config = CoordinatorConfig(
            num_steps=STEPS,
            num_micro_batches=job.num_micro_batches,
            interval_s=1.0,
            tick_s=0.05,
            heartbeat_timeout_s=2.0,
            initial_workers=3,
            start_grace_s=120.0,
            capacity=3,
            policy="test-fixed-1x2",
        )
        coordinator = Coordinator(store, profile_job(job, repeats=1), config)
        for instance in range(3):
            agents.start(instance)
        # Two copies made since the plan began: the stage's buddy holds it, whoever is lost.
        run_until(
            coordinator.tick,
            lambda: (
                coordinator.plan is not None
                and coordinator.committed >= coordinator.plan.start_step + 3 * EVERY
            ),
            120,
            "training at 1x2",
        )
        plan = coordinator.plan
        assert (plan.data_parallel, plan.pipeline_stages) == (1, 2)
        lost, buddy = plan.instance_at(0, 1), plan.instance_at(0, 0)
        record = CopyRecord.from_json(readers.by_instance(store, keys.COPIES)[buddy])
        assert any(set(point.layers) == set(range(job.num_layers)) for point in record.points)
        agents.kill(lost)
        generation = plan.generation
        run_until(
            coordinator.tick,
            lambda: (
                coordinator.plan.generation > generation
                and coordinator.committed > coordinator.plan.start_step
            ),
            90,
            "training again without the lost stage's holder",
        )
        restore = coordinator.plan
        assert lost not in restore.slots
        assert restore.memory_epoch is not None, restore
        assert set(restore.memory_sources.values()) == {buddy}
        # No older than the newest complete checkpoint, and at most the steps between two
        # copies (and the copy's spread) behind the step the job was at.
        assert restore.restore_step >= max(-1, coordinator_latest(store, restore))
        # The restore's first step is copied in its new epoch: a second loss before the next
        # periodic copy reads memory too.
        run_until(
            coordinator.tick,
            lambda: any(
                (point.epoch, point.step) == (restore.epoch, restore.start_step)
                and set(point.layers) == set(range(job.num_layers))
                for point in CopyRecord.from_json(
                    readers.by_instance(store, keys.COPIES)[buddy]
                ).points
            ),
            60,
            "copies of the step restored in its new epoch",
        )
        run_to_end(coordinator, agents)
        agents.wait_all()
        events = [json.loads(v) for v in store.get_prefix(keys.EVENT.prefix).values()]
        assert any(e["restore_from_memory"] for e in events), events
        report = verify_ledger(store, job.global_batch_size, STEPS)
        assert report.exactly_once, report.problems
        assert_same_parameters(
            final_parameters(tmp_path / "ckpt", job.num_layers), reference_parameters(STEPS)
        )
    finally:
        agents.close()
        store.close()


def coordinator_latest(store, plan: protocol.RuntimePlan) -> int:
    """The newest complete checkpoint the restore's epoch kept (-1: none)."""
    raw = store.get(keys.latest_checkpoint())
    if raw is None:
        return -1
    record = json.loads(raw)
    return int(record["step"]) if int(record.get("epoch", 0)) == plan.epoch else -1
