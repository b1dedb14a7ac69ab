"""Operating a run: checkpoint retention, an agent whose store is gone, a job's end seen by a
spare, `liveput train` stopped."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from runtime_cluster import JOB, TOKEN, AgentProcesses

from liveput.models.jobs import resolve_job
from liveput.runtime import keys
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint, reset_latest
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.launch import JobSpec, publish_spec
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.planning import profile_job
from liveput.runtime.store import MemoryStore, SignedStore, TCPStoreBackend


def test_only_the_newest_complete_checkpoints_stay_on_disk(tmp_path):
    store = MemoryStore()
    job = resolve_job(JOB)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(store, str(tmp_path), keep=2)
    for step in (4, 9, 14, 19, 24):
        checkpointer.save_async(0, step, layers, job.num_layers)
        checkpointer.flush()
    checkpointer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-19", "step-24"]
    assert latest_checkpoint(store) == 24
    assert checkpointer.load_layer(19, 0)["module"].keys() == layers[0].module.state_dict().keys()


def test_a_checkpoint_that_is_not_the_latest_never_prunes_the_latest(tmp_path):
    """A restore to step 4 (epoch 1) may be reading step-4 while older writes still finish."""
    store = MemoryStore()
    job = resolve_job(JOB)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(store, str(tmp_path), keep=1)
    checkpointer.save_async(0, 4, layers, job.num_layers)
    checkpointer.flush()
    reset_latest(store, 1, 4)
    checkpointer.save_async(1, 2, layers, job.num_layers)  # completes, but is not the latest
    checkpointer.close()
    assert latest_checkpoint(store) == 4 and (tmp_path / "step-4").is_dir()


def test_a_checkpoint_an_evaluation_still_reads_is_pruned_only_once_it_is_read(tmp_path):
    """Evaluations run behind training (on a busy machine, two checkpoints behind): the one of
    step 1 stays on disk until its result is recorded, then goes at the next prune. Before, it
    was pruned under the evaluation, whose result became a FileNotFoundError."""
    store = MemoryStore()
    job = resolve_job(JOB)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(store, str(tmp_path), keep=2)
    checkpointer.still_read = lambda step: step == 1 and store.get(keys.evaluation(1)) is None

    def save(step: int) -> list[str]:
        checkpointer.save_async(0, step, layers, job.num_layers)
        checkpointer.flush()
        return sorted(p.name for p in tmp_path.iterdir())

    assert save(1) == ["step-1"] and save(3) == ["step-1", "step-3"]
    assert save(4) == ["step-1", "step-3", "step-4"]
    assert checkpointer.load_layer(1, 0)["module"].keys() == layers[0].module.state_dict().keys()
    store.set(keys.evaluation(1), b'{"step": 1, "epoch": 0}')
    assert save(5) == ["step-4", "step-5"]
    checkpointer.close()


@pytest.mark.process
def test_an_agent_whose_store_is_gone_exits_by_itself(tmp_path):
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), store_outage_s=2.0))
    agents = AgentProcesses(hosted.url, tmp_path)
    try:
        agent = agents.start(0)
        deadline = time.monotonic() + 60
        while store.get("state/0") != b"waiting":  # joined, waiting for a plan
            assert time.monotonic() < deadline, agents.log(0)
            time.sleep(0.1)
        store.close()  # the coordinator and its store are gone
        gone_at = time.monotonic()
        code = agent.wait(timeout=30)
        assert code != 0 and time.monotonic() - gone_at < 15
        log = agents.log(0)
        assert "unreachable" in log
        assert len(log.splitlines()) < 40, log  # repeated errors condensed, no stack frames
    finally:
        agents.close()


@pytest.mark.process
def test_a_spare_sees_the_job_end_before_the_store_ends_with_its_coordinator(tmp_path):
    """The embedded store ends with the coordinator. A spare that had not yet read ``job/done``
    used to wait out a 120-s store outage and exit with an error (the netns test's flake)."""
    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, TOKEN)
    publish_spec(store, JobSpec(JOB, str(tmp_path / "ckpt"), checkpoint_every=5))
    agents = AgentProcesses(hosted.url, tmp_path)
    job = resolve_job(JOB)
    try:
        for instance in range(3):
            agents.start(instance)
        deadline = time.monotonic() + 90
        while any(store.get(f"state/{i}") != b"waiting" for i in range(3)):
            assert time.monotonic() < deadline, [agents.log(i) for i in range(3)]
            time.sleep(0.1)
        coordinator = Coordinator(
            store,
            profile_job(job, repeats=1),
            CoordinatorConfig(
                num_steps=6,
                num_micro_batches=job.num_micro_batches,
                capacity=2,
                initial_workers=2,
                interval_s=1.0,
                tick_s=0.05,
                heartbeat_timeout_s=2.0,
            ),
        )
        coordinator.run()
        assert len([s for s in coordinator.plan.slots.values() if s is not None]) == 2
        store.close()  # as `liveput coordinator` does when the job is done
        ended_at = time.monotonic()
        codes = agents.wait_all(timeout_s=30)
        assert codes == {0: 0, 1: 0, 2: 0}, [agents.log(i)[-1500:] for i in range(3)]
        assert time.monotonic() - ended_at < 10
    finally:
        agents.close()


@pytest.mark.process
def test_liveput_train_terminated_stops_its_agents(tmp_path):
    logs = tmp_path / "logs"
    err_path = tmp_path / "train.err"
    with open(err_path, "wb") as err_file:
        train = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "liveput.cli.main",
                "-v",
                "train",
                "--model",
                "tiny-gpt-small",
                "--workers",
                "2",
                "--steps",
                "5000",
                "--time-scale",
                "10",
                "--log-dir",
                str(logs),
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--checkpoint-every",
                "5",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "ckpt").glob("step-*")):  # training is under way
            assert time.monotonic() < deadline and train.poll() is None, err_path.read_text()
            time.sleep(0.2)
        train.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        train.wait(timeout=30)
        assert time.monotonic() - stopped_at < 15
        err = err_path.read_text(errors="replace")
        assert train.returncode == 130, err[-2000:]
        assert f"logs in {logs}" in err and sorted(p.name for p in logs.iterdir())
        pids = [
            int(p) for p in re.findall(r"emulated launch at [\d.]+ s: i-\d+ .*\(pid (\d+)\)", err)
        ]
        assert pids
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    state = stat.read().split()[2]
            except FileNotFoundError:
                continue
            assert state == "Z", f"agent {pid} still runs"
    finally:
        if train.poll() is None:
            train.kill()
            train.wait()
