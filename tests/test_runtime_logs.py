"""Condensed logging of repeated failures, and an agent's heartbeat when its store is gone."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import pytest

from liveput.errors import LiveputError
from liveput.runtime import agent as agent_module
from liveput.runtime.agent import Agent, AgentConfig
from liveput.runtime.clock import ManualClock
from liveput.runtime.logs import RepeatFilter
from liveput.runtime.store import MemoryStore

LOGGER = logging.getLogger("test.repeat")


def messages(caplog: pytest.LogCaptureFixture, name: str = LOGGER.name) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_a_repeated_message_is_logged_once_then_counted_when_another_comes(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    clock = ManualClock()
    warn = RepeatFilter(LOGGER, now_s=clock.now_s)
    for _ in range(5):
        warn("store failed: refused\n  frame #0 c10d::TCPStore\n  frame #1 ...")
        clock.advance(0.5)
    warn("store failed: reset")
    assert messages(caplog) == [
        "store failed: refused",
        "store failed: refused (repeated 4 times)",
        "store failed: reset",
    ]


def test_a_message_repeated_for_long_is_counted_every_report_interval(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    clock = ManualClock()
    warn = RepeatFilter(LOGGER, report_every_s=30.0, now_s=clock.now_s)
    for _ in range(140):  # 70 s, a failure every 0.5 s
        warn("heartbeat failed")
        clock.advance(0.5)
    assert messages(caplog) == [
        "heartbeat failed",
        "heartbeat failed (repeated 60 times)",
        "heartbeat failed (repeated 60 times)",
    ]


def test_flush_counts_the_repeats_and_the_next_failure_is_logged_anew(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    warn = RepeatFilter(LOGGER, now_s=ManualClock().now_s)
    warn("down")
    warn.flush()  # a single failure: no count line
    warn("down")
    warn("down")
    warn.flush()
    warn.flush()
    warn("down")
    assert messages(caplog) == ["down", "down", "down (repeated 1 times)", "down"]


class FailingStore(MemoryStore):
    """Fails every heartbeat once ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def add(self, key: str, amount: int) -> int:
        if self.down:
            raise LiveputError("store tcp://127.0.0.1:1 failed: Connection reset by peer")
        return super().add(key, amount)


def test_an_agent_process_exits_once_its_store_stays_unreachable(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger=agent_module.LOG.name)
    exits: list[int] = []
    exited = threading.Event()

    def fake_exit(code: int) -> None:
        exits.append(code)
        agent._stop.set()  # ends the heartbeat thread, as the process would end
        exited.set()

    monkeypatch.setattr(agent_module, "end_process", fake_exit)
    store = FailingStore()
    config = AgentConfig(instance=4, heartbeat_s=0.01, store_outage_s=0.3, exit_on_store_loss=True)
    agent = Agent(config, store, SimpleNamespace(checkpointer=None))  # type: ignore[arg-type]
    agent.join()
    store.down = True
    try:
        assert exited.wait(10)
    finally:
        agent.close()
    assert exits == [3]
    lines = messages(caplog, agent_module.LOG.name)
    failures = [m for m in lines if "heartbeat failed" in m]
    assert failures[0] == (
        "agent 4: heartbeat failed: store tcp://127.0.0.1:1 failed: Connection reset by peer"
    )
    assert len(failures) == 2 and failures[1].startswith(failures[0] + " (repeated ")
    assert [m for m in lines if "unreachable" in m] == [lines[-1]]
    assert lines[-1].startswith("agent 4: the store has been unreachable for ")
    assert lines[-1].endswith(" s; exiting")


def test_an_agent_in_a_thread_never_exits_the_process(monkeypatch):
    exits: list[int] = []
    monkeypatch.setattr(agent_module, "end_process", exits.append)
    store = FailingStore()
    config = AgentConfig(instance=1, heartbeat_s=0.01, store_outage_s=0.05)
    agent = Agent(config, store, SimpleNamespace(checkpointer=None))  # type: ignore[arg-type]
    agent.join()
    store.down = True
    try:
        threading.Event().wait(0.3)  # six outages long
        assert agent._heartbeat.is_alive()  # still trying: the store may come back
    finally:
        agent.close()
    assert exits == []
