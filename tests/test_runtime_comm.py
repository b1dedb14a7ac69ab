"""A generation's process groups as they are built: a rank whose peer arrived at the plan and
died before it joined gives up once the generation is over, not at the communication timeout."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist
from cli_support import wait_for

from liveput.runtime import keys
from liveput.runtime.comm import CommAborted, Groups, build_unless
from liveput.runtime.store import MemoryStore
from liveput.runtime.watchdog import Watchdog

CPU = torch.device("cpu")
TIMEOUT_S = 30.0


def _build(store: dist.Store, rank: int, made: list[Groups]) -> Groups:
    groups = Groups.build(store, 7, rank, 2, None, CPU, TIMEOUT_S)
    made.append(groups)
    return groups


@pytest.mark.process
def test_a_build_waiting_on_a_peer_that_never_joined_gives_up_once_the_generation_is_over():
    store = dist.HashStore()
    over = threading.Event()
    made: list[Groups] = []
    threading.Timer(0.3, over.set).start()
    started = time.monotonic()
    with pytest.raises(CommAborted):
        build_unless(lambda: _build(store, 0, made), over)
    assert time.monotonic() - started < TIMEOUT_S / 3
    # The peer joins after all: the abandoned build ends with groups, aborted as it ends.
    late = _build(store, 1, [])
    try:
        wait_for(lambda: made, 10, "the abandoned build's groups", interval_s=0.05)
        wait_for(made[0].aborted.is_set, 10, "its groups aborted", interval_s=0.05)
        assert len(made) == 1
    finally:
        late.close()


@pytest.mark.process
def test_a_build_every_rank_joins_returns_live_groups():
    store = dist.HashStore()
    over = threading.Event()
    built: dict[int, Groups] = {}

    def rank(number: int) -> None:
        built[number] = build_unless(lambda: _build(store, number, []), over)

    threads = [threading.Thread(target=rank, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sorted(built) == [0, 1]
        assert not any(groups.aborted.is_set() for groups in built.values())
        peer = threading.Thread(target=built[1].barrier)
        peer.start()
        built[0].barrier()  # a collective over both ranks' groups
        peer.join()
    finally:
        for groups in built.values():
            groups.close()


def test_the_watchdog_tells_a_generation_without_groups_it_is_over_and_aborts_them_once_attached():
    store = MemoryStore()
    store.set(keys.current_plan(), b"7")
    watchdog = Watchdog(store, 7, instance=0, current_step=lambda: None)
    watchdog.start()
    try:
        assert not watchdog.over.wait(0.5)  # plan 7 is in force
        store.set(keys.current_plan(), b"8")
        assert watchdog.over.wait(5.0)
        assert watchdog.reason == "was superseded"
        groups = Groups(None, 0, None, CPU, timeout_s=0.1)  # type: ignore[arg-type]
        watchdog.attach(groups)
        assert groups.aborted.is_set()
    finally:
        watchdog.done.set()
        watchdog.join()
