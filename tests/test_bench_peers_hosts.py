"""The peers benchmark's instances on hosts of their own (network namespaces, shaped links): where
the pool places each instance, and liveput's and torchrun's jobs training across such hosts."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from bench.peers_hosts import SPARE_HOSTS, HostPool, shaped_hosts
from bench.peers_run import RunSettings, run_liveput, run_torchrun
from liveput.cloud.processes import LaunchSpec
from liveput.models.jobs import resolve_job
from liveput.traces import Trace

pytestmark = pytest.mark.process  # namespaces, and the systems' processes

SUBNET = "10.79.0"
"""Neither the other tests' subnet nor the benchmark's: they may run at once."""


def _spec(tmp_path: Path, number: int) -> LaunchSpec:
    return LaunchSpec(f"i-{number:04d}", tmp_path / f"notice-{number}")


def _address_seen(log: Path) -> tuple[str, str]:
    """(the address of eth0 inside the process's namespace, the ``{host}`` it was given)."""
    text = log.read_text()
    inside = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/24", text)
    given = re.search(r"host=(\S+)", text)
    assert inside and given, text
    return inside.group(1), given.group(1)


def test_each_instance_runs_on_a_free_host_and_a_gone_instance_frees_its_host(
    tmp_path: Path,
) -> None:
    template = ["sh", "-c", "ip -o -4 addr show dev eth0; echo host={host}; exec sleep 60"]
    with shaped_hosts(1, 1000.0, SUBNET) as hosts:
        pool = HostPool(hosts)
        launch = pool.launcher(template, dict(os.environ), tmp_path, tmp_path)
        processes = [launch(_spec(tmp_path, n)) for n in range(1 + SPARE_HOSTS)]
        try:
            for n in range(len(processes)):
                _wait_for_output(tmp_path / f"i-{n:04d}.log")
            with pytest.raises(RuntimeError, match="all 3 hosts are busy"):
                launch(_spec(tmp_path, 9))
            # Killing the first instance (and what it started) frees its host for the next.
            processes[0].kill()
            processes[0].wait(timeout=10)
            processes.append(launch(_spec(tmp_path, 3)))
            _wait_for_output(tmp_path / "i-0003.log")
            seen = [_address_seen(tmp_path / f"i-{n:04d}.log") for n in range(4)]
        finally:
            for process in processes:
                if process.poll() is None:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)
    # Inside each namespace its own address is the one the template was given, one host each.
    assert [inside for inside, _ in seen] == [given for _, given in seen]
    assert [inside for inside, _ in seen] == [f"{SUBNET}.{n}" for n in (1, 2, 3, 1)]


def _wait_for_output(log: Path, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "host=" in log.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{log} has no output after {timeout_s} s")


def _settings(tmp_path: Path) -> RunSettings:
    return RunSettings(
        job="tiny-gpt",
        time_scale=4.0,
        # A bound: each run ends once it committed 4 steps and a checkpoint of them is complete
        # (about 10 s for torchrun-fsdp's four interpreters importing torch on a quiet machine,
        # 21-24 s in a CI run under the suite's load).
        window_s=60.0,
        stop_at_step=4,
        checkpoint_every=2,
        link_mbit=1000.0,
        subnet=SUBNET,
        work_dir=str(tmp_path),
        object_store=True,
    )


def _constant(instances: int, settings: RunSettings) -> Trace:
    return Trace("constant", instances, [], [], [], settings.window_s * settings.time_scale)


@pytest.mark.parametrize("system", ["liveput", "torchrun-fsdp"])
def test_a_system_trains_across_shaped_hosts_and_checkpoints_through_their_links(
    tmp_path: Path, system: str
) -> None:
    """Two instances, each in its own namespace, reach the store on the gateway and each other
    over their shaped links, and train; their checkpoints go to the object store on the
    gateway, from the instances' own addresses (through their links)."""
    settings = _settings(tmp_path)
    trace = _constant(2, settings)
    work = tmp_path / "run"
    if system == "liveput":
        run = run_liveput(trace, settings, work, "liveput", "liveput")
    else:
        work.mkdir()
        # Both instances in the first rendezvous round. With a minimum of one, a CI run under
        # load had one agent close a round alone 1 s before the other arrived; the membership
        # change then stopped its worker (SIGTERM) to start a round of two, and no host logged
        # anything more, nor trained a step, in the 45 s left of the window.
        run = run_torchrun(trace, settings, work, "bench.peers_fsdp", "torchrun-fsdp", minimum=2)
    logs = "\n".join(p.read_text(errors="replace") for p in (work / "logs").glob("*"))
    assert run.samples >= 4 * resolve_job(settings.job).global_batch_size, logs
    assert run.timeline[-1][0] < settings.window_s  # it stopped at its step, not the window
    requests = (work / "logs" / "object-store.log").read_text()
    writes = re.findall(
        rf'^({re.escape(SUBNET)}\.\d+) .*"(?:PUT|POST) /peers/{work.name}/checkpoints/step-',
        requests,
        re.MULTILINE,
    )
    assert writes and f"{SUBNET}.254" not in writes, requests[-2000:]
