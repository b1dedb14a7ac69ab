"""An instance whose agent process died and was started again (a resumed job's provider starts
one for every instance it still rents): the new process holds nothing, whatever the dead one
reported, so the coordinator plans no layer from it, and it runs no plan made for the dead one."""

from __future__ import annotations

import json
from types import SimpleNamespace

from liveput.runtime import keys, protocol
from liveput.runtime.agent import Agent, AgentConfig, AgentState
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator.observe import JobProgress, Observer
from liveput.runtime.decide import CoordinatorConfig
from liveput.runtime.generation import Ending, GenerationResult
from liveput.runtime.notices import Notice
from liveput.runtime.store import MemoryStore


def test_a_joining_process_replaces_what_its_dead_predecessor_left() -> None:
    store = MemoryStore()
    store.set(keys.member(4), json.dumps({"host": "127.0.0.1"}).encode())
    store.add(keys.heartbeat(4), 1)
    dead = protocol.Holding(generation=3, epoch=0, step=7, layers=(0, 1, 2), ending="stopped")
    protocol.report_holding(store, 4, dead)
    # It had a notice, which a coordinator saw, and its provider said its instance ended.
    store.set(keys.notice(4), Notice("emulator", "terminate", 30.0, "i-0004").to_json().encode())
    store.set(keys.notice_end(4), json.dumps({"seen_unix_s": 0.0, "end_unix_s": 30.0}).encode())
    store.set(keys.gone(4), b"1")
    store.set(keys.lost(4), b"1")  # the coordinator counted its loss
    clock = ManualClock()
    config = CoordinatorConfig(num_steps=24, num_micro_batches=2, capacity=2)
    observer = Observer(store, config, clock, clock.now_s(), wall_clock=lambda: 0.0)
    member = observer.members(clock.now_s(), JobProgress(plan=None))[4]
    assert (member.layers, member.noticed, member.left) == ((0, 1, 2), True, True)

    agent = Agent(AgentConfig(instance=4), store, SimpleNamespace(checkpointer=None))  # type: ignore[arg-type]
    try:
        agent.join()
        member = observer.members(clock.now_s(), JobProgress(plan=None))[4]
        assert (member.layers, member.held_step) == ((), -2)
        assert not member.noticed and not member.left
        assert protocol.holdings(store) == {}
        assert store.get(keys.notice_end(4)) is None
        # This process's own loss is counted, as the coordinator counts one: once, by creating
        # the mark.
        assert store.compare_and_set(keys.lost(4), None, b"1")
    finally:
        agent.close()


def _plan(generation: int, start_step: int, restore_step: int | None) -> protocol.RuntimePlan:
    return protocol.RuntimePlan(
        generation=generation,
        epoch=0,
        start_step=start_step,
        end_step=8,
        data_parallel=1,
        pipeline_stages=1,
        boundaries=[0, 3],
        slots={4: (0, 0)},
        hosts={4: "127.0.0.1"},
        kind="start" if generation == 0 else "checkpoint-restore",
        restore_step=restore_step,
    )


class _Coordinator(ManualClock):
    """The agent's clock, and the coordinator's next plan once plan 0 is reported failed (what
    the coordinator's failure rule does), as the agent waits between looks at the store."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__()
        self.store = store

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if protocol.failures(self.store, 0) and protocol.load_plan(self.store, 1) is None:
            protocol.publish_plan(self.store, _plan(1, start_step=3, restore_step=2))


def test_a_joining_process_runs_no_plan_made_for_its_dead_predecessor() -> None:
    # The dead process ran plan 0 (a start) through step 3; a resumed job's provider starts
    # this one in its place before the coordinator has planned again.
    store = MemoryStore()
    protocol.publish_plan(store, _plan(0, start_step=0, restore_step=protocol.FRESH_START))
    for step in range(4):
        protocol.vote_commit(store, 0, step, num_working=1)
    ran: list[int] = []

    def run_generation(plan, on_training):  # type: ignore[no-untyped-def]
        ran.append(plan.generation)
        on_training()
        store.set(keys.job_done(), b"7")
        return GenerationResult(Ending.FINISHED, plan.end_step - 1)

    engine = SimpleNamespace(checkpointer=None, run_generation=run_generation)
    clock = _Coordinator(store)
    agent = Agent(AgentConfig(instance=4), store, engine, clock=clock)  # type: ignore[arg-type]
    assert agent.run() is AgentState.DONE
    # Run, plan 0 would have replayed steps 0-3 from the initial weights (and reported holding
    # the layers at step 3); plan 1, made after it joined, restores them from the checkpoint.
    assert ran == [1]
    (report,) = protocol.failures(store, 0).values()
    assert "joined after plan 0 was made" in report.reason
    assert protocol.failures(store, 1) == {}
