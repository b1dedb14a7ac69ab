"""Rule 9 of the coordinator: when every current holder of some layer has a notice, the running
plan checkpoints the step it ends at just before the earliest end announced, and the restore after
the wipe-out redoes no step. And notices keep their announced end through a coordinator restart.

On views (a hypothesis test of when the rule fires), with the in-memory model agents of
``test_runtime_decide`` (a manual clock, no processes), and on one engine whose step fails."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_runtime_decide import TICK_S, ModelAgents, make_coordinator, run, start

from liveput.models.jobs import resolve_job
from liveput.perf.configuration import Configuration
from liveput.perf.costs import MigrationCostModel
from liveput.runtime import engine as engine_module
from liveput.runtime import keys
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint, latest_record
from liveput.runtime.clock import ManualClock
from liveput.runtime.decide import (
    ActionKind,
    CoordinatorConfig,
    CoordinatorView,
    Member,
    checkpoint_lead_s,
    decide,
)
from liveput.runtime.engine import Ending, Engine, EngineConfig
from liveput.runtime.protocol import FRESH_START, RuntimePlan
from liveput.runtime.store import MemoryStore, readers

CONFIG = CoordinatorConfig(
    num_steps=1000, num_micro_batches=8, notice_margin_s=20.0, jit_checkpoint_lead_s=5.0
)
COMMITTED = 40


def _plan(data_parallel: int, stages: int) -> RuntimePlan:
    """Plan 3 at ``data_parallel`` x ``stages``, instance ``d * stages + p`` at slot (d, p)."""
    slots = {d * stages + p: (d, p) for d in range(data_parallel) for p in range(stages)}
    return RuntimePlan(
        3,
        0,
        30,
        1000,
        data_parallel,
        stages,
        [0, 2 * stages],
        slots,
        dict.fromkeys(slots, "h"),
        [],
        "none",
        None,
    )


def _choose(count: int, event: str, lost: tuple) -> Configuration:
    return Configuration(1, 1)


# A notice: no notice, one without an announced end, or (lead, seconds since it came).
NOTICE = st.one_of(
    st.none(),
    st.just("no end"),
    st.tuples(st.floats(0.0, 120.0), st.floats(0.0, 130.0)),
)


# A measured step or checkpoint write time, seconds, or none measured yet (up to a stage's
# state written over a slow link: its lead then passes the unmeasured one).
MEASURED = st.one_of(st.none(), st.floats(0.0, 3.0), st.floats(3.0, 30.0))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.data(),
    st.booleans(),
    MEASURED,
    MEASURED,
)
def test_the_checkpoint_is_asked_exactly_when_only_noticed_instances_hold_a_layer_near_its_end(
    data_parallel, stages, data, saved, step_s, write_s
):
    plan = _plan(data_parallel, stages)
    members = {}
    for instance, (_, stage) in plan.slots.items():
        notice = data.draw(NOTICE, label=f"notice of {instance}")
        fields: dict = {}
        if notice == "no end":
            fields = dict(noticed=True, notice_lead_s=None, notice_age_s=1.0)
        elif notice is not None:
            lead_s, age_s = notice
            fields = dict(noticed=True, notice_lead_s=lead_s, notice_age_s=age_s)
        members[instance] = Member(
            "h",
            0.1,
            layers=(2 * stage, 2 * stage + 1),
            held_epoch=0,
            held_step=COMMITTED,
            arrived=True,
            **fields,
        )
    # The fewest instances a configuration runs on: up to one more than the plan has.
    fewest = data.draw(st.integers(1, data_parallel * stages + 1), label="fewest instances")
    view = CoordinatorView(
        100.0,
        members,
        plan,
        plan,
        COMMITTED,
        all_arrived=True,
        latest_checkpoint=COMMITTED if saved else 29,
        step_s=step_s,
        checkpoint_write_s=write_s,
        fewest_instances=fewest,
    )
    action = decide(view, CONFIG, _choose)
    # Brute force: per stage (its two layers), its holders all noticed, the earliest end
    # announced among them.
    ends = []
    for stage in range(stages):
        holders = [members[i] for i, s in plan.slots.items() if s is not None and s[1] == stage]
        if all(m.noticed for m in holders):
            ends += [
                m.notice_lead_s - m.notice_age_s for m in holders if m.notice_lead_s is not None
            ]
    # The lead: 3 measured steps and writes, between 1 s and the 20-s notice margin (the
    # configured 5 s until a write is known).
    lead_s = 5.0
    if step_s is not None and write_s is not None:
        lead_s = sorted([1.0, 3 * (step_s + write_s), 20.0])[1]
    elif write_s is not None:  # a write known before a step: at least 3 writes, 5 s
        lead_s = min(20.0, max(5.0, 3 * write_s))
    due = bool(ends) and min(ends) <= lead_s and not saved
    if due:  # unless enough instances stay up a margin past that end to take the layers over
        margin = CONFIG.notice_margin_s
        staying = [
            m
            for m in members.values()
            if not m.noticed
            or (m.notice_lead_s is not None and m.notice_lead_s - m.notice_age_s > margin)
            and m.notice_lead_s - m.notice_age_s > min(ends) + margin
        ]
        due = len(staying) < fewest
    assert (action.kind is ActionKind.CHECKPOINT) == due, (action, ends)
    if due:
        assert action.checkpoint_before_s == max(0.0, min(ends))


def _checkpointing_view(**changes) -> CoordinatorView:  # noqa: ANN003
    """Plan 3 at 2x1 on 0 and 1, both noticed with 3 s left, asked to checkpoint 1 s ago."""
    plan = _plan(2, 1)
    noticed = dict(noticed=True, notice_lead_s=10.0, notice_age_s=7.0)
    held = dict(layers=(0, 1), held_epoch=0, held_step=COMMITTED, arrived=True)
    members = {
        0: Member("h", 0.1, **noticed, **held),
        1: Member("h", 0.1, **noticed, **held),
        5: Member("h", 0.1),  # a newcomer without a notice
    }
    values: dict = dict(
        now_s=100.0,
        members=members,
        plan=plan,
        started=plan,
        committed=COMMITTED,
        all_arrived=True,
        latest_checkpoint=29,
        checkpoint_requested=True,
        checkpoint_request_age_s=1.0,
    )
    values.update(changes)
    return CoordinatorView(**values)


def test_after_the_request_it_waits_for_the_checkpoint_then_replans_without_the_going_ones():
    action = decide(_checkpointing_view(), CONFIG, _choose)
    assert action.kind is ActionKind.WAIT
    assert action.status == f"checkpointing step {COMMITTED} before the end the notices announce"
    # Written: the next plan is on the newcomer alone (the noticed ones leave).
    action = decide(_checkpointing_view(latest_checkpoint=COMMITTED), CONFIG, _choose)
    assert action.kind is ActionKind.REPLAN and action.reason == "checkpoint"
    assert action.workers == (5,) and action.senders == () and action.holdings == {}
    # Never written (a writer died): after the lead, the same replan (the older checkpoint),
    # or at once when the writer is silent; one that left after writing is no reason.
    action = decide(_checkpointing_view(checkpoint_request_age_s=5.0), CONFIG, _choose)
    assert action.kind is ActionKind.REPLAN and action.workers == (5,)
    members = dict(_checkpointing_view().members)
    members[1] = dataclasses.replace(members[1], heartbeat_age_s=2.0)
    action = decide(_checkpointing_view(members=members), CONFIG, _choose)
    assert action.kind is ActionKind.REPLAN and action.workers == (5,)
    members[1] = dataclasses.replace(members[1], heartbeat_age_s=0.1, left=True)
    action = decide(_checkpointing_view(members=members), CONFIG, _choose)
    assert action.kind is ActionKind.WAIT
    # Nobody else: wait, and say the next plan restores the step checkpointed.
    alone = {i: m for i, m in _checkpointing_view().members.items() if i != 5}
    view = _checkpointing_view(members=alone, latest_checkpoint=COMMITTED)
    action = decide(view, CONFIG, _choose)
    assert action.kind is ActionKind.WAIT
    assert action.status == (
        f"waiting for instances (none available; the next plan restores from step {COMMITTED})"
    )


def test_a_noticed_wipe_out_restores_the_step_it_was_at():
    """Four instances at 2x2 all get a notice 12 s ahead (inside the 20-s margin: the job
    trains on them while they last, Rule 6); 5 s before that end their plan checkpoints the step
    it ends at, and the instance that comes after them restores it: nothing is redone."""
    store, clock, coordinator, agents = start(steps=2000, instances=4)
    run(coordinator, agents, clock, 40)
    assert coordinator.plan.num_working == 4 and coordinator.committed > 10
    for instance in range(4):
        agents.notice(instance, lead_s=12.0)
    run(coordinator, agents, clock, int(6.0 / TICK_S))
    assert agents.checkpoints_asked == []  # still training on them
    run(coordinator, agents, clock, int(3.0 / TICK_S))
    assert agents.checkpoints_asked == [coordinator.committed], coordinator.status
    saved = coordinator.committed
    for instance in range(4):
        agents.kill(instance)  # at the end the notices announced
    run(coordinator, agents, clock, int(4.0 / TICK_S))
    assert coordinator.committed == saved and "waiting for instances" in coordinator.status
    agents.join(4)
    run(coordinator, agents, clock, int(3.0 / TICK_S))
    plan = coordinator.plan
    assert plan.restore_step == saved and plan.start_step == saved + 1  # nothing redone
    assert coordinator.committed > saved and agents.stale_trained == 0
    restores = [e for e in readers.events(store) if e["kind"] == "checkpoint-restore"]
    assert [e["start_step"] for e in restores] == [saved + 1]
    # The choice is the restore's event, with the time from the request to it.
    notice = restores[0]["notice"]
    assert notice["choice"] == "just-in-time" and notice["measured_s"] >= 4.0


def test_with_steps_and_writes_measured_the_checkpoint_is_asked_later():
    """The same wipe-out with a step and a checkpoint write measured (0.1 s each, as the
    agents publish them): the lead is 1 s (three of each is less than the 1-s floor), not 5 s,
    so the job trains 4 s longer on the going instances and still redoes nothing."""
    store, clock, coordinator, agents = start(steps=2000, instances=4)
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    record = {"data_parallel": plan.data_parallel, "pipeline_stages": plan.pipeline_stages}
    record.update(step_s=0.1, steps=20)
    store.set(keys.step_times(plan.generation), json.dumps(record).encode())
    latest = json.loads(store.get(keys.latest_checkpoint()))
    store.set(keys.latest_checkpoint(), json.dumps({**latest, "write_s": 0.1}).encode())
    for instance in range(4):
        agents.notice(instance, lead_s=12.0)
    run(coordinator, agents, clock, int(10.6 / TICK_S))
    assert agents.checkpoints_asked == [], coordinator.status  # 1.4 s left: still training
    run(coordinator, agents, clock, int(1.0 / TICK_S))
    assert agents.checkpoints_asked == [coordinator.committed], coordinator.status
    saved = coordinator.committed
    for instance in range(4):
        agents.kill(instance)
    agents.join(4)
    run(coordinator, agents, clock, int(6.0 / TICK_S))
    assert coordinator.plan.restore_step == saved and coordinator.committed > saved


def test_a_checkpoint_written_slower_than_the_unmeasured_lead_is_asked_for_in_time():
    """A stage's state written over a slow link (21 s measured) next to 10-s steps: the
    checkpoint is asked for the notice margin (20 s) before the end, not the unmeasured 5 s
    (a write that could not finish), and the coordinator waits for it as long. The newcomer
    alone runs no configuration (the fewest is 2): the layers have nowhere to move."""

    def view(age_s: float, **measured: float) -> CoordinatorView:
        members = dict(_checkpointing_view().members)
        for instance in (0, 1):
            members[instance] = dataclasses.replace(
                members[instance], notice_lead_s=80.0, notice_age_s=age_s
            )
        return _checkpointing_view(
            members=members, checkpoint_requested=False, fewest_instances=2, **measured
        )

    slow = dict(step_s=10.0, checkpoint_write_s=21.0)
    assert checkpoint_lead_s(view(0.0, **slow), CONFIG) == CONFIG.notice_margin_s
    assert decide(view(55.0, **slow), CONFIG, _choose).kind is not ActionKind.CHECKPOINT
    action = decide(view(61.0, **slow), CONFIG, _choose)
    assert action.kind is ActionKind.CHECKPOINT and action.checkpoint_before_s == 19.0
    assert decide(view(61.0), CONFIG, _choose).kind is not ActionKind.CHECKPOINT  # unmeasured
    waiting = _checkpointing_view(**slow, checkpoint_request_age_s=15.0)
    assert decide(waiting, CONFIG, _choose).kind is ActionKind.WAIT
    assert decide(_checkpointing_view(checkpoint_request_age_s=15.0), CONFIG, _choose).kind is (
        ActionKind.REPLAN
    )


def test_with_the_auto_margin_the_lead_is_the_checkpoints_own_not_a_moves():
    """``--notice-margin auto`` is twice a move's measured seconds (2 s here), where Rule 9's
    move is a checkpoint: its lead comes from its own step and write (the safety factor x
    (0.32 + 5.6) s), not capped at the margin. Capped, the instances went before the
    checkpoint was written."""
    auto = dataclasses.replace(CONFIG, notice_margin_s=None)
    view = _checkpointing_view(
        checkpoint_requested=False,
        fewest_instances=2,
        step_s=0.32,
        checkpoint_write_s=5.6,
        auto_notice_margin_s=2.0,
    )
    lead_s = CONFIG.jit_checkpoint_safety * (0.32 + 5.6)
    assert lead_s > 2.0 and checkpoint_lead_s(view, auto) == pytest.approx(lead_s)
    assert checkpoint_lead_s(view, CONFIG) == pytest.approx(lead_s)  # under the fixed 20 s
    capped = dataclasses.replace(CONFIG, notice_margin_s=5.0)
    assert checkpoint_lead_s(view, capped) == 5.0  # a fixed margin: the user's word


def test_before_a_write_is_measured_slow_storage_gets_the_lead_its_estimate_needs():
    """No checkpoint's write measured yet, and storage at 1 MB/s (a stage's state over a slow
    link): the wipe-out's checkpoint is asked the notice margin (20 s) before the end, from
    the write estimated for the plan's largest stage, not the unmeasured 5 s before it, a
    write that could not finish. At the default 2.6 GB/s the estimate asks it later."""
    asked_s = {}
    for name, bandwidth in (("slow", 1e6), ("fast", 2.6e9)):
        store, clock = MemoryStore(), ManualClock()
        costs = MigrationCostModel(checkpoint_bandwidth_bytes_per_s=bandwidth)
        coordinator = make_coordinator(store, clock, steps=2000, costs=costs)
        agents = ModelAgents(store, coordinator.profile.num_layers)
        for instance in range(4):
            agents.join(instance)
        run(coordinator, agents, clock, 40)
        plan = coordinator.plan
        record = {"data_parallel": plan.data_parallel, "pipeline_stages": plan.pipeline_stages}
        store.set(
            keys.step_times(plan.generation),
            json.dumps({**record, "step_s": 0.1, "steps": 20}).encode(),
        )
        assert "write_s" not in json.loads(store.get(keys.latest_checkpoint()))
        for instance in range(4):
            agents.notice(instance, lead_s=30.0)
        for tick in range(int(30.0 / TICK_S)):
            run(coordinator, agents, clock, 1)
            if agents.checkpoints_asked:
                asked_s[name] = 30.0 - (tick + 1) * TICK_S  # before the end
                break
    assert 19.0 <= asked_s["slow"] <= 20.0, asked_s
    assert asked_s["fast"] < 5.0, asked_s


def test_a_checkpoint_records_how_long_its_write_took(tmp_path):
    store = MemoryStore()
    checkpointer = Checkpointer(store, str(tmp_path))
    job = resolve_job("tiny-gpt-small")
    engine = Engine(job, 0, store, rendezvous=None, checkpointer=checkpointer)
    engine._restore(
        RuntimePlan(0, 0, 0, 1, 1, 1, [0, job.num_layers], {0: (0, 0)}, {}, [], "none", -1),
        range(job.num_layers),
    )
    checkpointer.save_async(0, 4, list(engine.layers.values()), job.num_layers)
    checkpointer.close()
    step, write_s = latest_record(store)
    assert step == latest_checkpoint(store) == 4
    assert write_s is not None and 0.0 < write_s < 60.0


def test_a_restarted_coordinator_counts_a_notice_from_when_it_came():
    """A notice with a 60-s lead moves the job off its instance 40 s after it came (20-s
    margin). The coordinator restarts 30 s after the notice; the new one moves off it 10 s
    later, not 40 s (the notice's lead counted afresh from its restart, past its end)."""
    store, clock, coordinator, agents = start(steps=4000, instances=5)
    wall_s = 1000.0  # the wall clock both coordinators read, in unix seconds

    def wall_clock() -> float:
        return wall_s + clock.now_s()

    coordinator = make_coordinator(store, clock, steps=4000, wall_clock=wall_clock)
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    victim = next(i for i, s in plan.slots.items() if s is not None)
    agents.notice(victim, lead_s=60.0)
    noticed_at_s = wall_clock()
    run(coordinator, agents, clock, int(30.0 / TICK_S))
    assert coordinator.plan.slots.get(victim) is not None  # still training on it
    record = store.get(keys.notice_end(victim))
    assert record is not None and b'"end_unix_s": ' in record
    wall_s, clock = wall_clock(), ManualClock()  # a new process: its clock starts again
    recovered = make_coordinator(store, clock, steps=4000, wall_clock=wall_clock)
    while recovered.plan.slots.get(victim) is not None:
        assert wall_clock() - noticed_at_s < 45.0, recovered.status
        run(recovered, agents, clock, 1)
    moved_after_s = wall_clock() - noticed_at_s
    assert 40.0 <= moved_after_s <= 40.0 + CONFIG.notice_settle_s + 3 * TICK_S
    assert recovered.plan.restore_step is None and agents.stale_trained == 0


def test_a_rank_whose_connection_a_fenced_peer_reset_still_writes_its_share(tmp_path, monkeypatch):
    """A peer that leaves its communication at the fence for the checkpoint may reset this
    rank's connection mid-step before this rank's watchdog aborts it (a ``RuntimeError`` from
    gloo, not ``CommAborted``): the share of the last step it applied is written all the same.
    Before, only an abort by the watchdog wrote it, and under load the restore after the
    wipe-out went back to the initial weights."""
    job = resolve_job("tiny-gpt-small")
    store = MemoryStore()
    checkpointer = Checkpointer(store, str(tmp_path / "ckpt"))
    engine = Engine(
        job, 0, store, rendezvous=None, checkpointer=checkpointer, config=EngineConfig()
    )
    plan = RuntimePlan(
        1, 0, 0, 50, 1, 1, [0, job.num_layers], {0: (0, 0)}, {0: "h"}, [], "none", FRESH_START
    )
    store.set(keys.checkpoint_request(plan.generation), b"1")
    real = engine_module.compute_gradients

    def reset_at_step_3(job, layers, position, groups, step, loss_scale):
        if step == 3:
            raise RuntimeError("Read error [127.0.0.1]:1: Connection reset by peer")
        return real(job, layers, position, groups, step, loss_scale)

    monkeypatch.setattr(engine_module, "compute_gradients", reset_at_step_3)
    result = engine.run_generation(plan)
    checkpointer.close()
    assert result.ending is Ending.FAILED and result.last_applied == 2
    assert latest_checkpoint(store) == 2
    for index in range(job.num_layers):
        assert (tmp_path / "ckpt" / "step-2" / f"layer-{index}.pt").is_file()


def test_noticed_holders_hand_their_layers_over_where_a_configuration_runs_without_them():
    """Every holder of the plan's layers has a notice, but the newcomer runs a configuration
    alone: no checkpoint that every stage writes and reads back (the pipeline regime's
    noticed losses stopped the job 65-79 s that way); at the margin the noticed holders send
    their layers to it while they are still up."""
    members = dict(_checkpointing_view().members)
    for instance in (0, 1):
        members[instance] = dataclasses.replace(
            members[instance], notice_lead_s=80.0, notice_age_s=61.0
        )
    measured = dict(step_s=10.0, checkpoint_write_s=21.0)
    view = _checkpointing_view(members=members, checkpoint_requested=False, **measured)
    action = decide(view, CONFIG, _choose)
    assert action.kind is ActionKind.REPLAN and action.reason == "loss"
    assert action.workers == (5,) and action.senders == (0, 1) and not action.restore
    assert action.holdings == {0: (0, 1), 1: (0, 1)}
