"""A real etcd server on free ports with a temporary data directory, for tests and benchmarks.

:class:`EtcdServer` runs the ``etcd`` binary (Debian ``etcd-server``; ``make system-deps`` installs
it) the way a coordinator runs its own (:class:`liveput.runtime.store.etcd_server.LocalEtcd`);
``stop``/``start``/``restart`` keep the ports and the data, for "store restarted" faults.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from liveput.errors import LiveputError
from liveput.ports import free_port, free_port_pair
from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd
from liveput.testbed.errors import TestbedError

__all__ = ["EtcdServer", "free_port", "free_port_pair"]

ETCD_START_TIMEOUT_S = 20.0


@dataclass
class EtcdServer:
    """One etcd member on loopback, with its own data directory."""

    data_dir: Path
    """Its directory (etcd's ``data/``, ``etcd.log``); survives ``stop``/``start``."""
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

    def _local(self) -> LocalEtcd:
        # The coordinator's own way of running etcd (liveput.runtime.store.etcd_server), killed
        # with the thread that started it: a test run killed hard leaves no etcd on a shared
        # machine.
        return LocalEtcd(
            EtcdConfig(
                self.data_dir,
                host=self.host,
                client_port=self.client_port,
                peer_port=self.peer_port,
                name="liveput-test",
                start_timeout_s=ETCD_START_TIMEOUT_S,
                die_with_parent=True,
            )
        )

    def start(self) -> None:
        """Start etcd (same ports, same data) and wait until it answers; fails loudly if not."""
        if self.process is not None:
            raise TestbedError("etcd is already running")
        local = self._local()
        try:
            local.start()
        except LiveputError as error:
            raise TestbedError(str(error)) from None
        if local.process is None:  # adopted one left by a run killed before it stopped it
            local.stop(kill=True)
            local.start()
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
        request = urllib.request.Request(
            self.http_url + "/v3/kv/deleterange", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            if resp.status != 200:
                raise TestbedError(f"etcd wipe answered HTTP {resp.status}")
