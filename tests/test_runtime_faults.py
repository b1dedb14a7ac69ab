"""Faults with real agent processes: kills without notice, a whole stage lost, a late joiner,
a coordinator restart, an etcd restart, and a peer without the job token."""

from __future__ import annotations

import json
import logging
import time

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
from liveput.runtime.instance_env import NOTICE_FILE_ENV
from liveput.runtime.launch import JobSpec, publish_spec
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.notices import Notice, write_notice_file
from liveput.runtime.planning import profile_job
from liveput.runtime.prune import PruneConfig
from liveput.runtime.store import SignedStore, TCPStoreBackend, readers

STEPS = 100


@pytest.fixture(autouse=True)
def coordinator_log(caplog):
    """The coordinator's plans and why it made them, in the report of a failing test (these
    tests race the machine's load; a failure under the suite's load is read from this)."""
    caplog.set_level(logging.INFO, logger="liveput")


@pytest.fixture(scope="module")
def profile():
    return profile_job(resolve_job(JOB), repeats=1)


@pytest.fixture
def cluster(tmp_path, process_tier):
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), checkpoint_every=3))
    agents = AgentProcesses(hosted.url, tmp_path)
    yield store, agents
    agents.close()
    store.close()


def coordinator_config(**overrides) -> CoordinatorConfig:
    job = resolve_job(JOB)
    values = dict(
        num_steps=STEPS,
        num_micro_batches=job.num_micro_batches,
        interval_s=1.0,
        tick_s=0.05,
        heartbeat_timeout_s=2.0,
        initial_workers=4,
        # Each test starts at the configuration it names, with every instance it started: the
        # product's 10-s grace ran out under the suite's load (three workers each starting a fork
        # server and their agents at once) and a 2x2 test began at 2x1 on two of its four.
        start_grace_s=120.0,
        capacity=6,
    )
    values.update(overrides)
    return CoordinatorConfig(**values)


def slot_holders(plan: protocol.RuntimePlan, stage: int) -> list[int]:
    return sorted(i for i, s in plan.slots.items() if s is not None and s[1] == stage)


def test_kills_without_notice_a_lost_stage_and_a_late_joiner_keep_training_exact(
    cluster, profile, tmp_path
):
    store, agents = cluster
    coordinator = Coordinator(store, profile, coordinator_config(policy="test-fixed-2x2"))
    for instance in range(4):
        agents.start(instance)
    run_until(coordinator.tick, lambda: coordinator.committed >= 4, 120, "training at 2x2")
    assert (coordinator.plan.data_parallel, coordinator.plan.pipeline_stages) == (2, 2)
    # One agent killed with no notice: the three others go on without it.
    victim = coordinator.plan.instance_at(1, 0)
    agents.start(4)  # a new instance, that joins while the job migrates away from the victim
    agents.kill(victim)
    generation = coordinator.plan.generation
    run_until(
        coordinator.tick,
        lambda: coordinator.plan.generation > generation,
        90,
        "a plan without the killed agent",
    )
    assert victim not in coordinator.plan.slots
    # The next interval takes the joiner in (2x2 again).
    run_until(
        coordinator.tick,
        lambda: (
            coordinator.plan.num_working == 4
            and 4 in coordinator.plan.slots
            and coordinator.committed >= coordinator.plan.start_step + 3
        ),
        120,
        "the late joiner at work",
    )
    # Both replicas of a stage die together: its state is gone, the checkpoint restores it.
    doomed = slot_holders(coordinator.plan, 1)
    assert len(doomed) == 2
    agents.kill(*doomed)
    run_until(
        coordinator.tick,
        lambda: coordinator.plan.kind == "checkpoint-restore",
        90,
        "a checkpoint restore",
    )
    run_to_end(coordinator, agents)
    codes = agents.wait_all()
    survivors = sorted(set(range(5)) - {victim, *doomed})
    assert all(codes[i] == 0 for i in survivors), [agents.log(i) for i in survivors]
    report = verify_ledger(store, resolve_job(JOB).global_batch_size, STEPS)
    assert report.exactly_once, report.problems
    # Counted: the restore itself. On a starved machine a slow survivor can look
    # silent and fail a plan or two; two failed plans in a row force a restore (rule 4), which
    # the events mark: the lost stage itself needs exactly one restore.
    plans = [
        {**json.loads(v), "generation": int(k.split("/")[1])}
        for k, v in sorted(
            store.get_prefix(keys.EVENT.prefix).items(), key=lambda kv: int(kv[0].split("/")[1])
        )
    ]
    # Likewise a starved survivor silent past suspect_after_s is left out at a replan, and a
    # layer only it held then comes from the checkpoint: such a restore names a live suspect.
    # (Seen once in five suite runs; every run still trains exactly once to the same parameters.)
    killed = {victim, *doomed}
    unforced = [p for p in plans if p["kind"] == "checkpoint-restore" and not p["restore_forced"]]
    # And the two replicas killed together may be found silent at ticks apart on a starved
    # machine (two suites at once): a restore planned with the second still in it fails, and the
    # one after, leaving it out, is the same loss's restore again, not a second loss.
    needed, named = [], set()
    for event in unforced:
        if set(event["suspects"]) - killed or set(event["suspects"]) & named:
            continue
        needed.append(event)
        restore = protocol.load_plan(store, event["generation"])
        named |= killed & set(() if restore is None else restore.slots)
    forced = [p for p in plans if p["restore_forced"]]
    # The lost stage's restore names the doomed pair. On a 2-core machine running this test
    # alone, the single kill before it was once planned as a restore too (a survivor's holdings
    # not current when the plan was made: time lost, nothing else; exactly once and the final
    # parameters hold below): at most that one more.
    assert any(
        set(event["suspects"]) & set(doomed)
        for event in plans
        if event["kind"] == "checkpoint-restore"
    ), plans
    assert 1 <= len(needed) <= 2, plans
    assert int(store.get(keys.migrations("checkpoint-restore"))) == len(unforced) + len(forced), (
        plans
    )
    # A restore record (a new epoch) for each restore that undid committed steps: none when
    # its checkpoint was of the last committed step.
    assert report.restores <= len(unforced) + len(forced)
    assert (report.restores >= 1) == (report.steps_rolled_back > 0)
    assert_same_parameters(final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS))


def test_a_noticed_wipe_out_checkpoints_just_in_time_and_redoes_no_step(
    profile, tmp_path, process_tier
):
    """Both instances of a 1x2 job get a notice 10 s ahead (the cloud's end for both): the job
    trains on them until 4 s before that end (``jit_checkpoint_lead_s``), then their plan
    checkpoints the step it ends at; the instance that comes after the wipe-out restores that
    step. No periodic checkpoint is taken (``checkpoint_every=0``), so without that one the
    restore went back to the initial weights and redid every step."""
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), checkpoint_every=0))
    agents = AgentProcesses(hosted.url, tmp_path)
    try:
        coordinator = Coordinator(
            store,
            profile,
            coordinator_config(
                policy="test-fixed-1x2",
                initial_workers=2,
                jit_checkpoint_lead_s=4.0,
                prune=PruneConfig(fold_ledger=False),  # every restore record stays to count
            ),
        )
        files = {i: tmp_path / f"notice-{i}.json" for i in (0, 1)}
        for instance, path in files.items():
            agents.start(instance, notices="emulator", extra_env={NOTICE_FILE_ENV: str(path)})
        run_until(coordinator.tick, lambda: coordinator.committed >= 4, 120, "training at 1x2")
        lead_s = 10.0
        for path in files.values():
            write_notice_file(path, Notice("emulator", "terminate", lead_s))
        noticed_s = time.monotonic()
        run_until(coordinator.tick, lambda: time.monotonic() - noticed_s >= lead_s, 60, "their end")
        agents.kill(0, 1)  # the cloud's end, as announced (they may have left already)
        trained = coordinator.committed
        agents.start(2)
        run_to_end(coordinator, agents)
        assert agents.processes[2].wait(timeout=30) == 0
        report = verify_ledger(store, resolve_job(JOB).global_batch_size, STEPS)
        assert report.exactly_once, report.problems
        # A restore that rolls nothing back opens no restore epoch: none in the ledger.
        assert (report.restores, report.steps_rolled_back) == (0, 0), (
            f"{report.steps_rolled_back} of {trained + 1} steps redone"
        )
        restores = [e for e in readers.events(store) if e["kind"] == "checkpoint-restore"]
        assert [e["start_step"] for e in restores] == [trained + 1]
        assert_same_parameters(final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS))
    finally:
        agents.close()
        store.close()


def test_an_agent_without_the_job_token_is_refused(cluster, profile):
    store, agents = cluster
    intruder = agents.start(9, token="not-the-token")
    assert intruder.wait(timeout=60) == 2
    assert "refused" in agents.log(9)
    assert store.get_prefix(keys.MEMBER.prefix) == {}


def test_a_noticed_instance_hands_its_layers_over_before_it_goes(cluster, profile, tmp_path):
    store, agents = cluster
    coordinator = Coordinator(
        store, profile, coordinator_config(policy="test-fixed-1x2", initial_workers=3)
    )
    for instance in range(3):
        agents.start(instance)
    # Training at 1x2 with the third instance in the plan as a spare (on a busy machine one
    # agent may arrive after the first plan, and joins a later one).
    run_until(
        coordinator.tick,
        lambda: (
            coordinator.committed >= 4
            and coordinator.plan is not None
            and None in coordinator.plan.slots.values()
        ),
        120,
        "training at 1x2 beside a spare",
    )
    spare = next(i for i, s in coordinator.plan.slots.items() if s is None)
    noticed = coordinator.plan.instance_at(0, 1)  # the only holder of stage 1
    agents.processes[noticed].terminate()  # SIGTERM: its preemption notice
    # A plan newer than the one running at the notice (on a starved machine the job may
    # already be past plan 0: a member that looked silent at the start).
    generation = coordinator.plan.generation
    run_until(
        coordinator.tick, lambda: coordinator.plan.generation > generation, 90, "the next plan"
    )
    plan = coordinator.plan
    assert plan.kind == "inter-stage" and plan.restore_step is None
    assert plan.slots[noticed] is None and plan.slots[spare] == (0, 1)
    assert {t.source for t in plan.transfers} == {noticed}
    run_to_end(coordinator, agents)
    codes = agents.wait_all()
    assert codes == {0: 0, 1: 0, 2: 0}
    assert store.get(keys.state(noticed)) == b"left"
    report = verify_ledger(store, resolve_job(JOB).global_batch_size, STEPS)
    # The coordinator's events (each plan's kind, reason and restore), to tell why a restore
    # came: once in a CI run under the suite's load, not reproduced beside three busy loops.
    assert report.exactly_once and report.restores == 0, readers.events(store)
    assert_same_parameters(final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS))
