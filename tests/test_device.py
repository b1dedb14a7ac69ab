"""--device from every entry point: what a request means on this machine, the one-line error of a
CUDA request without CUDA (train, the agent's two entry points, the job file), and the GPUs of an
instance type the job leaves idle (a warning when emulated, an error with a real provider)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from liveput.errors import LiveputError
from liveput.runtime.device import (
    check_device_request,
    idle_gpus_message,
    resolve_device,
    unused_gpus,
)

ROOT = Path(__file__).resolve().parents[1]


def _no_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_is_the_first_gpu_where_there_is_one_else_the_cpu(monkeypatch):
    _no_cuda(monkeypatch)
    assert resolve_device("auto", "train") == "cpu"
    assert resolve_device("cpu", "train") == "cpu"
    _gpus(monkeypatch, 2)
    assert resolve_device("auto", "train") == "cuda:0"
    assert resolve_device("cpu", "train") == "cpu"
    assert resolve_device("cuda:1", "train") == "cuda:1"


def test_agents_sharing_a_machine_spread_over_its_gpus(monkeypatch):
    _gpus(monkeypatch, 2)
    assert [resolve_device("cuda", "agent", instance) for instance in range(4)] == [
        "cuda:0",
        "cuda:1",
        "cuda:0",
        "cuda:1",
    ]
    assert resolve_device("cuda", "agent") == "cuda:0"  # an instance of its own: its first GPU


def test_a_cuda_request_without_cuda_or_a_missing_gpu_is_one_line(monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(
        LiveputError,
        match=r"^agent 7: --device cuda requested but this "
        r"machine has no CUDA device",
    ):
        resolve_device("cuda", "agent 7")
    _gpus(monkeypatch, 1)
    with pytest.raises(LiveputError, match="--device cuda:2: this machine has 1 GPU"):
        resolve_device("cuda:2", "train")
    for bad in ("gpu", "cuda:", "CUDA", "cuda:x", ""):
        with pytest.raises(LiveputError, match="expected auto, cpu, cuda or cuda:K"):
            check_device_request(bad, "train")


def test_idle_gpus_of_an_instance_type_are_named():
    assert unused_gpus(8, "cpu") == 8 and unused_gpus(8, "cuda:0") == 7
    assert unused_gpus(1, "cuda") == 0 and unused_gpus(0, "cpu") == 0
    assert idle_gpus_message("p3.2xlarge", 1, "V100", "cuda:0") is None
    assert idle_gpus_message("c5.xlarge", 0, "", "cpu") is None
    message = idle_gpus_message("p4d.24xlarge", 8, "A100", "cpu")
    assert "8 A100 GPU(s)" in message and "trains on the CPU" in message
    message = idle_gpus_message("p4d.24xlarge", 8, "A100", "cuda")
    assert "one agent per instance" in message and "7 are billed and stay idle" in message


def test_a_real_provider_refuses_idle_gpus_and_the_emulated_one_warns(monkeypatch, capsys):
    from liveput.launch.remote import check_gpu_use

    with pytest.raises(
        LiveputError, match="p4d.24xlarge has 8 A100 GPUs: liveput runs one agent per instance"
    ):
        check_gpu_use("aws", ("p3.2xlarge", "p4d.24xlarge"), "auto")
    with pytest.raises(LiveputError, match="trains on the CPU"):
        check_gpu_use("aws", ("p3.2xlarge",), "cpu")
    assert check_gpu_use("aws", ("p3.2xlarge", "c5.xlarge"), "auto") == []  # every GPU used
    _no_cuda(monkeypatch)
    warnings = check_gpu_use("emulated", ("p4d.24xlarge",), "auto")  # agents here, on the CPU
    assert len(warnings) == 1
    assert "p4d.24xlarge has 8 A100 GPU(s) but the job trains on the CPU" in " ".join(
        warnings[0].split()
    )


def _run(arguments: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
        **env,
    }
    return subprocess.run(
        [sys.executable, *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _one_line(completed: subprocess.CompletedProcess, expected: str) -> None:
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in completed.stderr, completed.stderr
    assert expected in lines[0]


def test_train_asked_for_cuda_without_cuda_is_one_line_and_starts_nothing(
    tmp_path, monkeypatch, capsys
):
    from liveput.cli.main import main

    _no_cuda(monkeypatch)
    logs = tmp_path / "logs"
    argv = ["train", "--device", "cuda", "--workers", "1", "--steps", "1", "--log-dir", str(logs)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("error: train: --device cuda requested but this machine has no CUDA")
    assert not logs.exists()
    assert main(["train", "--device", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: train: device 'gpu': expected auto, cpu, cuda or cuda:K"]


@pytest.mark.slow
@pytest.mark.process
def test_an_agent_asked_for_cuda_without_cuda_exits_with_one_line(tmp_path):
    """By the job's spec (``python -m liveput.runtime``) or its own --device (``liveput
    agent``): exit 2, one line, and it never joins the job."""
    from liveput.runtime.launch import JobSpec, publish_spec
    from liveput.runtime.store import SignedStore, TCPStoreBackend

    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, "device-token")
    try:
        publish_spec(store, JobSpec("tiny-gpt-small", str(tmp_path / "ckpt"), device="cuda"))
        completed = _run(
            ["-m", "liveput.runtime", "--store", hosted.url, "--instance", "3"],
            LIVEPUT_TOKEN="device-token",
        )
        _one_line(
            completed, "error: agent 3: --device cuda requested but this machine has no CUDA device"
        )
        publish_spec(store, JobSpec("tiny-gpt-small", str(tmp_path / "ckpt"), device="cpu"))
        completed = _run(
            [
                "-m",
                "liveput.cli.main",
                "agent",
                "--store",
                hosted.url,
                "--instance",
                "4",
                "--device",
                "cuda:1",
                "--notices",
                "sigterm",
            ],
            LIVEPUT_TOKEN="device-token",
        )
        _one_line(
            completed, "agent 4: --device cuda:1 requested but this machine has no CUDA device"
        )
        assert store.get_prefix("members/") == {}
    finally:
        store.close()


def test_the_job_file_takes_a_device_and_refuses_a_bad_one(tmp_path):
    from liveput.operate.jobfile import load_job_file

    path = tmp_path / "job.yaml"
    path.write_text("model: tiny-gpt\nsteps: 5\ndevice: cuda\n")
    assert load_job_file(path).device == "cuda"
    path.write_text("model: tiny-gpt\nsteps: 5\n")
    assert load_job_file(path).device == "auto"
    path.write_text("model: tiny-gpt\nsteps: 5\ndevice: gpu\n")
    with pytest.raises(LiveputError, match="device 'gpu': expected auto, cpu, cuda or cuda:K"):
        load_job_file(path)


def test_status_shows_the_device_each_billed_instance_trains_on():
    """From the agents' registrations: a running one, a joining one, one registered before
    agents said their device (the CPU); a lost one is no longer shown."""
    import json
    from types import SimpleNamespace

    from liveput.cli.output import device_counts
    from liveput.operate.recorder import RecorderConfig, StatusRecorder
    from liveput.runtime.store import MemoryStore

    store = MemoryStore()
    gpu = "cuda:0 (NVIDIA H100 80GB HBM3)"
    store.set("members/1", json.dumps({"host": "h", "market": "spot", "device": gpu}).encode())
    store.set("members/2", json.dumps({"host": "h", "market": "spot", "device": gpu}).encode())
    store.set("members/3", json.dumps({"host": "h", "market": "spot"}).encode())
    store.set("members/4", json.dumps({"host": "h", "market": "spot", "device": gpu}).encode())
    store.set("lost/4", b"1")
    recorder = StatusRecorder(store, RecorderConfig(job="j", num_steps=10, global_batch_size=8))
    coordinator = SimpleNamespace(plan=None, committed=-1, available=[1, 3], status="waiting")
    snapshot = recorder.record(coordinator, 0.0, force=True)
    assert snapshot["devices"] == {"1": gpu, "2": gpu, "3": "cpu"}
    assert device_counts(snapshot["devices"]) == f"cpu x 1, {gpu} x 2"
    assert device_counts({}) == "-"


def test_the_job_profile_is_measured_on_the_device_and_precision_asked(monkeypatch):
    """Kept in the store per (job, data, device, precision): a coordinator that restarts with
    the same reuses it; one asking for another device or precision measures again."""
    from liveput.perf import load_profile
    from liveput.runtime import planning
    from liveput.runtime.launch import job_profile
    from liveput.runtime.store import MemoryStore

    measured = []
    stand_in = load_profile("gpt-1.5b")  # a built-in table: what is kept matters, not its values

    def profile_job(job, repeats=2, device="cpu"):
        measured.append((device, job.training.precision))
        return stand_in

    monkeypatch.setattr(planning, "profile_job", profile_job)
    store = MemoryStore()
    job_profile(store, "tiny-gpt-small", None, "cpu", "bf16")
    job_profile(store, "tiny-gpt-small", None, "cpu", "bf16")
    assert measured == [("cpu", "bf16")]
    job_profile(store, "tiny-gpt-small", None, "cuda:0", "bf16")
    job_profile(store, "tiny-gpt-small", None, "cuda:0")
    assert measured == [("cpu", "bf16"), ("cuda:0", "bf16"), ("cuda:0", "fp32")]
