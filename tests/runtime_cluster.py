"""Helpers of the runtime's multi-process tests: agent processes against a shared store."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch

from liveput.cloud.agent_forks import ForkedAgent, ForkServer, shared_fork_server
from liveput.models.jobs import resolve_job
from liveput.perf.configuration import Configuration
from liveput.policies.base import POLICIES, Decision, Observation, Policy
from liveput.runtime.coordinator import Coordinator
from liveput.runtime.entry import agent_args
from liveput.testbed import reference
from liveput.testbed.reference import final_parameters, parameter_mismatches

__all__ = [
    "JOB",
    "TOKEN",
    "AgentProcesses",
    "assert_same_parameters",
    "final_parameters",
    "reference_parameters",
    "run_to_end",
    "run_until",
]

JOB = "runtime_cluster:slow_small_job"
TOKEN = "test-token"


def reference_parameters(steps: int, job_name: str = JOB) -> list[dict[str, torch.Tensor]]:
    """An uninterrupted single-process run of ``steps`` steps."""
    job = resolve_job(job_name)
    if isinstance(job.dataset, _SlowWindows):
        job.dataset = job.dataset.inner
    return reference.reference_parameters(job, steps)


def assert_same_parameters(got, want) -> None:  # noqa: ANN001
    assert not (mismatches := parameter_mismatches(got, want)), mismatches


class AgentProcesses:
    """Agent processes (``python -m liveput.runtime``, forked from this test process's fork
    server, as ``liveput train`` starts them), killed at the end of the test."""

    def __init__(self, store_url: str, log_dir: Path, token: str = TOKEN) -> None:
        self.store_url = store_url
        self.log_dir = log_dir
        self.token = token
        self.processes: dict[int, ForkedAgent] = {}

    def start(
        self,
        instance: int,
        token: str | None = None,
        host: str = "127.0.0.1",
        market: str = "spot",
        notices: str = "sigterm",
        extra_env: dict[str, str] | None = None,
    ) -> ForkedAgent:
        """``notices``: the agent's ``--notices`` (``emulator`` reads the notice file that
        ``extra_env`` names, as the emulated cloud's agents do)."""
        env = {
            **_agent_environment(),
            "LIVEPUT_TOKEN": token or self.token,
            "LIVEPUT_MARKET": market,
            **(extra_env or {}),
        }
        args = agent_args(self.store_url, notices=notices, instance=instance, host=host)
        process = _fork_server().spawn(args, env, None, self.log_dir / f"agent-{instance}.log")
        self.processes[instance] = process
        return process

    def kill(self, *instances: int) -> None:
        """SIGKILL, no notice: a preemption the agent never heard of."""
        for instance in instances:
            self.processes[instance].send_signal(signal.SIGKILL)
        for instance in instances:
            self.processes[instance].wait(timeout=10)

    def wait_all(self, timeout_s: float = 30.0) -> dict[int, int]:
        deadline = time.monotonic() + timeout_s
        codes = {}
        for instance, process in self.processes.items():
            codes[instance] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
        return codes

    def log(self, instance: int) -> str:
        return (self.log_dir / f"agent-{instance}.log").read_text(errors="replace")

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)


def _agent_environment() -> dict[str, str]:
    """This environment: the tests' folder is on its path (tests/conftest.py), where the agents'
    jobs live."""
    return dict(os.environ)


def _fork_server() -> ForkServer:
    """The test process's (an xdist worker's), shared with the jobs it runs in process."""
    return shared_fork_server(_agent_environment())


def run_until(
    tick: Callable[[], bool],
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    tick_s: float = 0.05,
) -> None:
    """Tick the coordinator until ``condition`` holds (fails the test after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert tick(), f"job ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(tick_s)


def run_to_end(coordinator: Coordinator, agents: AgentProcesses, timeout_s: float = 200.0) -> None:
    """Tick the coordinator (sleeping ``tick_s`` between ticks, as ``Coordinator.run`` does) until
    the job is done; fail after ``timeout_s`` with the plan and the agents' last log lines.

    A tick without a sleep would spin the test process and starve the agents of CPU on a small
    machine, which is how a CI run once ran past the whole test's timeout."""
    deadline = time.monotonic() + timeout_s
    while coordinator.tick():
        if time.monotonic() > deadline:
            plan = coordinator.plan
            tails = {i: agents.log(i).splitlines()[-8:] for i in agents.processes}
            raise AssertionError(
                f"job not done after {timeout_s:.0f} s: committed {coordinator.committed}, "
                f"plan {plan.generation if plan else None} ({plan.kind if plan else None}), "
                f"available {coordinator.available}; agents' last lines: {tails}"
            )
        time.sleep(coordinator.config.tick_s)


@POLICIES.register("test-fixed-2x2")
class Fixed2x2(Policy):
    """Wants (2, 2) whatever happens (the coordinator fits it to what is available)."""

    name = "test-fixed-2x2"

    def decide(self, observation: Observation) -> Decision:
        return Decision(Configuration(2, 2))


class _SlowWindows(torch.utils.data.Dataset):
    """Byte windows that take a while to load (so a short job lasts long enough to hurt)."""

    def __init__(self, inner: torch.utils.data.Dataset, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int):  # noqa: ANN204
        time.sleep(self.delay_s)
        return self.inner[index]


def slow_small_job():  # noqa: ANN201 - a liveput.Job, resolved by agents as runtime_cluster:...
    """tiny-gpt-small whose samples take 15 ms each to load."""
    from liveput.models.jobs import TinyGPTJobConfig, tiny_gpt_job

    job = tiny_gpt_job(
        TinyGPTJobConfig(
            num_blocks=2,
            d_model=64,
            seq_len=32,
            global_batch_size=8,
            micro_batch_size=2,
            learning_rate=0.02,
            sgd=True,
            corpus_bytes=200_000,
        )
    )
    job.dataset = _SlowWindows(job.dataset, 0.015)
    return job


@POLICIES.register("test-fixed-1x2")
class Fixed1x2(Policy):
    """Wants (1, 2) whatever happens."""

    name = "test-fixed-1x2"

    def decide(self, observation: Observation) -> Decision:
        return Decision(Configuration(1, 2))
