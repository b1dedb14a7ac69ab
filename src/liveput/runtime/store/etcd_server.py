"""A local etcd server that a coordinator starts and owns: the job's state on disk.

``liveput coordinator`` without ``--store`` runs one (the ``etcd`` binary, Debian package
``etcd-server``) with its data under ``--etcd-dir``: ``data/`` (etcd's own), ``etcd.log`` and
``etcd.pid``. etcd runs in its own session, so it outlives a coordinator that crashes: the agents
go on training and a restarted coordinator adopts the running etcd (same directory, same
address) or, after a machine restart, starts it again on the same data; either way it resumes
the job from the store. The coordinator stops it when the job is done.

The tests start their etcd servers through the same class (``tests/runtime_fixtures.py``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from liveput.errors import LiveputError

LOG = logging.getLogger(__name__)
__all__ = ["EtcdConfig", "LocalEtcd"]


@dataclass(frozen=True)
class EtcdConfig:
    """Where and how the local etcd runs."""

    directory: Path
    """Its directory: ``data/`` (etcd's data), ``etcd.log``, ``etcd.pid``."""
    host: str = "127.0.0.1"
    """Address clients (the coordinator, the agents) reach it at."""
    client_port: int = 29400
    """Client port (etcd's JSON gateway is on it too)."""
    peer_port: int | None = None
    """Peer port on 127.0.0.1 (a one-member cluster uses it for nothing else); default
    ``client_port + 1``."""
    name: str = "liveput"
    """Member name."""
    start_timeout_s: float = 20.0
    """Longest wait for it to answer after starting, seconds."""
    binary: str = "etcd"
    """The etcd executable (looked up on ``PATH``)."""
    snapshot_count: int = 10_000
    """Applied writes between two etcd snapshots (``--snapshot-count``). etcd keeps the raft log
    since its last snapshot in memory: its default, 100,000, let a job's etcd grow by tens of
    MiB between snapshots (a commit vote or a heartbeat is a write)."""
    die_with_parent: bool = False
    """Kill etcd when the thread that started it ends (tests on a shared machine); off for a
    coordinator, whose etcd must outlive a crash."""

    def __post_init__(self) -> None:
        for what, port in (("client", self.client_port), ("peer", self.peer_port)):
            if port is not None and not 0 < port < 65536:
                raise LiveputError(f"etcd: {what} port {port} must be in 1..65535")
        if self.client_port == self.peer_port:
            raise LiveputError(f"etcd: client and peer ports are both {self.peer_port}")
        if self.client_port == 65535 and self.peer_port is None:
            raise LiveputError("etcd: client port 65535 leaves no default peer port")
        if self.snapshot_count < 1:
            raise LiveputError(f"etcd: snapshot_count must be >= 1, got {self.snapshot_count}")
        if self.start_timeout_s <= 0:
            raise LiveputError("etcd: start_timeout_s must be positive")


def _die_with_parent() -> None:
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child, exited, not reaped) is not alive.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class LocalEtcd:
    """One etcd member on this machine, started (or adopted) and stopped by its owner."""

    def __init__(self, config: EtcdConfig) -> None:
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        """The etcd process when this object started it."""
        self.pid: int | None = None
        """etcd's process id while it runs (started or adopted)."""
        self.adopted = False
        """Whether the running etcd was found running (a previous coordinator's)."""

    @property
    def data_dir(self) -> Path:
        return self.config.directory / "data"

    @property
    def pid_file(self) -> Path:
        return self.config.directory / "etcd.pid"

    @property
    def log_file(self) -> Path:
        return self.config.directory / "etcd.log"

    @property
    def url(self) -> str:
        """The store URL (``etcd://HOST:PORT``)."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"etcd://{host}:{self.config.client_port}"

    @property
    def http_url(self) -> str:
        return "http" + self.url.removeprefix("etcd")

    @property
    def peer_url(self) -> str:
        port = self.config.peer_port or self.config.client_port + 1
        return f"http://127.0.0.1:{port}"

    def healthy(self) -> bool:
        """Whether etcd answers its health check on the client address."""
        try:
            with urllib.request.urlopen(self.http_url + "/health", timeout=1) as reply:
                return b'"true"' in reply.read()
        except (urllib.error.URLError, OSError):
            return False

    def running_pid(self) -> int | None:
        """The pid of an etcd still running on this directory (a previous owner's), if any."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        return pid if str(self.data_dir).encode() in command else None

    def start(self) -> None:
        """Adopt the etcd already running on this directory, or start one; wait until it
        answers. LiveputError (one line) if it cannot."""
        if self.pid is not None:
            raise LiveputError(f"etcd on {self.config.directory} is already running here")
        pid = self.running_pid()
        if pid is not None:
            if not self._wait_healthy(None):
                raise LiveputError(
                    f"an etcd (pid {pid}) already runs on {self.data_dir} but does "
                    f"not answer at {self.http_url}; stop it (kill {pid}) or give "
                    "its address"
                )
            self.pid, self.adopted = pid, True
            LOG.info(
                "adopted the running etcd (pid %d) at %s, data in %s", pid, self.url, self.data_dir
            )
            return
        binary = shutil.which(self.config.binary)
        if binary is None:
            raise LiveputError(
                "etcd is not installed: install the Debian package etcd-server "
                "(apt-get install etcd-server), or pass --store URL"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client = self.http_url
        argv = [
            binary, "--name", self.config.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", f"{self.config.name}={self.peer_url}",
            "--snapshot-count", str(self.config.snapshot_count),
            "--log-level", "error", "--logger", "zap",
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=not self.config.die_with_parent,
                preexec_fn=_die_with_parent if self.config.die_with_parent else None,
            )
        self.pid = self.process.pid
        self.pid_file.write_text(f"{self.pid}\n")
        if not self._wait_healthy(self.process):
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-1:]
            self.stop()
            raise LiveputError(
                f"etcd did not start at {client} in "
                f"{self.config.start_timeout_s:g} s (data {self.data_dir}): "
                f"{tail[0] if tail else 'no log'}"
            )
        LOG.info("started etcd (pid %d) at %s, data in %s", self.pid, self.url, self.data_dir)

    def _wait_healthy(self, process: subprocess.Popen[bytes] | None) -> bool:
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.05)
        return False

    def stop(self, *, kill: bool = False) -> None:
        """Stop etcd: SIGTERM (it syncs its data), or SIGKILL with ``kill`` (a crash)."""
        pid = self.pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            pass
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        else:  # adopted: not our child, so poll
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.process, self.pid, self.adopted = None, None, False
        self.pid_file.unlink(missing_ok=True)

    def rss_bytes(self) -> int:
        """etcd's resident memory (for measurements); 0 when not running."""
        if self.pid is None:
            return 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0
