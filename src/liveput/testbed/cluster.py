"""A real training job on network-namespace hosts, that a fault campaign can hurt.

:class:`ChaosCluster` runs one job: its store (a TCPStore hosted in this process, or the
campaign's etcd), the coordinator (``liveput coordinator``, a process of its own so it can be
SIGKILLed and restarted) in the root namespace, and one agent (``python -m liveput.runtime``) per
instance, each alone in a :class:`~liveput.testbed.netns.NetnsHosts` host (so a partition cuts
one instance off). Everything reaches everything through the hosts' root-namespace gateway.

The cluster only carries out effects (start, signal, kill, read the store); what to do and when is
:mod:`liveput.testbed.faults`'s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liveput.cloud.agent_forks import ForkedAgent, ForkServer, shared_fork_server
from liveput.runtime import keys, protocol
from liveput.runtime.entry import agent_args
from liveput.runtime.store import SignedStore, Store, TCPStoreBackend, open_store
from liveput.testbed.errors import TestbedError
from liveput.testbed.etcd import EtcdServer
from liveput.testbed.netns import NetnsHosts

if TYPE_CHECKING:
    from liveput.models.job import Job

__all__ = ["ClusterConfig", "ChaosCluster", "CHAOS_JOB", "chaos_job", "TOKEN"]

CHAOS_JOB = "liveput.testbed.cluster:chaos_job"
"""The campaign's job, as agents resolve it (``module:function``)."""
TOKEN = "chaos-token"
"""The job token of every campaign run."""
SAMPLE_DELAY_S = 0.01
"""Seconds each sample of :func:`chaos_job` takes to load: a step lasts long enough for a fault
to land inside it, as a real model's would."""


def chaos_job() -> Job:
    """tiny-gpt-small whose samples take ``SAMPLE_DELAY_S`` each to load."""
    import torch

    from liveput.models.jobs import resolve_job

    job = resolve_job("tiny-gpt-small")
    inner = job.dataset
    assert isinstance(inner, Sized)  # tiny-gpt-small's windows
    num_windows = len(inner)

    class SlowWindows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return num_windows

        def __getitem__(self, index: int) -> Any:
            time.sleep(SAMPLE_DELAY_S)
            return inner[index]

    job.dataset = SlowWindows()
    return job


@dataclass(frozen=True)
class ClusterConfig:
    """One run of the campaign's job."""

    steps: int = 60
    """Steps to train."""
    workers: int = 4
    """Agents started at the beginning (and the coordinator's initial workers)."""
    capacity: int = 6
    """Most instances the coordinator plans for."""
    checkpoint_every: int = 5
    """K: checkpoint every K steps."""
    heartbeat_timeout_s: float = 3.0
    """Seconds of silence before the coordinator takes an agent for dead."""
    interval_s: float = 1.0
    """Seconds between the coordinator's decisions."""
    store: str = "tcp"
    """``tcp`` (a TCPStore hosted by this process) or ``etcd`` (the campaign's etcd server)."""
    policy: str = "liveput"
    """The coordinator's policy (``reactive``: the best configuration for the instances up,
    no change otherwise)."""
    job: str = CHAOS_JOB
    """The job (``module:function`` importable by the agents)."""
    environment: tuple[tuple[str, str], ...] = ()
    """Extra environment variables of the coordinator and the agents."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.workers < 1 or self.capacity < self.workers:
            raise ValueError("ClusterConfig: steps, workers >= 1 and capacity >= workers")
        if self.checkpoint_every < 1 or self.heartbeat_timeout_s <= 0 or self.interval_s <= 0:
            raise ValueError("ClusterConfig: checkpoint_every >= 1 and positive times")
        if self.store not in ("tcp", "etcd"):
            raise ValueError(f"ClusterConfig: store must be tcp or etcd, got {self.store!r}")


@dataclass
class AgentProcess:
    """One instance's agent."""

    instance: int
    """Its instance id."""
    host: int
    """The namespace host it runs in."""
    process: ForkedAgent
    """Its process, forked from its host's fork server."""
    stopped: bool = False
    """SIGSTOPped and not yet continued."""


@dataclass
class ChaosCluster:
    """One job on ``hosts`` (created with a gateway), its files under ``directory``."""

    config: ClusterConfig
    """The run."""
    hosts: NetnsHosts
    """Where agents run, one per host; the root namespace reaches them through the gateway."""
    directory: Path
    """Logs (``logs/``) of this run."""
    checkpoint_dir: Path
    """Where the job checkpoints (may be a small tmpfs)."""
    etcd: EtcdServer | None = None
    """The campaign's etcd (listening on the gateway address), for ``store="etcd"``."""
    agents: dict[int, AgentProcess] = field(default_factory=dict)
    """Every agent started, by instance id (dead ones too)."""
    coordinator: subprocess.Popen | None = None
    """The coordinator's process."""

    def __post_init__(self) -> None:
        self.logs = self.directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._hosted: TCPStoreBackend | None = None
        self._next_instance = 0
        self.store: Store | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """The store, the coordinator, then ``workers`` agents."""
        if self.config.store == "tcp":
            self._hosted = TCPStoreBackend(self.hosts.gateway_address, 0, host=True)
            self.url = self._hosted.url
            self.store = SignedStore(self._hosted, TOKEN)
        else:
            if self.etcd is None:
                raise TestbedError("an etcd run needs the campaign's etcd server")
            if self.etcd.process is None:
                self.etcd.start()
            self.etcd.wipe()
            self.url = self.etcd.url
            self.store = open_store(self.url, token=TOKEN, timeout_s=5.0)
        self.start_coordinator()
        for _ in range(self.config.workers):
            self.start_agent()

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "LIVEPUT_TOKEN": TOKEN,
            "TORCH_CPP_LOG_LEVEL": "FATAL",
            **dict(self.config.environment),
        }

    def start_coordinator(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            raise TestbedError("the coordinator is still running")
        c = self.config
        with open(self.logs / "coordinator.log", "ab") as log:
            self.coordinator = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "liveput.cli.main",
                    "-v",
                    "coordinator",
                    "--store",
                    self.url,
                    "--model",
                    c.job,
                    "--steps",
                    str(c.steps),
                    "--workers",
                    str(c.workers),
                    "--capacity",
                    str(c.capacity),
                    "--checkpoint-dir",
                    str(self.checkpoint_dir),
                    "--checkpoint-every",
                    str(c.checkpoint_every),
                    "--interval",
                    str(c.interval_s),
                    "--heartbeat-timeout",
                    str(c.heartbeat_timeout_s),
                    "--start-grace",
                    "60",
                    "--policy",
                    c.policy,
                ],
                env=self._env(),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
            )

    def kill_coordinator(self) -> None:
        """SIGKILL the coordinator (it keeps nothing but what the store holds)."""
        assert self.coordinator is not None
        self.coordinator.kill()
        self.coordinator.wait(timeout=10)

    def free_host(self) -> int:
        busy = {a.host for a in self.agents.values() if a.process.poll() is None}
        for index in range(self.hosts.count):
            if index not in busy:
                return index
        raise TestbedError(f"all {self.hosts.count} hosts have a live agent")

    def start_agent(self) -> int:
        """A new instance (a new id) in a free host; its id."""
        instance = self._next_instance
        self._next_instance += 1
        host = self.free_host()
        args = agent_args(
            self.url, notices="sigterm", instance=instance, host=self.hosts.address(host)
        )
        process = self._fork_server().spawn(
            args, self._env(), None, self.logs / f"agent-{instance}.log", self.hosts.names[host]
        )
        self.agents[instance] = AgentProcess(instance, host, process)
        return instance

    def _fork_server(self) -> ForkServer:
        """This process's fork server for the cluster's agents (:func:`shared_fork_server`):
        each agent starts without importing torch, in its host's network namespace."""
        return shared_fork_server(self._env())

    def alive(self) -> list[int]:
        """Instances whose process runs (stopped ones included)."""
        return sorted(i for i, a in self.agents.items() if a.process.poll() is None)

    def signal(self, instance: int, signum: int) -> None:
        agent = self.agents[instance]
        try:
            agent.process.send_signal(signum)
        except ProcessLookupError:
            return
        if signum == signal.SIGSTOP:
            agent.stopped = True
        elif signum == signal.SIGCONT:
            agent.stopped = False
        elif signum == signal.SIGKILL:
            agent.process.wait(timeout=10)

    def done(self) -> bool:
        """The coordinator ended (the job is done, or it failed)."""
        return self.coordinator is not None and self.coordinator.poll() is not None

    def wait_done(self, timeout_s: float) -> int:
        """The coordinator's exit code; TestbedError after ``timeout_s``."""
        assert self.coordinator is not None
        try:
            return self.coordinator.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"job not done after {timeout_s:.0f} s") from None

    def close(self) -> None:
        """Kill whatever still runs (continuing stopped agents first) and close the store."""
        for agent in self.agents.values():
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.wait(timeout=10)
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.kill()
            self.coordinator.wait(timeout=10)
        if self.store is not None:
            self.store.close()

    def started_store(self) -> Store:
        """The job's store; a TestbedError before :meth:`start` opened it."""
        if self.store is None:
            raise TestbedError("the cluster's store is not open (start the cluster first)")
        return self.store

    # --- observation (None while the store is away) ---------------------------------------------
    def plan(self) -> protocol.RuntimePlan | None:
        try:
            return protocol.current_plan(self.started_store())
        except Exception:  # noqa: BLE001 - the store may be down: a fault
            return None

    def committed(self) -> int:
        """The newest committed step of the newest restore epoch (-1 before any)."""
        try:
            records = self.started_store().get_prefix(keys.LEDGER.prefix)
        except Exception:  # noqa: BLE001 - the store may be down: a fault
            return -1
        points = [tuple(int(p) for p in key.split("/")[1:]) for key in records]
        return max(points, default=(0, -1))[1]

    def state(self, instance: int) -> str | None:
        try:
            raw = self.started_store().get(keys.state(instance))
        except Exception:  # noqa: BLE001
            return None
        return None if raw is None else raw.decode()

    def commit_times(self) -> list[float]:
        """Unix times of every step committed, every epoch."""
        return sorted(
            json.loads(raw)["committed_unix_s"]
            for raw in self.started_store().get_prefix(keys.LEDGER.prefix).values()
        )

    def wait_until(
        self, condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.05
    ) -> bool:
        """Whether ``condition()`` held within ``timeout_s`` (False too once the job ended)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                return True
            if self.done():
                return False
            time.sleep(poll_s)
        return False
