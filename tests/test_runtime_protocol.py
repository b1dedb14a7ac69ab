"""Commit protocol, plans, ledger, job validation and agent states, on the in-memory store."""

from __future__ import annotations

import dataclasses
import time

import pytest

import liveput
from liveput.models.job import replica_micro_batches
from liveput.models.jobs import resolve_job
from liveput.perf.configuration import Configuration
from liveput.perf.costs import MigrationCostModel
from liveput.plan.migration import Assignment, Slot, plan_migration
from liveput.runtime import keys, protocol
from liveput.runtime.agent import Agent, AgentConfig, AgentState
from liveput.runtime.clock import ManualClock
from liveput.runtime.engine import Ending, Engine, EngineConfig
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.notices import Notice
from liveput.runtime.planning import PlanContext, profile_job, to_runtime_plan
from liveput.runtime.store import MemoryStore


def test_a_fenced_step_never_commits_and_a_committed_step_is_never_fenced():
    store = MemoryStore()
    protocol.vote_commit(store, 0, 5, 3)
    protocol.vote_commit(store, 0, 5, 3)
    assert protocol.fence(store, 0, 5, 3) == 5
    protocol.vote_commit(store, 0, 5, 3)  # the late vote cannot complete it
    assert protocol.step_outcome(store, 0, 5) == protocol.ABORTED
    for _ in range(3):
        protocol.vote_commit(store, 1, 7, 3)
    assert protocol.step_outcome(store, 1, 7) == protocol.COMMITTED
    assert protocol.fence(store, 1, 7, 3) == 8  # the fence moves past the committed step
    assert protocol.last_committed(store, 1, 7) == 7


def test_the_fence_decides_a_vote_whose_writer_died_before_marking_it():
    store = MemoryStore()
    for _ in range(2):
        store.add(keys.commit(0, 3), 1)  # all voted, nobody wrote the outcome
    assert protocol.fence(store, 0, 3, 2) == 4
    assert protocol.step_outcome(store, 0, 3) == protocol.COMMITTED


def test_plan_survives_the_store_as_json():
    plan = protocol.RuntimePlan(
        3,
        1,
        10,
        50,
        2,
        2,
        [0, 2, 4],
        {0: (0, 0), 1: (0, 1), 5: None},
        {0: "10.0.0.1", 1: "10.0.0.2", 5: "10.0.0.6"},
        [protocol.Transfer(2, 5, 1)],
        "inter-stage",
        None,
    )
    again = protocol.RuntimePlan.from_json(plan.to_json())
    assert again == plan
    assert again.world == [0, 1, 5] and again.rank_of(5) == 2 and again.num_working == 2


def test_the_last_instance_to_arrive_opens_the_plan_and_a_newer_plan_frees_the_waiters():
    store = MemoryStore()
    plan = protocol.RuntimePlan(
        4,
        0,
        10,
        50,
        1,
        3,
        [0, 1, 2, 4],
        {0: (0, 0), 3: (0, 1), 7: (0, 2)},
        dict.fromkeys((0, 3, 7), "127.0.0.1"),
        [],
        "intra-stage",
        None,
    )
    assert [protocol.arrive(store, plan) for _ in range(2)] == [False, False]
    assert store.get(keys.all_arrived(4)) is None
    assert protocol.arrive(store, plan) is True
    assert store.get(keys.all_arrived(4)) == b"1"
    # Instance 7 died after the plan was made: the two others wait for it, until plan 5 is out.
    waiting = dataclasses.replace(plan, generation=5)
    engine = Engine(
        resolve_job("tiny-gpt-small"),
        0,
        store,
        rendezvous=None,
        checkpointer=None,
        config=EngineConfig(comm_timeout_s=60.0),
    )
    protocol.arrive(store, waiting)  # instance 3
    store.set(keys.current_plan(), b"6")
    started = time.monotonic()
    result = engine.run_generation(waiting)
    assert result.ending is Ending.FAILED
    assert time.monotonic() - started < 10.0  # not the 60-s communication timeout
    assert "superseded" in protocol.failures(store, 5)[0].reason
    assert store.get(keys.all_arrived(5)) is None
    assert protocol.arrivals(store, 5) == {0}


@pytest.fixture(scope="module")
def small_profile():
    return profile_job(resolve_job("tiny-gpt-small"), repeats=1)


def test_a_noticed_instance_sends_its_layers_instead_of_a_checkpoint_restore(small_profile):
    running = Assignment({0: Slot(0, 0), 1: Slot(0, 1)}, 2)
    migration = plan_migration(
        small_profile, MigrationCostModel(), running, {1}, [2], Configuration(1, 2)
    )
    assert migration.kind == "checkpoint-restore"  # the planner counts noticed instances as gone
    context = PlanContext(4, 0, 30, 100, {}, latest_checkpoint=20, stages_before=2)
    proactive = to_runtime_plan(small_profile, migration, context, {2: [1], 3: [1]})
    assert proactive.kind == "inter-stage" and proactive.restore_step is None
    assert {t.source for t in proactive.transfers} == {1} and proactive.slots[1] is None
    reactive = to_runtime_plan(small_profile, migration, context)
    assert reactive.kind == "checkpoint-restore" and reactive.restore_step == 20
    assert reactive.start_step == 21 and reactive.epoch == 1 and reactive.transfers == []


def _record(store, epoch: int, step: int, batch: int = 8, first: int | None = None) -> None:
    protocol.record_step(
        store,
        epoch,
        protocol.LedgerRecord(
            step, 0, step * batch if first is None else first, batch, 1.0, 1, 1, 0.0
        ),
    )


def test_the_ledger_proves_exactly_once_across_a_restore_and_catches_mistakes():
    store = MemoryStore()
    for step in range(6):
        _record(store, 0, step)
    protocol.record_restore(store, 1, committed=5, restored_to=3)
    for step in range(4, 8):
        _record(store, 1, step)
    report = verify_ledger(store, 8, 8)
    assert report.exactly_once and report.steps_rolled_back == 2 and report.restores == 1
    assert [r["step"] for r in report.records] == list(range(8))
    assert not verify_ledger(store, 8, 9).exactly_once  # step 8 never applied
    _record(store, 1, 9, first=0)  # a gap, and samples of another step
    problems = verify_ledger(store, 8, 10).problems
    assert any("do not follow" in p for p in problems)
    assert any("samples of another step" in p for p in problems)


def test_job_is_validated_with_one_line_errors():
    job = resolve_job("tiny-gpt-small")
    with pytest.raises(liveput.LiveputError, match="multiple of micro_batch_size"):
        liveput.Job(
            layers=job.layers,
            dataset=job.dataset,
            loss_fn=job.loss_fn,
            optimizer=job.optimizer,
            global_batch_size=10,
            micro_batch_size=4,
        )
    with pytest.raises(liveput.LiveputError, match="non-empty sequence"):
        liveput.Job(
            layers=[],
            dataset=job.dataset,
            loss_fn=job.loss_fn,
            optimizer=job.optimizer,
            global_batch_size=8,
        )
    with pytest.raises(liveput.LiveputError, match="unknown job"):
        resolve_job("no-such-model")
    # Every micro-batch of a step goes to exactly one pipeline, whatever D.
    for d in range(1, 5):
        ranges = [replica_micro_batches(4, d, p) for p in range(d)]
        assert sorted(j for r in ranges for j in r) == [0, 1, 2, 3]
    ids = [list(job.sample_ids(3, j)) for j in range(job.num_micro_batches)]
    assert sum(ids, []) == list(range(24, 32))


def plan(generation: int, instances: list[int]) -> protocol.RuntimePlan:
    """Generation ``generation``'s plan: ``instances`` as one pipeline of one stage each."""
    return protocol.RuntimePlan(
        generation,
        0,
        10 * generation,
        100,
        len(instances),
        1,
        [0, 4],
        {i: (n, 0) for n, i in enumerate(instances)},
        dict.fromkeys(instances, "h"),
    )


class Plans(ManualClock):
    """An agent's clock that publishes ``plans[n]`` at its n-th poll (0.1 s each)."""

    def __init__(self, store: MemoryStore, plans: dict[int, protocol.RuntimePlan]) -> None:
        super().__init__()
        self.store, self.plans, self.polls = store, plans, 0

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.polls += 1
        if self.polls in self.plans:
            protocol.publish_plan(self.store, self.plans[self.polls])


def test_a_noticed_agent_leaves_only_when_a_plan_made_after_it_joined_leaves_it_out():
    """An instance that joined with a notice while an older plan was in force saw that
    plan, which could not name it, and left at once: its lead was never used (bench peers'
    seed-20 trace trained nothing for 54 s)."""
    # The notice's lead (10 s) is inside the margin (20 s): the agent is going.
    for later, expected in ((plan(4, [0, 1, 7]), 4), (plan(4, [0, 1]), None)):
        store = MemoryStore()
        protocol.publish_plan(store, plan(3, [0, 1]))
        clock = Plans(store, {3: later})
        agent = Agent(
            AgentConfig(instance=7),
            store,
            engine=None,  # type: ignore[arg-type]
            clock=clock,
        )
        agent._on_notice(Notice("emulator", "terminate", 10.0))
        agent.join()
        try:
            assert agent.joined_under == 3
            found = agent._next_plan(-1)
        finally:
            agent._stop.set()  # ends its heartbeat thread
        assert (None if found is None else found.generation) == expected
        assert clock.polls == 3  # it waited for the plan made after it joined


def test_a_going_agent_whose_generation_was_fenced_waits_for_the_plan_after():
    """The coordinator fences the step in flight, then publishes the next plan. A going agent
    (its notice's lead inside the margin) that saw the fence of the plan it ran left before that
    plan, which kept it (every instance noticed, no other up): the plan waited for it in vain
    and the restore after went back to the initial weights (8 of 46 steps redone)."""
    for later, expected in ((plan(4, [0, 7]), 4), (plan(4, [0]), None)):
        store = MemoryStore()
        clock = Plans(store, {3: later})
        agent = Agent(AgentConfig(instance=7), store, engine=None, clock=clock)  # type: ignore[arg-type]
        agent.join()  # before any plan: the job starts on it
        protocol.publish_plan(store, plan(3, [0, 7]))
        agent._on_notice(Notice("emulator", "terminate", 10.0))
        try:
            assert agent.going() and agent.joined_under == -1
            found = agent._next_plan(3)  # it ran generation 3, whose step was fenced
        finally:
            agent._stop.set()  # ends its heartbeat thread
        assert (None if found is None else found.generation) == expected
        assert clock.polls == 3  # it waited for the plan after


def test_agent_refuses_an_undocumented_state_transition():
    store = MemoryStore()
    agent = Agent(AgentConfig(instance=0), store, engine=None)  # type: ignore[arg-type]
    with pytest.raises(liveput.LiveputError, match="no transition joining -> training"):
        agent._move(AgentState.TRAINING)
    agent._move(AgentState.WAITING)
    assert store.get(keys.state(0)) == b"waiting"


def test_agent_waits_through_a_store_outage_then_gives_up_with_an_error():

    class Outage(MemoryStore):
        """A store that is down from ``down_at`` reads on, and back up from ``up_at`` on."""

        def __init__(self, down_at: int, up_at: int | None) -> None:
            super().__init__()
            self.reads, self.down_at, self.up_at = 0, down_at, up_at

        def get(self, key: str) -> bytes | None:
            self.reads += 1
            if self.reads >= self.down_at and (self.up_at is None or self.reads < self.up_at):
                raise liveput.LiveputError("store tcp://10.0.0.1:29400 failed: Broken pipe")
            return super().get(key)

    config = AgentConfig(instance=0, poll_s=1.0, store_outage_s=60.0)
    # Down for 50 s (an etcd restart), then the job is done: the agent waited it out.
    store = Outage(down_at=1, up_at=51)
    store.set(keys.job_done(), b"19")
    agent = Agent(config, store, engine=None, clock=ManualClock())  # type: ignore[arg-type]
    assert agent._next_plan(-1) is None
    # Gone for good (the embedded store's coordinator ended): one error after 60 s, not a hang.
    clock = ManualClock()
    agent = Agent(
        config,
        Outage(down_at=1, up_at=None),
        engine=None,  # type: ignore[arg-type]
        clock=clock,
    )
    with pytest.raises(liveput.LiveputError, match="unreachable for 61 s; is the coordinator gone"):
        agent._next_plan(-1)
    assert clock.now_s() == pytest.approx(61.0)


def test_a_done_agent_whose_store_already_ended_finishes_without_an_error():
    class Ended(MemoryStore):
        """The embedded store after its coordinator exited: every write fails."""

        def set(self, key: str, value: bytes) -> None:
            raise liveput.LiveputError("store tcp://10.77.0.1:29400 failed: Connection reset")

    agent = Agent(AgentConfig(instance=2), Ended(), engine=None)  # type: ignore[arg-type]
    agent.state = AgentState.TRAINING
    # Before: the failed write of the final state escaped and the agent exited with code 2.
    assert agent._finish(job_done=True) is AgentState.DONE
    assert agent.state is AgentState.DONE


def test_the_coordinator_stays_until_a_waiting_spare_has_seen_the_job_end(small_profile):
    from liveput.runtime.coordinator import Coordinator, CoordinatorConfig

    class SpareClock(ManualClock):
        """The spare (instance 3) reads ``job/done`` after the coordinator's third look."""

        def __init__(self, store: MemoryStore) -> None:
            super().__init__()
            self.store, self.sleeps = store, 0

        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            self.sleeps += 1
            self.store.add(keys.heartbeat(3), 1)
            if self.sleeps == 3:
                self.store.set(keys.state(3), b"done")

    store = MemoryStore()
    clock = SpareClock(store)
    config = CoordinatorConfig(
        num_steps=4,
        num_micro_batches=4,
        capacity=4,
        tick_s=0.2,
        heartbeat_timeout_s=3.0,
        finish_wait_s=10.0,
    )
    coordinator = Coordinator(store, small_profile, config, clock=clock)
    for instance, state in ((1, b"done"), (3, b"waiting"), (5, b"training")):
        store.add(keys.heartbeat(instance), 1)
        store.set(keys.state(instance), state)
    assert coordinator.unfinished() == [3, 5]
    clock.advance(3.5)  # instance 5 falls silent: dead, not waited for
    store.add(keys.heartbeat(3), 1)
    store.set(keys.job_done(), b"3")
    assert coordinator.see_off() == []
    assert clock.sleeps == 3 and clock.now_s() == pytest.approx(3.5 + 0.6)
    # A spare that never answers is waited for finish_wait_s, then named.
    store.set(keys.state(3), b"waiting")
    start_s = clock.now_s()
    assert coordinator.see_off() == [3]
    assert clock.now_s() - start_s == pytest.approx(10.0, abs=0.25)


def test_train_cli_rejects_bad_input_in_one_line(capsys):
    from liveput.cli.main import main

    assert main(["train", "--time-scale", "0", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: train: --time-scale")


def test_a_restarted_coordinator_waits_out_a_store_outage_and_reuses_the_jobs_profile():
    from liveput.runtime import launch

    class Restarting(MemoryStore):
        """Down for its first ``down_calls`` calls (an etcd restarting), then up."""

        def __init__(self, down_calls: int) -> None:
            super().__init__()
            self.calls, self.down_calls = 0, down_calls

        def get(self, key: str) -> bytes | None:
            self.calls += 1
            if self.calls <= self.down_calls:
                raise liveput.LiveputError(
                    "store etcd://10.0.0.1:2379 unreachable: ConnectionFailedError"
                )
            return super().get(key)

    store = Restarting(down_calls=3)
    profile = launch.through_outage(
        lambda: launch.job_profile(store, "tiny-gpt-small"), 5.0, retry_s=0.01
    )
    assert store.calls == 4 and store.get(keys.job_profile()) is not None
    # A restarted coordinator takes the kept profile (a new measurement would differ in its
    # timings): the same plans, and no profiling again.
    assert launch.job_profile(store, "tiny-gpt-small") == profile
    assert launch.job_profile(store, "tiny-gpt") != profile  # another job is profiled anew
    with pytest.raises(liveput.LiveputError, match="unreachable"):
        launch.through_outage(lambda: Restarting(10**6).get(keys.job_spec()), 0.05, retry_s=0.01)


def test_a_noticed_agent_left_out_before_its_margin_stays_and_leaves_at_it():
    """bench peers, p3 cut: the policy ran 1x1 of two instances; the spare, noticed 60 s before
    its end, left at once and the job had nothing left to train on for the last 30 s."""
    for plans, expected, polls in (
        # Left out at 0.3 s, planned again at 2 s, 58 s before its end: it is there.
        ({3: plan(4, [0]), 20: plan(5, [0, 7])}, 5, 20),
        # Left out, and nothing for it until 20 s before its end (40 s): it leaves then.
        ({3: plan(4, [0])}, None, 400),
    ):
        store = MemoryStore()
        clock = Plans(store, plans)
        agent = Agent(
            AgentConfig(instance=7, notice_margin_s=20.0), store, engine=None, clock=clock
        )  # type: ignore[arg-type]
        agent.join()
        agent._on_notice(Notice("emulator", "terminate", 60.0))
        try:
            found = agent._next_plan(-1)
        finally:
            agent._stop.set()
        assert (None if found is None else found.generation) == expected
        assert abs(clock.polls - polls) <= 1, clock.polls


def test_an_idle_agent_warms_up_once_a_plan_without_it_trains_with_a_notice():
    """The first optimizer a process builds imports torch._dynamo (seconds of CPU): an instance
    that did so only once planned kept the plan waiting, and a noticed sender it received from
    was preempted mid-move (bench peers, pipeline quick run: 18 steps lost). It warms up while
    idle once a move is coming (a member of the running plan has a notice), not before the
    plan's first step nor without a notice."""
    from liveput.models.jobs import resolve_job
    from liveput.runtime.engine import Engine

    store = MemoryStore()
    engine = Engine(resolve_job("tiny-gpt-small"), 7, store, lambda plan, rank: None, None)
    seen: dict[str, bool] = {}

    class Steps(ManualClock):
        polls = 0

        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            self.polls += 1
            if self.polls == 1:  # plan 0 runs without instance 7; instance 0 has a notice
                store.set(keys.notice(0), b"{}")
            if self.polls == 12:  # it looked once since (a look a second), no step committed
                seen["before_a_step"] = engine.warm
                for _ in range(2):
                    protocol.vote_commit(store, 0, 0, 2)
            if self.polls == 25:
                protocol.publish_plan(store, plan(1, [0, 7]))

    agent = Agent(AgentConfig(instance=7), store, engine, clock=Steps())
    agent.join()
    protocol.publish_plan(store, plan(0, [0, 1]))
    try:
        found = agent._next_plan(-1)
    finally:
        agent._stop.set()
    assert found is not None and found.generation == 1
    assert seen == {"before_a_step": False}
    assert engine.warm


def test_an_idle_agent_does_not_warm_up_while_no_member_of_the_plan_has_a_notice():
    from liveput.models.jobs import resolve_job
    from liveput.runtime.engine import Engine

    store = MemoryStore()
    engine = Engine(resolve_job("tiny-gpt-small"), 7, store, lambda plan, rank: None, None)
    protocol.publish_plan(store, plan(0, [0, 1]))
    for _ in range(2):
        protocol.vote_commit(store, 0, 0, 2)
    store.set(keys.notice(7), b"{}")  # its own notice: no member of the plan is going
    agent = Agent(AgentConfig(instance=7), store, engine, clock=Plans(store, {25: plan(1, [0, 7])}))
    agent.joined_under = -1
    try:
        found = agent._next_plan(0)
    finally:
        agent._stop.set()
    assert found is not None and found.generation == 1
    assert not engine.warm
