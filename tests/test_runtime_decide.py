"""The coordinator's decisions with a manual clock and the in-memory store, no processes.

``ModelAgents`` follow the store protocol as real agents do (heartbeats, arrivals, holdings
reports, commit votes, failure reports, checkpoints) and hold layers exactly as the engine does,
so a plan that names a source without the layer, or a layer at the wrong step, fails here as it
fails on real instances.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from measured import tiny_gpt_profile

from liveput.errors import LiveputError
from liveput.perf.configuration import Configuration
from liveput.perf.costs import MigrationCostModel
from liveput.policies.base import POLICIES, Decision, Observation, Policy
from liveput.runtime import keys, protocol
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.decide import Action, ActionKind, CoordinatorView, Member, decide
from liveput.runtime.notices import Notice
from liveput.runtime.protocol import FRESH_START, FailureReport, Holding, RuntimePlan
from liveput.runtime.store import MemoryStore, readers

TICK_S = 0.2
CHECKPOINT_EVERY = 5


@dataclass
class _Instance:
    alive: bool = True
    layers: frozenset[int] = frozenset()
    epoch: int = 0
    step: int = FRESH_START
    arrived: int = -1
    starved_ticks: int = 0
    """Ticks it stays silent (a starved process: alive, heard of again afterwards)."""


class ModelAgents:
    """Instances that follow the protocol in memory, one step per tick."""

    def __init__(self, store: MemoryStore, num_layers: int) -> None:
        self.store = store
        self.num_layers = num_layers
        self.instances: dict[int, _Instance] = {}
        self.generation = -1
        self.phase = "idle"  # arriving, training, ended
        self.checkpoints: set[int] = set()
        self.checkpoints_asked: list[int] = []
        """Steps checkpointed because the coordinator asked (Rule 9), in order."""
        self.stale_trained = 0
        """Times a plan had an instance train on layers of another point (must stay 0)."""
        self.move_ticks = 0
        """Ticks a plan's layers take to arrive once its instances met (0: at once)."""
        self._moving_for = 0

    def join(self, instance: int, market: str = "spot") -> None:
        self.instances[instance] = _Instance()
        self.store.set(
            keys.member(instance), json.dumps({"host": "127.0.0.1", "market": market}).encode()
        )
        self.store.add(keys.heartbeat(instance), 1)

    def kill(self, instance: int) -> None:
        self.instances[instance].alive = False

    def notice(self, instance: int, lead_s: float | None = None) -> None:
        notice = (
            b"{}" if lead_s is None else Notice("emulator", "terminate", lead_s).to_json().encode()
        )
        self.store.set(keys.notice(instance), notice)

    def starve(self, instance: int, ticks: int) -> None:
        self.instances[instance].starved_ticks = ticks

    def alive(self) -> list[int]:
        return [i for i, s in self.instances.items() if s.alive]

    def _heard(self, instance: int) -> bool:
        state = self.instances[instance]
        return state.alive and state.starved_ticks == 0

    def _report(self, plan: RuntimePlan, instance: int, ending: str) -> None:
        state = self.instances[instance]
        protocol.report_holding(
            self.store,
            instance,
            Holding(plan.generation, state.epoch, state.step, tuple(sorted(state.layers)), ending),
        )

    def _fail(self, plan: RuntimePlan, why: str) -> None:
        for instance in plan.world:
            if self._heard(instance):
                protocol.report_failure(self.store, plan.generation, instance, FailureReport(why))
                self._report(plan, instance, "failed")
        self.phase = "ended"

    def _execute(self, plan: RuntimePlan) -> None:
        point = (plan.epoch, plan.start_step - 1)
        for instance in plan.world:
            state = self.instances[instance]
            if not state.alive:
                return self._fail(plan, "peer closed the connection")
        if plan.restore_step is not None and plan.restore_step != FRESH_START:
            assert plan.restore_step in self.checkpoints, "restore from a missing checkpoint"
        for transfer in plan.transfers:
            source = self.instances[transfer.source]
            if (source.epoch, source.step) != point or transfer.layer not in source.layers:
                return self._fail(
                    plan, f"instance {transfer.source} holds no layer {transfer.layer}"
                )
        received = {i: {t.layer for t in plan.transfers if t.destination == i} for i in plan.world}
        for instance, slot in plan.slots.items():
            state = self.instances[instance]
            if slot is None:
                state.layers = frozenset()
                state.epoch, state.step = point
                self._report(plan, instance, "spare")
                continue
            needed = set(plan.layers_of(slot[1]))
            if plan.restore_step is None:
                own = state.layers if (state.epoch, state.step) == point else frozenset()
                if not needed <= own | received[instance]:
                    return self._fail(plan, f"plan leaves instance {instance} without layers")
                if needed - received[instance] - own:
                    self.stale_trained += 1
            state.layers = frozenset(needed)
            state.epoch, state.step = point
            self._report(plan, instance, "")
        self.phase = "training"

    def _train_one_step(self, plan: RuntimePlan) -> None:
        working = [i for i, s in plan.slots.items() if s is not None]
        step = self.instances[working[0]].step + 1
        if any(not self.instances[i].alive for i in working):
            return self._fail(plan, "connection closed by peer")
        if not all(self._heard(i) for i in working):
            return  # the step waits for the starved one
        if protocol.step_outcome(self.store, plan.generation, step) == protocol.ABORTED:
            asked = self.store.get(keys.checkpoint_request(plan.generation)) is not None
            if asked and step > plan.start_step:  # the step it ended at, as the engines write it
                self.checkpoints.add(step - 1)
                self.checkpoints_asked.append(step - 1)
                self.store.set(
                    keys.latest_checkpoint(),
                    json.dumps({"epoch": plan.epoch, "step": step - 1}).encode(),
                )
            for instance in plan.world:
                self._report(plan, instance, "fenced")
            self.phase = "ended"
            return
        if step >= plan.end_step:
            return
        for _ in working:
            protocol.vote_commit(self.store, plan.generation, step, len(working))
        if protocol.step_outcome(self.store, plan.generation, step) != protocol.COMMITTED:
            return
        for instance in working:
            self.instances[instance].step = step
            if step + 1 >= plan.end_step:
                self.store.set(keys.state(instance), b"done")
        self.store.set(keys.ledger_record(plan.epoch, step), b"{}")
        if (step + 1) % CHECKPOINT_EVERY == 0:
            self.checkpoints.add(step)
            self.store.set(
                keys.latest_checkpoint(), json.dumps({"epoch": plan.epoch, "step": step}).encode()
            )

    def tick(self) -> None:
        plan = protocol.current_plan(self.store)
        for instance in self.alive():
            state = self.instances[instance]
            if state.starved_ticks > 0:
                state.starved_ticks -= 1
                if state.starved_ticks == 0 and plan is not None and self.phase == "ended":
                    # Heard again: it reports how its generation ended, as an agent does.
                    protocol.report_failure(
                        self.store, plan.generation, instance, FailureReport("peer gone")
                    )
                    self._report(plan, instance, "failed")
                continue
            self.store.add(keys.heartbeat(instance), 1)
        if plan is None:
            return
        if plan.generation != self.generation:
            self.generation, self.phase = plan.generation, "arriving"
        if self.phase == "arriving":
            for instance in plan.world:
                state = self.instances[instance]
                if self._heard(instance) and state.arrived < plan.generation:
                    state.arrived = plan.generation
                    protocol.arrive(self.store, plan, instance)
            if self.store.get(keys.all_arrived(plan.generation)) is not None:
                self.phase, self._moving_for = "moving", 0
        if self.phase == "moving":
            if not protocol.receives_state(plan) or self._moving_for >= self.move_ticks:
                self._execute(plan)
            self._moving_for += 1
        elif self.phase == "training":
            self._train_one_step(plan)


@POLICIES.register("test-every-instance")
class EveryInstance(Policy):
    """Two-stage pipelines on every instance available (one stage when alone)."""

    name = "test-every-instance"

    def decide(self, observation: Observation) -> Decision:
        count = observation.num_available
        return Decision(Configuration(count // 2, 2) if count >= 2 else Configuration(1, 1))


def make_coordinator(
    store: MemoryStore,
    clock: ManualClock,
    steps: int,
    capacity: int = 6,
    initial: int = 4,
    wall_clock: Callable[[], float] = time.time,
    interval_s: float = 2.0,
    policy: str = "test-every-instance",
    costs: MigrationCostModel | None = None,
    notice_margin_s: float | None = 20.0,
) -> Coordinator:
    profile = tiny_gpt_profile()
    config = CoordinatorConfig(
        num_steps=steps,
        num_micro_batches=8,
        interval_s=interval_s,
        tick_s=TICK_S,
        heartbeat_timeout_s=6.0,
        initial_workers=initial,
        capacity=capacity,
        policy=policy,
        costs=costs or MigrationCostModel(),
        # The rules at a fixed margin (``--notice-margin 20``) but in auto's own tests.
        notice_margin_s=notice_margin_s,
    )
    return Coordinator(store, profile, config, clock, wall_clock=wall_clock)


def start(
    steps: int, instances: int, initial: int = 4
) -> tuple[MemoryStore, ManualClock, Coordinator, ModelAgents]:
    """A coordinator and ``instances`` model agents that have joined."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(store, clock, steps=steps, initial=initial)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    for instance in range(instances):
        agents.join(instance)
    return store, clock, coordinator, agents


def run(coordinator: Coordinator, agents: ModelAgents, clock: ManualClock, ticks: int) -> bool:
    """Tick both for at most ``ticks``; True once the job is done."""
    for _ in range(ticks):
        if not coordinator.tick():
            return True
        agents.tick()
        clock.advance(TICK_S)
    return False


def test_a_loss_without_notice_is_replanned_within_two_seconds_from_the_survivors():
    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 40)
    assert coordinator.committed > 10 and coordinator.plan.num_working == 4
    generation = coordinator.plan.generation
    victim = max(i for i, s in coordinator.plan.slots.items() if s is not None)
    agents.kill(victim)
    lost_at = clock.now_s()
    for _ in range(100):
        if coordinator.plan.generation != generation:
            break
        run(coordinator, agents, clock, 1)
    assert clock.now_s() - lost_at <= 2.0  # a data-path failure, not the 6-s heartbeat timeout
    assert victim not in coordinator.plan.slots
    committed = coordinator.committed
    run(coordinator, agents, clock, 20)
    assert coordinator.committed > committed and agents.stale_trained == 0


def test_on_demand_members_hold_every_stage_so_losing_all_spot_ones_needs_no_restore():
    """Agents 0 and 1 register as on-demand (the plain order puts both in stage 1): the
    plan spreads them over the two stages, so when both spot agents die together every layer
    still has a live holder and the job shrinks without a checkpoint restore."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(store, clock, steps=400)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    for instance in range(4):
        agents.join(instance, "on-demand" if instance in (0, 1) else "spot")
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    assert plan.num_working == 4 and coordinator.committed > 10
    assert {plan.slots[0][1], plan.slots[1][1]} == {0, 1}, plan.slots
    agents.kill(2)
    agents.kill(3)
    generation = plan.generation
    run(coordinator, agents, clock, 80)
    assert coordinator.plan.generation > generation
    assert {i for i, s in coordinator.plan.slots.items() if s is not None} == {0, 1}
    assert coordinator.plan.restore_step is None and coordinator.plan.kind != "checkpoint-restore"
    committed = coordinator.committed
    run(coordinator, agents, clock, 20)
    assert coordinator.committed > committed and agents.stale_trained == 0


@POLICIES.register("test-counting")
class Counting(EveryInstance):
    """Every instance, as ``test-every-instance``; counts the times it is asked."""

    name = "test-counting"
    asked = 0

    def decide(self, observation: Observation) -> Decision:
        Counting.asked += 1
        return super().decide(observation)


def test_instances_that_arrive_mid_interval_join_once_they_settled_in_one_move():
    """Intervals of a minute: two instances that register 0.2 s apart are trained on about a
    second later (0.5 s after the second), in one move, not at the next interval; the policy
    is asked once for them, not at every tick after."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(
        store, clock, steps=10_000, initial=2, interval_s=60.0, policy="test-counting"
    )
    agents = ModelAgents(store, coordinator.profile.num_layers)
    for instance in range(2):
        agents.join(instance)
    run(coordinator, agents, clock, 20)
    assert coordinator.plan.num_working == 2 and coordinator.committed > 5
    Counting.asked = 0
    agents.join(2)
    run(coordinator, agents, clock, 1)
    agents.join(3)
    run(coordinator, agents, clock, 2)
    assert coordinator.plan.num_working == 2 and Counting.asked == 0  # settling
    run(coordinator, agents, clock, 5)
    assert coordinator.plan.num_working == 4 and Counting.asked == 1, coordinator.status
    assert readers.events(store)[-1]["reason"] == "arrival"
    run(coordinator, agents, clock, 40)
    assert Counting.asked == 1 and len(readers.events(store)) == 2
    assert agents.stale_trained == 0


def test_an_arrival_during_a_move_waits_for_its_first_step_and_is_then_planned():
    """A move over a slow link takes many steps' time: instances that come while layers are
    on their way are planned on after the move's first step, not by superseding it (which
    stops the instances for the move and the next one)."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(store, clock, steps=10_000, initial=2, interval_s=60.0)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    for instance in range(2):
        agents.join(instance)
    run(coordinator, agents, clock, 20)
    assert coordinator.plan.num_working == 2 and coordinator.committed > 5
    agents.move_ticks = 25  # 5 s
    agents.join(2)
    agents.join(3)
    run(coordinator, agents, clock, 8)
    moving = coordinator.plan
    assert moving.num_working == 4 and moving.transfers, coordinator.status
    agents.join(4)
    agents.join(5)
    run(coordinator, agents, clock, 20)  # settled long ago; the move is not over
    assert coordinator.plan.generation == moving.generation
    assert coordinator.committed < moving.start_step
    run(coordinator, agents, clock, 15)
    assert coordinator.plan.num_working == 6, coordinator.status
    assert readers.events(store)[-1]["reason"] == "arrival"
    # The move was not given up: its first step committed before the plan for the newcomers.
    committed_in_move = protocol.last_committed(store, moving.generation, moving.start_step)
    assert committed_in_move >= moving.start_step
    assert agents.stale_trained == 0


def test_a_plan_that_never_ran_is_not_what_the_next_plan_starts_from():
    """A livelock this guards against: after a plan that never ran, the coordinator planned from it
    and asked instances that never received layers to send them, again and again."""
    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 60)
    assert coordinator.committed >= CHECKPOINT_EVERY
    # New instances join; before the plan that takes them in can meet, the old ones die.
    agents.join(4)
    agents.join(5)
    for _ in range(100):
        coordinator.tick()  # the agents do not see the plan before the old instances die
        clock.advance(TICK_S)
        if {4, 5} <= set(coordinator.plan.slots):
            break
        agents.tick()
    assert {4, 5} <= set(coordinator.plan.slots)
    for instance in range(4):
        agents.kill(instance)
    committed_before = coordinator.committed
    assert run(coordinator, agents, clock, 3000), coordinator.status
    assert agents.stale_trained == 0
    kinds = [event["kind"] for event in readers.events(store)]
    assert "checkpoint-restore" in kinds and committed_before >= 0


def test_two_failed_plans_in_a_row_restore_from_the_checkpoint():
    plan = RuntimePlan(
        5,
        0,
        30,
        100,
        2,
        1,
        [0, 4],
        {0: (0, 0), 1: (1, 0)},
        {0: "h", 1: "h"},
        [],
        "intra-stage",
        None,
    )
    started = RuntimePlan(
        3,
        0,
        10,
        100,
        2,
        1,
        [0, 4],
        {0: (0, 0), 1: (1, 0)},
        {0: "h", 1: "h"},
        [],
        "intra-stage",
        None,
    )
    holding = dict(layers=(0, 1, 2, 3), held_epoch=0, held_step=29, reported=5)
    members = {0: Member("h", 0.1, **holding), 1: Member("h", 0.1, **holding)}
    failures = {0: FailureReport("connection reset"), 1: FailureReport("connection reset")}
    config = CoordinatorConfig(num_steps=100, num_micro_batches=4)

    def choose(count: int, event: str, lost: tuple) -> Configuration:
        return Configuration(min(count, 2), 1)

    view = CoordinatorView(
        10.0,
        members,
        plan,
        started,
        29,
        all_arrived=True,
        failures=failures,
        failed_in_row=1,
        latest_checkpoint=24,
    )
    action = decide(view, config, choose)
    assert action.kind is ActionKind.REPLAN and not action.restore
    assert action.holdings == {0: (0, 1, 2, 3), 1: (0, 1, 2, 3)}
    view = CoordinatorView(
        10.0,
        members,
        plan,
        started,
        29,
        all_arrived=True,
        failures=failures,
        failed_in_row=2,
        latest_checkpoint=24,
    )
    action = decide(view, config, choose)
    assert action.kind is ActionKind.REPLAN and action.restore
    assert "restoring from step 24" in action.status


def test_holdings_of_another_step_or_epoch_are_not_current():
    plan = RuntimePlan(2, 1, 30, 100, 1, 1, [0, 4], {0: (0, 0)}, {0: "h"}, [], "none", None)
    members = {
        0: Member("h", 9.0),
        1: Member("h", 0.1, layers=(0, 1, 2, 3), held_epoch=0, held_step=40),
        2: Member("h", 0.1, layers=(0, 1), held_epoch=1, held_step=40),
        3: Member("h", 0.1, layers=(2, 3), held_epoch=1, held_step=41),
    }
    config = CoordinatorConfig(num_steps=100, num_micro_batches=4)
    view = CoordinatorView(10.0, members, plan, plan, 41, all_arrived=True)
    action = decide(view, config, lambda n, e, lost: Configuration(1, 1))
    assert action.kind is ActionKind.REPLAN and action.suspects == {0}
    assert action.workers == (1, 2, 3) and action.holdings == {3: (2, 3)}


def test_without_any_instance_the_job_waits_and_resumes_from_the_checkpoint():
    store, clock, coordinator, agents = start(steps=200, instances=2, initial=2)
    run(coordinator, agents, clock, 40)
    for instance in range(2):
        agents.kill(instance)
    run(coordinator, agents, clock, 60)
    assert "waiting for instances" in coordinator.status
    agents.join(7)
    assert run(coordinator, agents, clock, 3000), coordinator.status
    assert coordinator.plan.slots.keys() == {7} or 7 in coordinator.plan.slots
    assert agents.stale_trained == 0


def test_only_noticed_instances_train_until_one_without_a_notice_comes():
    """Instances that all have a notice train while they last, then hand over: waiting for one
    without a notice made `liveput train --workers 2 --steps 3` sit 130 s with nothing running."""
    store, clock, coordinator, agents = start(steps=400, instances=1, initial=1)
    agents.notice(0)
    run(coordinator, agents, clock, 40)
    assert coordinator.plan.generation == 0 and coordinator.plan.noticed == [0]
    assert coordinator.committed >= 10  # trained, and the notice did not make it replan
    agents.join(1)
    run(coordinator, agents, clock, 5)
    plan = coordinator.plan
    assert plan.generation == 1 and plan.noticed == []
    assert plan.slots[1] is not None and plan.slots[0] is None  # 0 only sends its layers
    assert plan.restore_step is None and {t.source for t in plan.transfers} == {0}
    committed = coordinator.committed
    agents.kill(0)
    run(coordinator, agents, clock, 30)
    assert coordinator.committed > committed + 10 and agents.stale_trained == 0


def test_a_noticed_instance_trains_until_the_margin_before_its_end_then_only_sends():
    """A noticed instance trains until ``notice_margin_s`` before its end: moving off it at its
    notice would give away the rest of its lead (two minutes on AWS) at every preemption."""
    store, clock, coordinator, agents = start(steps=2000, instances=4)
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    assert plan.num_working == 4
    victim = max(i for i, s in plan.slots.items() if s is not None)
    margin = coordinator.config.notice_margin_s
    agents.notice(victim, lead_s=margin + 10.0)
    noticed_at = clock.now_s()
    committed = coordinator.committed
    run(coordinator, agents, clock, int(9.0 / TICK_S))
    assert coordinator.plan.generation == plan.generation  # still training on it
    assert coordinator.committed > committed + 30
    while coordinator.plan.generation == plan.generation:
        run(coordinator, agents, clock, 1)
    moved_after_s = clock.now_s() - noticed_at
    assert 10.0 <= moved_after_s <= 10.0 + coordinator.config.notice_settle_s + 2 * TICK_S
    moved = coordinator.plan
    assert moved.slots.get(victim) is None and moved.restore_step is None
    assert 0 < moved.num_working <= 3
    run(coordinator, agents, clock, 20)
    committed = coordinator.committed
    agents.kill(victim)  # its end, as the notice said
    run(coordinator, agents, clock, 50)
    assert coordinator.plan.generation == moved.generation  # no loss: it was already out
    assert coordinator.committed > committed + 30 and agents.stale_trained == 0


def test_a_notice_without_a_lead_or_with_one_inside_the_margin_is_acted_on_at_once():
    config = CoordinatorConfig(num_steps=100, num_micro_batches=4, notice_margin_s=20.0)
    plan = RuntimePlan(
        2, 0, 30, 100, 2, 1, [0, 4], {0: (0, 0), 1: (1, 0)}, {0: "h", 1: "h"}, [], "none", None
    )
    holding = dict(layers=(0, 1, 2, 3), held_epoch=0, held_step=40)

    def action_for(**notice: float | None):
        members = {
            0: Member("h", 0.1, **holding),
            1: Member("h", 0.1, noticed=True, **holding, **notice),
        }
        view = CoordinatorView(10.0, members, plan, plan, 40, all_arrived=True)
        return decide(view, config, lambda n, e, lost: Configuration(min(n, 2), 1))

    for lead_s in (None, 0.0, 15.0, 20.0):
        action = action_for(notice_age_s=0.6, notice_lead_s=lead_s)
        assert action.kind is ActionKind.REPLAN, lead_s
        assert action.workers == (0,) and action.senders == (1,)
    # A 60-s lead: it trains for 40 s (and counts as available meanwhile), then goes.
    assert action_for(notice_age_s=39.0, notice_lead_s=60.0).kind is ActionKind.NONE
    assert action_for(notice_age_s=40.2, notice_lead_s=60.0).kind is ActionKind.WAIT  # gathering
    assert action_for(notice_age_s=40.6, notice_lead_s=60.0).senders == (1,)
    assert Member("h", 0.1, noticed=True, notice_age_s=5.0, notice_lead_s=60.0).going(20.0) is False
    assert Member("h", 0.1, noticed=False, notice_lead_s=60.0).going(0.0) is False


def test_waiting_says_when_the_instances_up_have_a_notice():
    config = CoordinatorConfig(
        num_steps=100, num_micro_batches=4, initial_workers=2, start_grace_s=20.0
    )
    view = CoordinatorView(5.0, {0: Member("h", 0.1, noticed=True)}, None, None, -1)
    action = decide(view, config, lambda n, e, lost: Configuration(1, 1))
    assert action.kind is ActionKind.WAIT
    assert action.status == (
        "waiting for instances: 0 of 2 up; 1 with a preemption notice, "
        "used from 20 s if no other comes"
    )
    view = CoordinatorView(21.0, {0: Member("h", 0.1, noticed=True)}, None, None, -1)
    action = decide(view, config, lambda n, e, lost: Configuration(1, 1))
    assert action.kind is ActionKind.REPLAN and action.noticed_workers == (0,)
    assert "with a preemption notice" in action.status


def test_the_first_plan_counts_noticed_instances_among_the_initial_ones_but_leaves_them_out():
    """With one of two initial instances noticed, the job starts on the other at once instead of
    waiting the whole start grace (20 s) for a second instance without a notice."""
    config = CoordinatorConfig(
        num_steps=100, num_micro_batches=4, initial_workers=2, start_grace_s=20.0
    )
    members = {0: Member("h", 0.1), 1: Member("h", 0.1, noticed=True)}
    action = decide(
        CoordinatorView(2.0, members, None, None, -1),
        config,
        lambda n, e, lost: Configuration(n, 1),
    )
    assert action.kind is ActionKind.REPLAN
    assert action.workers == (0,) and action.noticed_workers == ()
    alone = decide(
        CoordinatorView(2.0, {0: Member("h", 0.1)}, None, None, -1),
        config,
        lambda n, e, lost: Configuration(n, 1),
    )
    assert alone.kind is ActionKind.WAIT and alone.status == "waiting for instances: 1 of 2 up"


def test_the_first_plan_waits_for_no_more_instances_than_the_provisioning_holds():
    """A deadline policy holding one instance of the two the job may have: the first plan
    comes with that one, not after the whole start grace (it cost a deadline job 30 s)."""
    config = CoordinatorConfig(
        num_steps=100, num_micro_batches=4, initial_workers=2, start_grace_s=30.0
    )
    one = {0: Member("h", 0.1)}

    def first(held: int | None) -> Action:
        view = CoordinatorView(2.0, one, None, None, -1, instances_held=held)
        return decide(view, config, lambda n, e, lost: Configuration(n, 1))

    assert first(1).kind is ActionKind.REPLAN and first(1).workers == (0,)
    assert first(None).status == "waiting for instances: 1 of 2 up"
    assert first(2).status == "waiting for instances: 1 of 2 up"
    assert first(5).status == "waiting for instances: 1 of 2 up"  # never more than asked
    assert first(0).kind is ActionKind.REPLAN  # on-demand pending: the one up starts


EVENT = st.one_of(
    st.tuples(st.just("kill"), st.integers(0, 99)),
    st.tuples(st.just("notice"), st.integers(0, 99)),
    st.tuples(st.just("join"), st.just(0)),
    st.tuples(st.just("wait"), st.integers(1, 40)),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(EVENT, min_size=1, max_size=14), st.integers(2, 5))
def test_any_sequence_of_losses_and_arrivals_reaches_the_end(events, initial):
    """While one instance lives, every sequence reaches a plan that runs, and the job ends."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(store, clock, steps=60, initial=initial)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    next_id = 0
    for _ in range(initial):
        agents.join(next_id)
        next_id += 1
    done = run(coordinator, agents, clock, 10)
    for kind, value in events:
        if done:
            break
        if kind == "kill" and agents.alive():
            alive = agents.alive()
            agents.kill(alive[value % len(alive)])
        elif kind == "notice" and agents.alive():
            alive = agents.alive()
            agents.notice(alive[value % len(alive)])
        elif kind == "join":
            agents.join(next_id)
            next_id += 1
        else:
            done = run(coordinator, agents, clock, value)
    if not agents.alive():
        agents.join(next_id)
    done = done or run(coordinator, agents, clock, 4000)
    assert done, (coordinator.status, coordinator.committed)
    assert agents.stale_trained == 0


def test_a_policy_restart_is_carried_out_as_a_checkpoint_restore():
    """``reactive`` (the simulator's restart baseline) answers a loss with a restart: the
    runtime restores every layer from the checkpoint, where a policy that only picks a
    configuration gets the survivors' layers."""
    kinds = {}
    for policy in ("reactive", "test-every-instance"):
        store, clock = MemoryStore(), ManualClock()
        config = CoordinatorConfig(
            num_steps=400,
            num_micro_batches=8,
            interval_s=2.0,
            tick_s=TICK_S,
            heartbeat_timeout_s=6.0,
            initial_workers=4,
            capacity=6,
            policy=policy,
        )
        coordinator = Coordinator(store, tiny_gpt_profile(), config, clock)
        agents = ModelAgents(store, coordinator.profile.num_layers)
        for instance in range(4):
            agents.join(instance)
        run(coordinator, agents, clock, 40)
        assert coordinator.committed >= CHECKPOINT_EVERY
        generation = coordinator.plan.generation
        agents.kill(max(i for i, s in coordinator.plan.slots.items() if s is not None))
        for _ in range(100):
            if coordinator.plan.generation != generation:
                break
            run(coordinator, agents, clock, 1)
        kinds[policy] = (coordinator.plan.kind, coordinator.plan.restore_step)
        committed = coordinator.committed
        run(coordinator, agents, clock, 30)
        assert coordinator.committed > committed and agents.stale_trained == 0
    assert kinds["reactive"][0] == "checkpoint-restore" and kinds["reactive"][1] is not None
    assert kinds["test-every-instance"][1] is None


def test_a_noticed_newcomer_after_every_instance_is_lost_trains_while_it_lasts():
    """bench peers, seed 22: both instances lost, then one arrives whose notice is already inside
    the margin (12 s left); the peers trained on it, liveput did not."""
    store, clock, coordinator, agents = start(steps=2000, instances=2, initial=2)
    run(coordinator, agents, clock, 40)
    assert coordinator.plan.num_working == 2
    for instance in (0, 1):
        agents.kill(instance)
    run(coordinator, agents, clock, int(17.0 / TICK_S))
    generation, committed = coordinator.plan.generation, coordinator.committed
    agents.join(9)
    agents.notice(9, lead_s=12.0)
    run(coordinator, agents, clock, int(8.0 / TICK_S))
    assert coordinator.plan.generation > generation, coordinator.status
    assert coordinator.plan.slots.get(9) is not None and coordinator.plan.noticed == [9]
    assert coordinator.committed > committed + 10 and agents.stale_trained == 0


def test_the_first_plan_is_not_forecast_from_the_empty_intervals_before_instances_came():
    """test_runtime_netns once trained on one of its two hosts: with `--interval 1` the
    coordinator had recorded an interval with 0 instances before the agents registered, and the
    liveput policy, forecasting from that history ([0]), started on one instance of two."""
    store, clock = MemoryStore(), ManualClock()
    config = CoordinatorConfig(
        num_steps=100,
        num_micro_batches=8,
        interval_s=1.0,
        policy_interval_s=1.0,
        tick_s=TICK_S,
        heartbeat_timeout_s=6.0,
        initial_workers=2,
        capacity=2,
        policy="liveput",
    )
    coordinator = Coordinator(store, tiny_gpt_profile(), config, clock)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    run(coordinator, agents, clock, 2)  # an interval passes with nobody there yet
    assert coordinator.plan is None
    agents.join(0)
    agents.join(1)
    run(coordinator, agents, clock, 2)
    assert coordinator.plan is not None and coordinator.plan.num_working == 2
    run(coordinator, agents, clock, 8)
    assert (
        json.loads(store.get(keys.coordinator_history()))[0] == 2
    )  # counted from the first plan on


def test_an_instance_silent_past_the_end_its_notice_announced_is_gone_without_a_timeout():
    """bench peers, seed 22: the one instance left trained under a notice (rule 6) and was
    preempted as announced; with no peer to report it, the coordinator waited for the heartbeat
    timeout (60 s there) and the instance that came meanwhile, itself noticed, trained nothing."""
    store, clock, coordinator, agents = start(steps=4000, instances=1, initial=1)
    agents.notice(0, lead_s=8.0)
    run(coordinator, agents, clock, int(2.0 / TICK_S))
    assert coordinator.plan.noticed == [0]
    generation = coordinator.plan.generation
    run(coordinator, agents, clock, int(5.5 / TICK_S))
    # It trained until the checkpoint due 5 s before its end (Rule 9), then stopped.
    assert agents.checkpoints_asked == [coordinator.committed] and coordinator.committed > 5
    agents.kill(0)  # at its announced end
    # Silent past its end, well inside the heartbeat timeout (6 s here): gone.
    run(coordinator, agents, clock, int(2.5 / TICK_S))
    agents.join(1)
    agents.notice(1, lead_s=20.0)
    run(coordinator, agents, clock, int(2.0 / TICK_S))
    plan = coordinator.plan
    assert plan.generation > generation and plan.slots.get(1) is not None, coordinator.status
    assert plan.noticed == [1] and plan.slots.get(0) is None
    assert plan.restore_step == agents.checkpoints_asked[0]  # nothing redone
    # Silent before its end is not enough (a stopped process, a partition: the usual signals).
    agents.kill(1)
    run(coordinator, agents, clock, int(3.0 / TICK_S))
    assert coordinator.plan.generation == plan.generation and coordinator.status == "training 1x1"


def test_a_starved_last_holder_stays_in_the_plan_and_sends_its_layers():
    """Rule 8: one instance of a stage is killed and the other, starved, misses heartbeats
    past ``suspect_after_s`` (1.5 s) but not the timeout (6 s here). Left out, its stage's layers
    came from the checkpoint; kept, it sends them once it is heard again."""
    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    assert plan.num_working == 4 and plan.pipeline_stages == 2
    stage0 = sorted(i for i, s in plan.slots.items() if s is not None and s[1] == 0)
    killed, starved = stage0
    agents.kill(killed)
    agents.starve(starved, int(2.6 / TICK_S))
    committed = coordinator.committed
    for _ in range(int(5.0 / TICK_S)):
        if coordinator.plan.generation != plan.generation:
            break
        run(coordinator, agents, clock, 1)
    replanned = coordinator.plan
    assert replanned.generation > plan.generation, coordinator.status
    assert starved in replanned.slots and killed not in replanned.slots
    assert replanned.restore_step is None and replanned.kind != "checkpoint-restore"
    assert "checkpoint-restore" not in [event["kind"] for event in readers.events(store)]
    run(coordinator, agents, clock, 30)
    assert coordinator.committed > committed + 5 and agents.stale_trained == 0


def test_a_silent_last_holder_is_not_suspect_until_its_heartbeat_times_out():
    """Rule 8 on a view: instance 1, silent 2 s (past ``suspect_after_s``, inside the 3-s
    timeout), is the only current holder of layers 0 and 1; 2 and 3 hold 2 and 3 and report
    the failure. It stays a worker of the replan with its layers; at 3.1 s it is dead."""
    plan = RuntimePlan(
        4,
        0,
        30,
        100,
        2,
        2,
        [0, 2, 4],
        {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1)},
        dict.fromkeys(range(4), "h"),
        [],
        "none",
        None,
    )
    held = dict(held_epoch=0, held_step=41)
    members = {
        0: Member("h", 9.0, layers=(0, 1), **held),
        1: Member("h", 2.0, layers=(0, 1), **held),
        2: Member("h", 0.1, layers=(2, 3), reported=4, **held),
        3: Member("h", 0.1, layers=(2, 3), reported=4, **held),
    }
    failures = {2: FailureReport("connection reset"), 3: FailureReport("connection reset")}
    config = CoordinatorConfig(num_steps=100, num_micro_batches=4)

    def view(members, failure_age_s):
        return CoordinatorView(
            10.0,
            members,
            plan,
            plan,
            41,
            all_arrived=True,
            failures=failures,
            failure_age_s=failure_age_s,
            latest_checkpoint=39,
        )

    def choose(count, event, lost):
        return Configuration(1, min(count, 2))

    action = decide(view(members, 2.0), config, choose)
    assert action.kind is ActionKind.WAIT  # every member accounted for, or failure_wait_s
    action = decide(view(members, 3.5), config, choose)
    assert action.kind is ActionKind.REPLAN and action.suspects == {0}
    assert action.workers == (1, 2, 3) and not action.restore
    assert action.holdings == {1: (0, 1), 2: (2, 3), 3: (2, 3)}
    # Another heard instance holds them too: the silent one is not needed, and is left out.
    heard = {**members, 4: Member("h", 0.1, layers=(0, 1), **held)}
    action = decide(view(heard, 3.5), config, choose)
    assert action.suspects == {0, 1} and 1 not in action.workers
    # Its heartbeat timed out: dead like any other.
    timed_out = {**members, 1: Member("h", 3.1, layers=(0, 1), **held)}
    action = decide(view(timed_out, 3.5), config, choose)
    assert action.suspects == {0, 1} and action.holdings == {2: (2, 3), 3: (2, 3)}


def test_a_recovered_coordinator_plans_from_the_instances_heard_after_it_started():
    """Everything died, and the dead agents' registrations, heartbeats and holdings are still in
    the store (nothing forgot them); the dead generation is fenced, as ``resume`` does, and a new
    coordinator and new agents carry on. It planned from the dead ones' holdings first (their
    heartbeats looked fresh for a heartbeat timeout), that plan failed, and the restore came
    6 s later: the first step 7.4 s after the restart. Now the first plan restores on the new
    agents and the first step comes at once (1.4 s)."""
    from liveput.operate.runner import end_dead_generation

    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 60)
    generation, committed = coordinator.plan.generation, coordinator.committed
    assert committed >= CHECKPOINT_EVERY
    for instance in range(4):
        agents.kill(instance)
    end_dead_generation(store)
    clock = ManualClock()
    recovered = make_coordinator(store, clock, steps=400)
    assert recovered.plan.generation == generation
    for instance in range(4, 8):
        agents.join(instance)
    while recovered.committed <= committed or recovered.plan.generation == generation:
        assert clock.now_s() < 3.0, (recovered.status, recovered.plan.generation)
        run(recovered, agents, clock, 1)
    plan = recovered.plan
    assert plan.generation == generation + 1 and set(plan.slots) == {4, 5, 6, 7}
    assert plan.kind == "checkpoint-restore" and plan.restore_step is not None
    assert agents.stale_trained == 0


def test_a_restarted_coordinator_whose_agents_live_goes_on_without_a_new_plan():
    """The agents beat within a tick of the restart: heard, they keep the plan they train in."""
    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 40)
    plan, committed = coordinator.plan, coordinator.committed
    recovered = make_coordinator(store, clock, steps=400)
    run(recovered, agents, clock, 30)
    assert recovered.plan.generation == plan.generation, recovered.status
    assert recovered.committed > committed + 10 and agents.stale_trained == 0


def test_the_first_plan_waits_for_the_rest_only_while_instances_keep_registering():
    """Two of eight initial instances were preempted while they booted (the p3 cut): the job
    waited the whole start grace for them. It starts once none has registered for
    ``start_settle_s``; one that comes later joins as an arrival."""
    config = CoordinatorConfig(
        num_steps=100, num_micro_batches=4, initial_workers=8, start_grace_s=30.0
    )
    six = {i: Member("h", 0.1) for i in range(6)}

    def first(registration_age_s: float) -> Action:
        view = CoordinatorView(12.0, six, None, None, -1, registration_age_s=registration_age_s)
        return decide(view, config, lambda n, e, lost: Configuration(1, 4) if n >= 4 else None)

    assert first(1.0).status == "waiting for instances: 6 of 8 up"
    started = first(config.start_settle_s)
    assert started.kind is ActionKind.REPLAN and started.workers == tuple(range(6))
    assert started.target == Configuration(1, 4)
    three = {i: Member("h", 0.1) for i in range(3)}
    view = CoordinatorView(12.0, three, None, None, -1, registration_age_s=60.0)
    action = decide(view, config, lambda n, e, lost: Configuration(1, 4) if n >= 4 else None)
    assert action.kind is ActionKind.WAIT and "no configuration runs on 3" in action.status


def test_an_auto_margin_is_twice_the_predicted_move_then_twice_the_measured_one():
    """``--notice-margin auto``: the job moves off a noticed instance twice the predicted move
    before its end (the fixed 20 s gave away two thirds of this 30-s lead, for a move of about
    1.6 s), the plan tells its agents that margin, and once a move between instances is
    measured (publication to first step), the margin is twice that one."""
    store, clock = MemoryStore(), ManualClock()
    coordinator = make_coordinator(store, clock, steps=4000, initial=3, notice_margin_s=None)
    agents = ModelAgents(store, coordinator.profile.num_layers)
    for instance in range(3):
        agents.join(instance)
    run(coordinator, agents, clock, 40)
    plan = coordinator.plan
    assert plan.num_working == 2 and len(plan.world) == 3  # 1x2 and a spare
    assert coordinator.observer.measured_move_s is None
    predicted_s = coordinator.observer.auto_notice_margin_s(plan)
    costs = coordinator.config.costs
    assert predicted_s == pytest.approx(max(2.0, 2 * costs.rebuild_s(3)), rel=0.05)
    victim = max(i for i, s in plan.slots.items() if s is not None)
    agents.notice(victim, lead_s=30.0)
    noticed_at = clock.now_s()
    while coordinator.plan.generation == plan.generation:
        run(coordinator, agents, clock, 1)
    moved_after_s = clock.now_s() - noticed_at
    settle_s = coordinator.config.notice_settle_s + 2 * TICK_S
    assert 30.0 - predicted_s <= moved_after_s <= 30.0 - predicted_s + settle_s
    moved = coordinator.plan
    assert moved.notice_margin_s == pytest.approx(predicted_s)
    assert moved.slots.get(victim) is None and {t.source for t in moved.transfers} == {victim}
    started = coordinator.committed
    while coordinator.committed <= started + 1:
        run(coordinator, agents, clock, 1)
    measured_s = coordinator.observer.measured_move_s
    assert measured_s is not None and measured_s > 0
    assert coordinator.observer.auto_notice_margin_s(moved) == pytest.approx(
        max(2.0, 2 * measured_s)
    )
    # The choice, its prediction and its measure are the plan's event (status, summary).
    event = json.loads(store.get(keys.event(moved.generation)))
    assert event["notice"] == {
        "choice": "move",
        "senders": [victim],
        "notice_margin_s": pytest.approx(predicted_s, abs=1e-3),
        "predicted_s": pytest.approx(predicted_s / 2, abs=1e-3),
        "measured_s": pytest.approx(measured_s, abs=1e-3),
    }
    assert json.loads(store.get(keys.event(plan.generation)))["notice"] is None


def test_an_auto_margin_takes_the_measured_move_over_the_predicted_and_a_floor():
    from liveput.runtime.decide import auto_notice_margin_s, notice_margin_s

    auto = CoordinatorConfig(num_steps=10, num_micro_batches=2)
    assert auto.notice_margin_s is None
    assert auto_notice_margin_s(auto, None, 7.0) == 14.0
    assert auto_notice_margin_s(auto, 3.0, 7.0) == 6.0  # measured, whatever was predicted
    assert auto_notice_margin_s(auto, 0.2, 7.0) == 2.0  # the floor
    view = CoordinatorView(1.0, {}, None, None, -1, auto_notice_margin_s=9.0)
    assert notice_margin_s(view, auto) == 9.0
    fixed = CoordinatorConfig(num_steps=10, num_micro_batches=2, notice_margin_s=5.0)
    assert notice_margin_s(view, fixed) == 5.0


def test_the_rules_run_once_a_tick_and_the_policy_only_when_they_want_a_configuration(
    monkeypatch,
):
    """The loop decides once a tick; the policy step completes that action (no rehearsal of
    the rules with a dummy policy, then the rules again): a start, a loss and intervals."""
    from liveput.runtime.coordinator import loop as loop_module
    from liveput.runtime.coordinator import policy as policy_module

    calls = {"rules": 0}
    real = loop_module.decide

    def counted(*args, **kwargs):
        calls["rules"] += 1
        return real(*args, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("the policy step ran the rules again")

    monkeypatch.setattr(loop_module, "decide", counted)
    monkeypatch.setattr(policy_module, "decide", refused)
    store, clock, coordinator, agents = start(steps=400, instances=4)
    ticks = 0
    for _ in range(60):
        before = calls["rules"]
        coordinator.tick()
        ticks += 1
        assert calls["rules"] == before + 1
        agents.tick()
        clock.advance(TICK_S)
    started = coordinator.plan.generation
    agents.kill(max(i for i, s in coordinator.plan.slots.items() if s is not None))
    run(coordinator, agents, clock, 40)
    assert coordinator.plan.generation > started  # the loss was replanned, the policy asked
    assert coordinator.committed > 10 and agents.stale_trained == 0


def test_the_one_loop_ends_on_the_jobs_failure_and_on_its_upkeeps_error():
    """``Coordinator.run`` is every coordinator's loop (``liveput train``'s runs its upkeep
    after each tick): the job's own failure ends it (it went on warning once a tick, as for a
    store restarting), as does an error of the upkeep; a store error is observed again."""
    store, clock, coordinator, agents = start(steps=400, instances=4)
    run(coordinator, agents, clock, 20)
    ticks: list[float] = []

    def upkeep(seen: Coordinator) -> None:
        assert seen is coordinator
        ticks.append(clock.now_s())
        agents.tick()
        if len(ticks) == 5:
            protocol.fail_job(store, protocol.JobFailure("layer 0 raised in forward: boom"))

    with pytest.raises(protocol.JobFailure, match="boom"):
        coordinator.run(upkeep)
    assert len(ticks) == 5

    store, clock, coordinator, agents = start(steps=400, instances=4)

    def too_long(seen: Coordinator) -> None:
        agents.tick()
        if clock.now_s() > 3.0:
            raise LiveputError("train: not done after 3 s")

    with pytest.raises(LiveputError, match="not done after 3 s"):
        coordinator.run(too_long)
