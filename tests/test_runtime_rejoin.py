"""An instance whose agent process died and was started again (a resumed job's provider starts
one for every instance it still rents): the new process holds nothing, whatever the dead one
reported, so the coordinator plans no layer from it."""

from __future__ import annotations

import json
from types import SimpleNamespace

from liveput.runtime import keys, protocol
from liveput.runtime.agent import Agent, AgentConfig
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator.observe import JobProgress, Observer
from liveput.runtime.decide import CoordinatorConfig
from liveput.runtime.store import MemoryStore


def test_a_joining_process_replaces_the_holdings_its_dead_predecessor_reported() -> None:
    store = MemoryStore()
    store.set(keys.member(4), json.dumps({"host": "127.0.0.1"}).encode())
    store.add(keys.heartbeat(4), 1)
    dead = protocol.Holding(generation=3, epoch=0, step=7, layers=(0, 1, 2), ending="stopped")
    protocol.report_holding(store, 4, dead)
    clock = ManualClock()
    config = CoordinatorConfig(num_steps=24, num_micro_batches=2, capacity=2)
    observer = Observer(store, config, clock, clock.now_s(), wall_clock=lambda: 0.0)
    assert observer.members(clock.now_s(), JobProgress(plan=None))[4].layers == (0, 1, 2)

    agent = Agent(AgentConfig(instance=4), store, SimpleNamespace(checkpointer=None))  # type: ignore[arg-type]
    try:
        agent.join()
        member = observer.members(clock.now_s(), JobProgress(plan=None))[4]
        assert (member.layers, member.held_step) == ((), -2)
        assert protocol.holdings(store) == {}
    finally:
        agent.close()
