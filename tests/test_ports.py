"""Ports for servers started by number are drawn below the ephemeral range, where no outgoing
connection is given one, and only where they (and the port after, for a pair) are free."""

from __future__ import annotations

import socket

import pytest

from liveput import ports
from liveput.errors import LiveputError

pytestmark = pytest.mark.process  # it binds sockets


class _Draws:
    """Draws the given ports in order (the rest of a draw's range is not used)."""

    def __init__(self, *drawn: int) -> None:
        self.drawn = list(drawn)
        self.ranges: list[tuple[int, int]] = []

    def randrange(self, low: int, high: int) -> int:
        self.ranges.append((low, high))
        return self.drawn.pop(0)


def test_a_pair_is_drawn_below_the_ephemeral_range_and_both_ports_bind():
    start = ports.ephemeral_start()
    for _ in range(20):
        port = ports.free_port_pair()
        assert ports.LOWEST_PORT <= port and port + 1 < start
        for each in (port, port + 1):
            with socket.socket() as server:
                server.bind(("127.0.0.1", each))


def test_a_held_port_or_a_held_next_port_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        good = ports.free_port_pair()  # a real draw: free, with the port after it
        draws = _Draws(taken, taken - 1, good)
        monkeypatch.setattr(ports, "_DRAW", draws)
        # taken itself, then taken - 1 (the port after it is taken): the third draw.
        assert ports.free_port_pair() == good
        assert draws.ranges == [(ports.LOWEST_PORT, ports.ephemeral_start() - 2)] * 3


def test_a_system_whose_ephemeral_range_starts_low_gets_ports_from_anywhere(monkeypatch, tmp_path):
    # A real draw below this machine's ephemeral range: no outgoing connection of a test beside
    # this one takes it (a fixed 40000 was one's own in a loaded suite, and the fake ran out).
    free = ports.free_port()
    (tmp_path / "range").write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    draws = _Draws(free)
    monkeypatch.setattr(ports, "_DRAW", draws)
    assert ports.free_port() == free
    assert draws.ranges == [(ports.LOWEST_PORT, 65535)]
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ports.ephemeral_start() == ports.DEFAULT_EPHEMERAL_START


def test_no_free_port_in_every_draw_is_one_line(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "_DRAW", _Draws(*[taken] * ports.ATTEMPTS))
        with pytest.raises(LiveputError, match=r"^no 1 consecutive free TCP port\(s\) on 127\.0"):
            ports.free_port()
