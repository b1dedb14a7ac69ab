"""A real etcd server on free ports with a temporary data directory, for tests and benchmarks.

:class:`EtcdServer` runs the ``etcd`` binary (Debian ``etcd-server``; ``make system-deps`` installs
it); ``stop``/``start``/``restart`` keep the ports and the data, for "store restarted" faults.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from liveput.testbed.errors import TestbedError

__all__ = ["EtcdServer", "free_port"]

ETCD_START_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # A test run killed hard must not leave an etcd behind on a shared machine. (The signal comes
    # when the starting *thread* ends: start etcd from a thread that outlives it.)
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class EtcdServer:
    """One etcd member on loopback, with its own data directory."""

    data_dir: Path
    """Where etcd keeps its data; survives ``stop``/``start``."""
    host: str = "127.0.0.1"
    """Address etcd listens on (clients and peer); an address of the root namespace."""
    client_port: int = field(default_factory=free_port)
    """Client (and JSON gateway) port (free on 127.0.0.1 when drawn)."""
    peer_port: int = field(default_factory=free_port)
    """Peer port (single-member cluster)."""
    process: subprocess.Popen[bytes] | None = None
    """The running etcd process, or None when stopped."""

    @property
    def url(self) -> str:
        """The store URL for :func:`liveput.runtime.store.open_store`."""
        return f"etcd://{self.host}:{self.client_port}"

    @property
    def http_url(self) -> str:
        """The client URL etcd serves on."""
        return f"http://{self.host}:{self.client_port}"

    def start(self) -> None:
        """Start etcd (same ports, same data) and wait until it answers; fails loudly if it cannot."""
        binary = shutil.which("etcd")
        if not binary:
            raise TestbedError("etcd is not installed: run `make system-deps` (Debian package "
                               "etcd-server)")
        if self.process is not None:
            raise TestbedError("etcd is already running")
        peer = f"http://{self.host}:{self.peer_port}"
        argv = [
            binary,
            "--name", "liveput-test",
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.http_url,
            "--advertise-client-urls", self.http_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"liveput-test={peer}",
            "--log-level", "error",
            "--logger", "zap",
        ]  # fmt: skip
        log_path = self.data_dir.parent / "etcd.log"
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        deadline = time.monotonic() + ETCD_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                raise TestbedError(f"etcd exited at start: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.http_url + "/health", timeout=1) as resp:
                    if b'"true"' in resp.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise TestbedError(f"etcd did not become healthy in {ETCD_START_TIMEOUT_S} s")

    def stop(self, *, kill: bool = False) -> None:
        """Stop etcd: SIGTERM (graceful) or, with ``kill``, SIGKILL (a crash)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
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
            if resp.status != 200:
                raise TestbedError(f"etcd wipe answered HTTP {resp.status}")
