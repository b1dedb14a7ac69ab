"""The control plane fails: the coordinator is killed and restarted, the etcd store restarts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runtime_cluster import (
    JOB,
    TOKEN,
    AgentProcesses,
    assert_same_parameters,
    final_parameters,
    reference_parameters,
)
from runtime_fixtures import free_port

from liveput.models.jobs import resolve_job
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.store import open_store
from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd
from liveput.testbed import free_port_pair

STEPS = 100


def start_coordinator(url: str, checkpoint_dir: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "LIVEPUT_TOKEN": TOKEN}  # the tests' folder is on its path (conftest)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "liveput.cli.main",
                "-v",
                "coordinator",
                "--store",
                url,
                "--model",
                JOB,
                "--steps",
                str(STEPS),
                "--workers",
                "3",
                "--capacity",
                "4",
                "--checkpoint-dir",
                str(checkpoint_dir),
                "--checkpoint-every",
                "3",
                "--interval",
                "1",
                "--heartbeat-timeout",
                "2",
            ],
            env=env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )


def steps_recorded(store) -> int:  # noqa: ANN001
    """Steps in the ledger's final lineage (records, and those folded into its summary)."""
    return verify_ledger(store, resolve_job(JOB).global_batch_size, STEPS).steps_applied


def wait_until(condition, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def wait_exit(
    process: subprocess.Popen, timeout_s: float, log: Path, agents: AgentProcesses
) -> int:
    """The coordinator's exit code; on a timeout, fail with its log and the agents' last lines."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tails = {i: agents.log(i).splitlines()[-15:] for i in agents.processes}
        raise AssertionError(
            f"coordinator still running after {timeout_s:.0f} s; its log: "
            f"{log.read_text()[-4000:]}\nagents' last lines: {tails}"
        ) from None


def test_coordinator_restart_and_etcd_restart_lose_nothing(etcd_server, etcd_url, tmp_path):
    store = open_store(etcd_url, token=TOKEN)
    agents = AgentProcesses(etcd_url, tmp_path)
    log = tmp_path / "coordinator.log"
    coordinator = start_coordinator(etcd_url, tmp_path / "ckpt", log)
    try:
        for instance in range(3):
            agents.start(instance)
        wait_until(lambda: steps_recorded(store) >= 5, 180, "training")
        # The coordinator dies; an agent dies while it is down; a new coordinator takes over.
        coordinator.kill()
        coordinator.wait(timeout=10)
        agents.kill(2)
        at_kill = steps_recorded(store)
        coordinator = start_coordinator(etcd_url, tmp_path / "ckpt", log)
        wait_until(lambda: steps_recorded(store) >= at_kill + 5, 180, "training after restart")
        # The store itself restarts (same data) in the middle of training.
        etcd_server.restart(down_s=1.0)
        assert wait_exit(coordinator, 240, log, agents) == 0, log.read_text()[-3000:]
        codes = agents.wait_all(timeout_s=120)
        assert codes[0] == 0 and codes[1] == 0, agents.log(0)[-2000:]
        report = verify_ledger(store, resolve_job(JOB).global_batch_size, STEPS)
        assert report.exactly_once, report.problems
        assert "coordinator recovered" in log.read_text()
        assert_same_parameters(final_parameters(tmp_path / "ckpt", 4), reference_parameters(STEPS))
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait(timeout=10)
        agents.close()
        store.close()


def start_owning_coordinator(
    listen: str, etcd_dir: Path, checkpoint_dir: Path, log: Path, steps: int
) -> subprocess.Popen:
    """``liveput coordinator`` with no --store: it runs its own etcd in ``etcd_dir``."""
    env = {**os.environ, "LIVEPUT_TOKEN": TOKEN}  # the tests' folder is on its path (conftest)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "liveput.cli.main",
                "-v",
                "coordinator",
                "--listen",
                listen,
                "--etcd-dir",
                str(etcd_dir),
                "--model",
                JOB,
                "--steps",
                str(steps),
                "--workers",
                "2",
                "--capacity",
                "2",
                "--checkpoint-dir",
                str(checkpoint_dir),
                "--checkpoint-every",
                "3",
                "--interval",
                "1",
                "--heartbeat-timeout",
                "2",
            ],
            env=env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )


def test_a_coordinator_owning_its_etcd_crashes_with_it_and_a_restart_resumes_the_job(tmp_path):
    """The coordinator's machine crashes (coordinator and etcd SIGKILLed); the coordinator
    restarted on the same --etcd-dir starts etcd again from its data and finishes the job."""
    steps = 30
    port, etcd_dir = free_port_pair(), tmp_path / "etcd"
    url = f"etcd://127.0.0.1:{port}"
    log = tmp_path / "coordinator.log"
    coordinator = start_owning_coordinator(
        f"127.0.0.1:{port}", etcd_dir, tmp_path / "ckpt", log, steps
    )
    agents = AgentProcesses(url, tmp_path)
    store = None
    try:
        # The pid file comes before etcd answers (a crashed owner's etcd must be found even if
        # it never did); the coordinator says the store's address once it answers.
        wait_until(
            lambda: (
                "store: etcd://" in log.read_text(errors="replace")
                or coordinator.poll() is not None
            ),
            60,
            "the coordinator's etcd",
        )
        assert coordinator.poll() is None, log.read_text()[-2000:]
        etcd_pid = int((etcd_dir / "etcd.pid").read_text())
        store = open_store(url, token=TOKEN)
        for instance in range(2):
            agents.start(instance)
        wait_until(lambda: steps_recorded(store) >= 6, 120, "training")
        coordinator.kill()
        coordinator.wait(timeout=10)
        os.kill(etcd_pid, signal.SIGKILL)  # the machine went down: its etcd with it
        coordinator = start_owning_coordinator(
            f"127.0.0.1:{port}", etcd_dir, tmp_path / "ckpt", log, steps
        )
        assert wait_exit(coordinator, 120, log, agents) == 0, log.read_text()[-3000:]
        assert agents.wait_all(timeout_s=60) == {0: 0, 1: 0}, agents.log(0)[-2000:]
        text = log.read_text()
        assert "coordinator recovered" in text and "job done" in text
        assert not (etcd_dir / "etcd.pid").exists()  # stopped at the job's end
        # Its data is still on disk: a server on it holds the finished job's exactly-once ledger.
        server = LocalEtcd(
            EtcdConfig(etcd_dir, client_port=port, peer_port=free_port(), die_with_parent=True)
        )
        server.start()
        try:
            with open_store(server.url, token=TOKEN) as reopened:
                report = verify_ledger(reopened, resolve_job(JOB).global_batch_size, steps)
                assert reopened.get("job/done") is not None
        finally:
            server.stop()
        assert report.exactly_once, report.problems
        assert_same_parameters(final_parameters(tmp_path / "ckpt", 4), reference_parameters(steps))
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait(timeout=10)
        agents.close()
        if store is not None:
            store.close()
        if (etcd_dir / "etcd.pid").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int((etcd_dir / "etcd.pid").read_text()), signal.SIGKILL)


def test_coordinator_without_etcd_installed_says_what_to_install(tmp_path):
    env = {**os.environ, "LIVEPUT_TOKEN": TOKEN, "PATH": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "liveput.cli.main",
            "coordinator",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--etcd-dir",
            str(tmp_path / "etcd"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "etcd-server" in lines[0] and "--store" in lines[0], result.stderr


def test_a_coordinator_started_during_a_store_outage_waits_as_long_as_told(
    etcd_server, etcd_url, tmp_path
):
    """A restarted coordinator may find etcd restarting: it waits ``--store-wait`` (default as
    long as the agents ride out an outage) for it, then says in one line that it is gone."""
    etcd_server.stop()
    try:
        command = [
            sys.executable,
            "-m",
            "liveput.cli.main",
            "coordinator",
            "--store",
            etcd_url,
            "--model",
            JOB,
            "--steps",
            "5",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
        ]
        env = {**os.environ, "LIVEPUT_TOKEN": TOKEN}
        started = time.monotonic()
        refused = subprocess.run(
            [*command, "--store-wait", "1"], env=env, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2, refused.stderr
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "unreachable" in lines[0] and etcd_url in lines[0], (
            refused.stderr
        )
        assert time.monotonic() - started < 30  # not the 30 s of a store call's own retries
        waiting = subprocess.Popen(
            [*command, "--store-wait", "60"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        try:
            time.sleep(4)
            assert waiting.poll() is None, waiting.stderr.read().decode()
            etcd_server.start()
            with open_store(etcd_url, token=TOKEN) as store:
                wait_until(
                    lambda: store.get("job/spec") is not None,
                    60,
                    "the waiting coordinator to publish the job",
                )
        finally:
            waiting.kill()
            waiting.wait(timeout=10)
    finally:
        if etcd_server.process is None:
            etcd_server.start()
