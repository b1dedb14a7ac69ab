"""pytest fixtures of the runtime's tests: a real etcd server and Linux network-namespace hosts.

The infrastructure itself lives in :mod:`liveput.testbed` (the fault campaign, ``python -m bench
chaos``, uses it too); import what you need from a test module (``from runtime_fixtures import
etcd_server, etcd_url``).

- ``etcd_server`` (session fixture) is one :class:`EtcdServer`; ``etcd_url`` (function fixture)
  hands out its ``etcd://127.0.0.1:PORT`` URL with the keyspace wiped, and starts it again if a
  test stopped it.
- ``netns_hosts``: two :class:`NetnsHosts` (10.77.0.1 and 10.77.0.2), removed after the test.

A missing ``etcd`` or ``ip`` fails the test loudly; nothing here skips.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from liveput.testbed import NETNS_SUBNET, EtcdServer, NetnsHosts, free_port

__all__ = [
    "free_port",
    "EtcdServer",
    "etcd_server",
    "etcd_url",
    "NETNS_SUBNET",
    "NetnsHosts",
    "netns_hosts",
]


@pytest.fixture(scope="session")
def etcd_server(process_tier: None) -> Iterator[EtcdServer]:
    """A real etcd server for the whole test session, stopped and removed at the end.

    Its data sits in memory (``/dev/shm``) where the machine has it: etcd syncs its log to disk on
    every write, and on a disk busy with the suite's other writes one sync took 2.6 s (5 s once,
    past a client's timeout), where the same writes in memory took at most 0.17 s."""
    memory = Path("/dev/shm")
    in_memory = memory if memory.is_dir() and os.access(memory, os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="liveput-etcd-", dir=in_memory) as tmp:
        server = EtcdServer(data_dir=Path(tmp) / "data")
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """The URL of the session's etcd, running and empty."""
    if etcd_server.process is None or etcd_server.process.poll() is not None:
        etcd_server.process = None
        etcd_server.start()
    etcd_server.wipe()
    return etcd_server.url


@pytest.fixture
def netns_hosts(process_tier: None) -> Iterator[NetnsHosts]:
    """Two namespace hosts (10.77.0.1 and 10.77.0.2), removed after the test."""
    with NetnsHosts(2) as hosts:
        yield hosts
