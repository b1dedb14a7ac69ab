"""Buddy copies in host memory: who keeps whose layers, the copy server's contract, and the
point a restore from memory reads (``liveput.runtime.memory_copies``)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job
from liveput.runtime.layer_state import decode_state, encode_state, fresh_layer
from liveput.runtime.memory_copies import (
    CopyPoint,
    CopyRecord,
    CopyServer,
    MemoryCopies,
    buddy_of,
    choose_restore,
    fetch_copy,
    sender_to,
)
from liveput.runtime.protocol import RuntimePlan

TOKEN = b"job-token"


def _plan(data_parallel: int, stages: int, spares: int = 0) -> RuntimePlan:
    slots: dict[int, tuple[int, int] | None] = {
        10 + d * stages + s: (d, s) for d in range(data_parallel) for s in range(stages)
    }
    slots.update({100 + k: None for k in range(spares)})
    return RuntimePlan(
        1,
        0,
        0,
        10,
        data_parallel,
        stages,
        list(range(stages + 1)),
        slots,
        dict.fromkeys(slots, "127.0.0.1"),
        memory_epoch=0,
        memory_sources={0: 10},
        memory_addresses={10: "127.0.0.1:1"},
    )


@pytest.mark.parametrize(("d", "p"), [(1, 2), (2, 1), (2, 2), (3, 4), (4, 1), (1, 8)])
def test_every_working_instance_keeps_another_ones_layers_and_is_kept_once(d, p) -> None:
    plan = _plan(d, p, spares=1)
    working = [i for i, slot in plan.slots.items() if slot is not None]
    buddies = {i: buddy_of(plan, i) for i in working}
    assert sorted(buddies.values()) == sorted(working)  # a permutation of the working
    assert all(buddy != i for i, buddy in buddies.items())
    assert all(sender_to(plan, buddy) == i for i, buddy in buddies.items())
    assert buddy_of(plan, 100) is None and sender_to(plan, 100) is None
    if p > 1:  # another instance of the same pipeline: a stage's copy is not its replica's
        assert all(plan.slots[b][0] == plan.slots[i][0] for i, b in buddies.items())


def test_a_lone_instance_has_no_buddy() -> None:
    plan = _plan(1, 1)
    assert buddy_of(plan, 10) is None and sender_to(plan, 10) is None


def test_a_plan_names_its_memory_copies_through_its_json() -> None:
    plan = _plan(2, 2)
    again = RuntimePlan.from_json(plan.to_json())
    assert again == plan and again.memory_sources == {0: 10}


def _server() -> tuple[MemoryCopies, CopyServer]:
    copies = MemoryCopies()
    return copies, CopyServer(copies, "127.0.0.1", TOKEN)


def test_a_copy_is_served_signed_to_a_requester_with_the_job_token() -> None:
    job = resolve_job("tiny-gpt-small")
    layer = fresh_layer(job, 1, torch.device("cpu"))
    copies, server = _server()
    try:
        copies.replace(0, 9, {1: encode_state(layer.state_dict(), TOKEN)})
        data = fetch_copy(server.address, 0, 9, 1, TOKEN)
        state = decode_state(data, TOKEN, "test")
        for name, value in layer.module.state_dict().items():
            assert torch.equal(state["module"][name], value)
        with pytest.raises(LiveputError, match="refused the request"):
            fetch_copy(server.address, 0, 9, 1, b"another token")
        with pytest.raises(LiveputError, match="holds no copy of layer 2 at step 9"):
            fetch_copy(server.address, 0, 9, 2, TOKEN)
    finally:
        server.close()


def test_a_request_for_a_copy_being_made_waits_for_it_and_two_points_are_kept() -> None:
    copies, server = _server()
    try:
        copies.replace(0, 9, {0: b"old"})
        threading.Timer(0.3, lambda: copies.replace(0, 19, {0: b"new"})).start()
        started = time.monotonic()
        assert fetch_copy(server.address, 0, 19, 0, TOKEN) == b"new"
        assert time.monotonic() - started >= 0.25
        # The point before stays while the newest fills (its sender's layers come later).
        assert fetch_copy(server.address, 0, 9, 0, TOKEN) == b"old"
        copies.add(0, 19, {1: b"sender's"})
        copies.replace(0, 29, {0: b"newer"})
        assert [(p.step, p.layers) for p in copies.held()] == [(19, (0, 1)), (29, (0,))]
        with pytest.raises(LiveputError, match="holds no copy"):
            fetch_copy(server.address, 0, 9, 0, TOKEN)
    finally:
        server.close()


def test_a_paced_copy_takes_its_size_over_its_rate() -> None:
    copies, server = _server()
    try:
        copies.replace(0, 9, {0: bytes(600_000)})
        started = time.monotonic()
        assert len(fetch_copy(server.address, 0, 9, 0, TOKEN, rate_bytes_per_s=1_000_000)) == (
            600_000
        )
        assert time.monotonic() - started >= 0.45  # its last 128-KiB chunk may go at once
    finally:
        server.close()


def _record(step: int, *layers: int, epoch: int = 2) -> CopyRecord:
    return CopyRecord(f"h:{step}", (CopyPoint(epoch, step, layers),))


def test_a_restore_reads_the_newest_point_the_instances_up_hold_whole() -> None:
    filling = CopyRecord("h:5", (CopyPoint(2, 19, (0, 1)), CopyPoint(2, 29, (0,))))
    found = choose_restore({5: filling, 2: _record(29, 2, 3)}, [5, 2], 4, 2, None)
    assert found is None  # 29 lacks layer 1 (still on its way), 19 lacks 2 and 3
    both = CopyRecord("h:2", (CopyPoint(2, 19, (2, 3)), CopyPoint(2, 29, (2, 3))))
    found = choose_restore({5: filling, 2: both}, [5, 2], 4, 2, None)
    assert found is not None and found.step == 19

    records = {
        1: _record(29, 0, 1),
        2: _record(29, 2, 3),
        3: _record(19, 0, 1, 2, 3),
        4: _record(39, 0, 1, 2, 3),  # lost
    }
    found = choose_restore(records, [1, 2, 3], 4, epoch=2, newest_checkpoint=19)
    assert found is not None and (found.epoch, found.step) == (2, 29)
    assert found.sources == {0: 1, 1: 1, 2: 2, 3: 2} and set(found.addresses) == {1, 2}
    # Instance 2 gone too: step 29 no longer whole, 19 is.
    found = choose_restore(records, [1, 3], 4, epoch=2, newest_checkpoint=19)
    assert found is not None and found.step == 19 and set(found.sources.values()) == {3}


def test_no_restore_from_memory_older_than_the_checkpoint_or_of_another_epoch() -> None:
    records = {1: _record(19, 0, 1), 2: _record(19, 2, 3), 3: _record(29, 0, 1, epoch=1)}
    assert choose_restore(records, [1, 2, 3], 4, epoch=2, newest_checkpoint=20) is None
    assert choose_restore(records, [1, 3], 4, epoch=2, newest_checkpoint=None) is None
    assert choose_restore(records, [1, 2], 4, epoch=2, newest_checkpoint=None) is not None


def test_a_requester_that_leaves_mid_copy_costs_the_server_nothing(capfd) -> None:
    import json
    import socket

    from liveput.runtime.memory_copies import _request_mac

    copies, server = _server()
    try:
        copies.replace(0, 9, {0: bytes(4_000_000)})
        request = {"epoch": 0, "step": 9, "layer": 0, "rate_bytes_per_s": 4_000_000}
        request["mac"] = _request_mac(TOKEN, request)
        host, _, port = server.address.rpartition(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(json.dumps(request).encode() + b"\n")
            connection.recv(1024)  # the copy has begun; the requester goes (a lost instance)
        time.sleep(1.0)
        assert fetch_copy(server.address, 0, 9, 0, TOKEN) == bytes(4_000_000)
        assert "Traceback" not in capfd.readouterr().err
    finally:
        server.close()
