"""Test infrastructure for the runtime: a real etcd server and Linux network-namespace hosts.

Import what you need from a test module (``from runtime_fixtures import etcd_server, etcd_url``).

- :class:`EtcdServer` runs the ``etcd`` binary (Debian ``etcd-server``; ``make system-deps``
  installs it) on free loopback ports with a temporary data directory; ``stop``/``start``/
  ``restart`` keep the ports and the data, for "store restarted" fault tests.
- ``etcd_server`` (session fixture) is one such server; ``etcd_url`` (function fixture) hands out
  its ``etcd://127.0.0.1:PORT`` URL with the keyspace wiped, and starts it again if a test stopped it.
- :class:`NetnsHosts` creates N network namespaces joined by veth pairs to a bridge in a switch
  namespace, with addresses in 10.77.0.0/24 that exist only inside those namespaces, and runs
  commands inside them (``ip netns exec``). Needs root and ``ip`` (``iproute2``).

A missing ``etcd`` or ``ip`` fails the test loudly; nothing here skips.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from liveput.errors import LiveputError
from liveput.runtime.etcd import EtcdConfig, LocalEtcd

__all__ = [
    "free_port",
    "EtcdServer",
    "etcd_server",
    "etcd_url",
    "NetnsHosts",
    "netns_hosts",
]

ETCD_START_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdServer:
    """One etcd member on loopback, with its own data directory."""

    data_dir: Path
    """Where etcd keeps its data; survives ``stop``/``start``."""
    client_port: int = field(default_factory=free_port)
    """Client (and JSON gateway) port on 127.0.0.1."""
    peer_port: int = field(default_factory=free_port)
    """Peer port on 127.0.0.1 (single-member cluster)."""
    process: subprocess.Popen[bytes] | None = None
    """The running etcd process, or None when stopped."""

    @property
    def url(self) -> str:
        """The store URL for :func:`liveput.runtime.store.open_store`."""
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def http_url(self) -> str:
        """The client URL etcd serves on."""
        return f"http://127.0.0.1:{self.client_port}"

    def _local(self) -> LocalEtcd:
        # The coordinator's own way of running etcd; killed with this process's starting thread.
        return LocalEtcd(EtcdConfig(self.data_dir.parent, client_port=self.client_port,
                                    peer_port=self.peer_port, name="liveput-test",
                                    start_timeout_s=ETCD_START_TIMEOUT_S, die_with_parent=True))

    def start(self) -> None:
        """Start etcd (same ports, same data) and wait until it answers; fails loudly if it cannot."""
        assert shutil.which("etcd"), "etcd is not installed: run `make system-deps` (Debian package etcd-server)"
        assert self.process is None, "etcd is already running"
        local = self._local()
        try:
            local.start()
        except LiveputError as error:
            raise AssertionError(str(error)) from None
        self.process = local.process

    def stop(self, *, kill: bool = False) -> None:
        """Stop etcd: SIGTERM (graceful) or, with ``kill``, SIGKILL (a crash)."""
        if self.process is None:
            return
        local = self._local()
        local.process, local.pid = self.process, self.process.pid
        local.stop(kill=kill)
        self.process = None

    def restart(self, *, kill: bool = False, down_s: float = 0.0) -> None:
        """Stop, stay down ``down_s`` seconds, start again on the same ports with the same data."""
        self.stop(kill=kill)
        time.sleep(down_s)
        self.start()

    def wipe(self) -> None:
        """Delete every key (etcd must be running)."""
        body = b'{"key": "AA==", "range_end": "AA=="}'  # "\0".."\0": the whole keyspace
        request = urllib.request.Request(self.http_url + "/v3/kv/deleterange", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert resp.status == 200


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """A real etcd server for the whole test session, stopped and removed at the end."""
    with tempfile.TemporaryDirectory(prefix="liveput-etcd-") as tmp:
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


# -- network namespaces ------------------------------------------------------------------------------

NETNS_SUBNET = "10.77.0"
"""First three octets of the /24 the namespace hosts use; it exists only inside them."""
_netns_serial = itertools.count()


def _ip(*args: str) -> None:
    binary = shutil.which("ip")
    assert binary, "`ip` is not installed: run `make system-deps` (Debian package iproute2)"
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, f"ip {' '.join(args)}: {result.stderr.strip()}"


@dataclass
class NetnsHosts:
    """N emulated hosts: network namespaces on one bridge, host i at ``10.77.0.(i+1)``."""

    count: int
    """How many hosts."""
    names: list[str] = field(default_factory=list)
    """The namespace of each host."""
    switch: str = ""
    """The namespace holding the bridge."""

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 200:
            raise ValueError(f"NetnsHosts count must be in [1, 200], got {self.count}")

    def address(self, index: int) -> str:
        """Host ``index``'s address; reachable only from inside the hosts' namespaces."""
        return f"{NETNS_SUBNET}.{index + 1}"

    def create(self) -> NetnsHosts:
        """Create the namespaces, the bridge and the links (cleans up if any step fails)."""
        tag = f"lp{os.getpid()}x{next(_netns_serial)}"
        self.switch = f"{tag}sw"
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for index in range(self.count):
                name = f"{tag}h{index}"
                _ip("netns", "add", name)
                self.names.append(name)
                port = f"port{index}"
                _ip("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
                _ip("-n", name, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def argv(self, index: int, command: Sequence[str]) -> list[str]:
        """``command`` wrapped to run inside host ``index``'s namespace."""
        binary = shutil.which("ip") or "ip"
        return [binary, "netns", "exec", self.names[index], *command]

    def popen(self, index: int, command: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``command`` inside host ``index``'s namespace."""
        return subprocess.Popen(self.argv(index, command), **kwargs)  # type: ignore[call-overload]

    def run(self, index: int, command: Sequence[str], *, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``command`` inside host ``index``'s namespace to completion; output captured as text."""
        return subprocess.run(self.argv(index, command), capture_output=True, text=True, timeout=timeout_s)

    def destroy(self) -> None:
        """Delete every namespace created (their veth links go with them)."""
        for name in [*self.names, self.switch]:
            if name:
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        self.names = []
        self.switch = ""

    def __enter__(self) -> NetnsHosts:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


@pytest.fixture
def netns_hosts() -> Iterator[NetnsHosts]:
    """Two namespace hosts (10.77.0.1 and 10.77.0.2), removed after the test."""
    with NetnsHosts(2) as hosts:
        yield hosts
