"""The one assembly of a job (launch/assemble.py) and the one agent entry (runtime/entry.py)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from liveput.errors import LiveputError
from liveput.launch.assemble import DEFAULTS, JobRequest, assemble_job
from liveput.launch.deadline import DeadlineJob
from liveput.launch.local import LocalTrainingConfig, detection_times_s, job_request
from liveput.models.training import TrainingConfig
from liveput.perf import load_profile
from liveput.runtime.entry import (
    AGENT_MODULE,
    LEAN_NOTICES,
    agent_command,
    parse_notices,
    wants_agent,
)
from liveput.testbed import free_port
from liveput.traces import IntervalTrace


def test_a_job_on_real_machines_is_assembled_from_the_shared_defaults():
    assembled = assemble_job(JobRequest("tiny-gpt", 50, "ckpt", capacity=4, notice_margin_s=7.0))
    spec, config = assembled.spec, assembled.config
    assert (config.start_grace_s, config.heartbeat_timeout_s) == (30.0, 3.0)
    assert config.start_grace_s == DEFAULTS.start_grace_s
    assert (config.interval_s, config.policy_interval_s) == (60.0, 60.0)
    # The margin the coordinator plans with is the one the agents read from the spec.
    assert config.notice_margin_s == spec.notice_margin_s == 7.0
    assert spec.store_outage_s == DEFAULTS.store_outage_s and not spec.shared_gpu
    assert config.prune.fold_ledger and config.capacity == 4 and config.num_steps == 50
    assert config.num_micro_batches == assembled.job.num_micro_batches
    assert (spec.checkpoint_every, spec.keep_checkpoints, spec.device) == (10, 2, "auto")
    assert assembled.deadline is None and assembled.profile is None


def test_a_local_job_scales_its_intervals_and_detection_time_with_the_time_scale():
    config = LocalTrainingConfig(workers=6, steps=20, time_scale=5.0, notice_margin_s=4.0)
    assembled = assemble_job(job_request(config, "ckpt", initial=3))
    # One decision interval is one trace minute: 12 wall seconds at time scale 5; an agent is
    # dead after two of them; the store dies with this process, as long after.
    assert (assembled.config.interval_s, assembled.config.policy_interval_s) == (12.0, 60.0)
    assert assembled.config.heartbeat_timeout_s == assembled.spec.store_outage_s == 24.0
    assert assembled.config.initial_workers == 3 and assembled.config.capacity == 6
    assert assembled.config.start_grace_s == DEFAULTS.start_grace_s
    assert assembled.spec.shared_gpu and not assembled.config.prune.fold_ledger
    assert assembled.config.notice_margin_s == assembled.spec.notice_margin_s == 4.0
    assert detection_times_s(config) == (24.0, 24.0)
    assert detection_times_s(LocalTrainingConfig(time_scale=1.0, heartbeat_timeout_s=4.0)) == (
        4.0,
        120.0,
    )


def test_the_requests_training_options_reach_the_job_and_the_published_spec():
    training = TrainingConfig(precision="bf16", clip_grad_norm=1.0)
    assembled = assemble_job(JobRequest("tiny-gpt", 5, "ckpt", training=training))
    assert assembled.job.training == training
    assert assembled.spec.training == training.to_dict()
    assert assemble_job(JobRequest("tiny-gpt", 5, "ckpt")).spec.training is None


def test_a_deadline_job_gets_its_policy_context_and_its_on_demand_capacity():
    zeros = np.zeros(400, dtype=int)
    trace = IntervalTrace("flat", 60.0, np.full(400, 16), zeros, zeros)
    profile = load_profile("gpt-1.5b")  # built in: nothing measured here
    deadline = DeadlineJob(5.0, on_demand_max=16, instance_type="p3.2xlarge", policy="greedy")
    # The job's own activation checkpointing is the profile's: gpt-1.5b fits only with it.
    recompute = TrainingConfig(activation_checkpointing=True)
    request = JobRequest("tiny-gpt", 20, "ckpt", capacity=16, deadline=deadline, training=recompute)
    with pytest.raises(LiveputError, match="needs the job's profile and a spot trace"):
        assemble_job(request)
    apart = assemble_job(request, profile=profile, trace=trace)
    assert apart.deadline is not None and apart.deadline.on_demand_max == 16
    assert apart.config.policy == "greedy" and apart.config.capacity == 16
    assert apart.profile is not None and apart.profile.activation_checkpointing == "layer"
    with pytest.raises(LiveputError, match="no configuration of gpt-1.5b fits"):
        assemble_job(dataclasses.replace(request, training=None), profile=profile, trace=trace)
    # liveput train: the trace's spot workers, and the on-demand ones on top.
    on_top = assemble_job(
        dataclasses.replace(request, on_demand_on_top=True), profile=profile, trace=trace
    )
    assert on_top.config.capacity == 32


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"notice_margin_s": -1.0}, "--notice-margin"),
        ({"start_grace_s": -0.5}, "--start-grace"),
        ({"heartbeat_timeout_s": 0.0}, "--heartbeat-timeout must be positive"),
        ({"time_scale": 0.0}, "time scale"),
        ({"capacity": 0}, "capacity"),
    ],
)
def test_a_bad_request_is_a_one_line_error(changes, message):
    with pytest.raises(LiveputError, match=message):
        JobRequest("tiny-gpt", 10, "ckpt", **changes)


def test_every_launcher_gets_the_same_agent_command_line():
    assert agent_command("tcp://h:1", python="py") == [
        "py",
        "-m",
        AGENT_MODULE,
        "--store",
        "tcp://h:1",
        "--notices",
        LEAN_NOTICES,
    ]
    argv = agent_command(
        "etcd://h:2", notices="sigterm", instance=7, host="10.0.0.2", device="cpu", python="py"
    )
    assert argv[3:] == [
        "--store",
        "etcd://h:2",
        "--notices",
        "sigterm",
        "--instance",
        "7",
        "--host",
        "10.0.0.2",
        "--device",
        "cpu",
    ]


def test_notice_sources_and_the_agent_command_are_read_as_the_entry_points_do():
    assert parse_notices(" aws, sigterm ,") == ["aws", "sigterm"]
    for bad in ("bogus", "aws,carrier-pigeon", ","):
        with pytest.raises(LiveputError, match="--notices"):
            parse_notices(bad)
    assert wants_agent(["agent", "--store", "x"]) and wants_agent(["-v", "-q", "agent"])
    assert not wants_agent(["train", "--model", "agent"]) and not wants_agent(["--help"])


def test_the_job_files_notice_margin_is_read_and_checked():
    from liveput.operate.jobfile import NoticeSpec, parse_job_file

    assert NoticeSpec().margin_s == "auto" and NoticeSpec().margin_seconds is None
    assert DEFAULTS.notice_margin_s is None  # auto, as --notice-margin's default
    job = parse_job_file("model: tiny-gpt\nnotices:\n  lead_s: 30\n  margin_s: 5\n")
    assert job.notices.margin_s == 5.0 and job.notices.margin_seconds == 5.0
    job = parse_job_file("model: tiny-gpt\nnotices:\n  margin_s: auto\n")
    assert job.notices.margin_seconds is None
    with pytest.raises(LiveputError, match=r"job.yaml:3: notices: margin_s must be a number"):
        parse_job_file("model: tiny-gpt\nnotices:\n  margin_s: soon\n")
    with pytest.raises(LiveputError, match=r"job.yaml:3: notices: margin_s must be >= 0"):
        parse_job_file("model: tiny-gpt\nnotices:\n  margin_s: -2\n")


def test_train_and_launch_read_a_job_file_the_one_same_way(tmp_path):
    """``liveput train --job`` and ``liveput launch`` map a job file through one function: its
    notice margin, checkpoints, provider and deadline; the caller adds its own store and logs."""
    from liveput.operate.job_training import job_trace, training_config
    from liveput.operate.jobfile import load_job_file

    path = tmp_path / "job.yaml"
    path.write_text(
        "model: tiny-gpt\nsteps: 3\nnotices:\n  margin_s: 6.5\n  lead_s: 40\n"
        "checkpoint:\n  every: 7\n  keep: 2\nprovider:\n  workers: 3\n  trace_seed: 5\n"
        "objective:\n  kind: deadline\n  deadline_hours: 2\n"
    )
    job = load_job_file(path)
    config = training_config(job, 3, log_dir="here", token="t")
    assert (config.notice_margin_s, config.notice_lead_s) == (6.5, 40.0)
    assert (config.checkpoint_every, config.keep_checkpoints) == (7, 2)
    assert (config.workers, config.seed, config.steps) == (3, 5, 3)
    assert config.deadline is not None and config.deadline.deadline_hours == 2.0
    assert (config.log_dir, config.token) == ("here", "t")
    from liveput.launch.local import default_trace

    trace = job_trace(job)
    same = default_trace(3, 5)
    assert (trace.end_s, trace.initial_count, list(trace.times_s)) == (
        same.end_s,
        same.initial_count,
        list(same.times_s),
    )


def test_the_coordinator_refuses_a_bad_notice_margin_in_one_line(capsys):
    from liveput.cli.main import main

    assert main(["coordinator", "--notice-margin", "-3", "--embedded"]) == 2
    err = capsys.readouterr().err
    assert "--notice-margin" in err and "must be" in err and len(err.strip().splitlines()) == 1
    assert main(["coordinator", "--notice-margin", "soon", "--embedded"]) == 2
    err = capsys.readouterr().err
    assert "--notice-margin" in err and "not a number" in err and len(err.strip().splitlines()) == 1


def test_the_notice_margin_is_seconds_or_auto_and_auto_by_default():
    import inspect

    from liveput.cli import params, train

    assert params.notice_margin("auto") is None and params.notice_margin(" Auto ") is None
    assert params.notice_margin("7.5") == 7.5
    default = inspect.signature(train.train).parameters["notice_margin_s"].default
    assert default is None  # auto
    config = assemble_job(JobRequest("tiny-gpt", 50, "ckpt", capacity=4)).config
    assert config.notice_margin_s is None


@pytest.mark.process
def test_liveput_agent_survives_a_notice_signal_while_it_imports(tmp_path: Path):
    """``liveput agent`` ignores SIGUSR1 from its first lines, as ``python -m liveput.runtime``
    does: a notice due at launch does not end it. It then fails to reach the store (nothing
    listens there) and exits with its one-line error, not by the signal."""
    process = subprocess.Popen(
        [sys.executable, "-m", "liveput.cli.main", "agent", "--store"]
        + [f"tcp://127.0.0.1:{free_port()}", "--connect-timeout", "2"],
        env={**os.environ, "LIVEPUT_TOKEN": "t"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and process.poll() is None:
            if _ignores_sigusr1(process.pid):
                break
            time.sleep(0.005)  # the ignore comes with the first lines, long before torch loads
        assert _ignores_sigusr1(process.pid), "liveput agent does not ignore SIGUSR1 at start"
        process.send_signal(signal.SIGUSR1)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 2, (process.returncode, err[-500:])
    assert err.strip().splitlines()[-1].startswith("error: ")


def _ignores_sigusr1(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    return False


def test_a_restarted_coordinator_resumes_though_its_checkpoint_folder_cannot_be_written_now(
    tmp_path, monkeypatch, capsys
):
    """The fault campaign's disk-full came while a restarted coordinator started: it refused
    its --checkpoint-dir in one line and the job lost its coordinator (199 steps). A restart
    (its store holds the job: an earlier coordinator's etcd data, or an external store) warns
    and resumes; a first start still refuses, before it runs anything."""
    from contextlib import contextmanager

    from liveput.cli import coordinator as cli_coordinator
    from liveput.cli.main import main
    from liveput.launch import remote
    from liveput.runtime import keys
    from liveput.runtime.store import MemoryStore

    holds_job = {"yes": True}

    @contextmanager
    def job_store(*args, **kwargs):
        store = MemoryStore()
        if holds_job["yes"]:
            store.set(keys.job_spec(), b"{}")
        yield store

    def ran(*args, **kwargs):
        raise LiveputError("the job ran")

    monkeypatch.setattr(cli_coordinator, "_job_store", job_store)
    monkeypatch.setattr(remote, "run_remote_job", ran)
    unwritable = tmp_path / "a-file"
    unwritable.write_text("not a folder")
    command = ["coordinator", "--token", "t", "--checkpoint-dir", str(unwritable)]
    assert main([*command, "--etcd-dir", str(tmp_path / "fresh")]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint-dir" in err and "cannot be written" in err and "ran" not in err
    (tmp_path / "earlier" / "data" / "member").mkdir(parents=True)
    assert main([*command, "--etcd-dir", str(tmp_path / "earlier")]) == 2
    err = capsys.readouterr().err
    assert "warning:" in err and "cannot be written" in err and "resuming the job" in err
    assert "the job ran" in err
    # On an external store (the fault campaign's lane): a restart where the store holds the job.
    assert main([*command, "--store", "etcd://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "resuming the job" in err and "the job ran" in err
    holds_job["yes"] = False  # a first coordinator on that store: refused, nothing run
    assert main([*command, "--store", "etcd://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "cannot be written" in err and "warning" not in err and "ran" not in err
