"""Free TCP ports for the servers liveput starts by port number (a job's etcd, a test bed's).

A port is drawn below the system's ephemeral range (Linux: ``net.ipv4.ip_local_port_range``,
32768-60999 by default), not from it. The kernel gives ports of that range to every outgoing
connection (agents to their store, gloo's pairs of peers), so a port of it that was free a
moment ago can be a connection's own by the time the server binds it: in one fresh-clone suite, a
coordinator's etcd could not bind its peer port, drawn that way seconds before. A job's etcd
restarted after a crash binds its ports again, later still. Below the range, a port is held only
by a process that binds it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from liveput.errors import LiveputError

__all__ = ["free_port", "free_port_pair"]

LOWEST_PORT = 10000
"""The lowest port drawn: below it lie the well-known and commonly configured services'."""
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux says which ports it gives to outgoing connections."""
DEFAULT_EPHEMERAL_START = 32768
"""The range's start where the system does not say (Linux's default)."""
ATTEMPTS = 200
"""Ports drawn before giving up (each is checked by binding it)."""

# Not the module's shared generator: processes forked from one (agents from their fork server)
# would draw the same ports in the same order.
_DRAW = random.SystemRandom()


def ephemeral_start() -> int:
    """The first port the system gives to outgoing connections."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of ``count`` consecutive TCP ports that were free on ``host`` a moment ago,
    below the ephemeral range (anywhere above :data:`LOWEST_PORT` where the range leaves no room
    below it)."""
    high = ephemeral_start() - count
    if high <= LOWEST_PORT:
        high = 65536 - count
    for _ in range(ATTEMPTS):
        port = _DRAW.randrange(LOWEST_PORT, high)
        if all(_bindable(host, port + offset) for offset in range(count)):
            return port
    raise LiveputError(f"no {count} consecutive free TCP port(s) on {host} in {ATTEMPTS} draws")


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A port p with p and p + 1 free on ``host``: an etcd's client and peer ports (``liveput
    coordinator --listen HOST:PORT`` runs its etcd's peer listener on PORT + 1)."""
    return free_port(host, count=2)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
