"""`liveput coordinator --provider ...`: bad input in one line, and the emulated provider renting
the agents of a real job from the command line."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import liveput
from liveput.cli.main import main

LIVEPUT = Path(sys.executable).with_name("liveput")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "--provider",
                "aws",
                "--region",
                "us-moon-1",
                "--instance-types",
                "c5.xlarge",
                "--spot-max",
                "2",
            ],
            "unknown AWS region 'us-moon-1'; known: ",
        ),
        (
            ["--provider", "emulated", "--instance-types", "c5.xlarge,q9.big", "--spot-max", "2"],
            "unknown instance type 'q9.big' in catalog",
        ),
        (["--provider", "gcp", "--spot-max", "1"], "unknown provider 'gcp'; known: aws, emulated"),
        (["--provider", "aws", "--spot-max", "1"], "--provider aws needs --instance-types"),
        (
            ["--provider", "aws", "--instance-types", "c5.xlarge", "--spot-max", "1"],
            "--provider aws needs --instance-profile NAME",
        ),
        (["--spot-max", "1"], "--spot-max, --on-demand-max and --instance-types need --provider"),
        (["--provider", "emulated"], "--provider emulated: give --spot-max and/or --on-demand-max"),
        (
            ["--provider", "emulated", "--spot-max", "6", "--on-demand-max", "3"],
            "--spot-max 6 + --on-demand-max 3 exceed --capacity 8",
        ),
    ],
)
def test_bad_provider_input_is_one_line(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["coordinator", "--token", "t", "--etcd-dir", str(tmp_path / "etcd"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert message in err, err
    assert not (tmp_path / "etcd").exists()  # refused before any store started


@pytest.mark.process
def test_the_emulated_provider_rents_the_agents_of_a_job(tmp_path: Path) -> None:
    trace = tmp_path / "two.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [2, 2, 2]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [
            str(LIVEPUT),
            "coordinator",
            "--embedded",
            "--listen",
            f"127.0.0.1:{port}",
            "--provider",
            "emulated",
            "--spot-max",
            "2",
            "--trace",
            str(trace),
            "--model",
            "tiny-gpt-small",
            "--steps",
            "4",
            "--workers",
            "2",
            "--interval",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--etcd-dir",
            str(tmp_path / "etcd"),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "LIVEPUT_TOKEN": "cli-token",
            # the liveput under test, whatever the working directory
            "PYTHONPATH": str(Path(liveput.__file__).parents[1]),
        },
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "released 2 instance(s); spent $" in done.stderr and "job done" in done.stderr
    logs = sorted(p.name for p in (tmp_path / "liveput-provider" / "logs").iterdir())
    assert logs == ["e-0000.log", "e-0001.log"]  # the provider started both agents


@pytest.mark.process
def test_a_deadline_job_from_the_cli_holds_spot_and_rents_no_on_demand_it_does_not_need(
    tmp_path: Path,
) -> None:
    """`liveput coordinator --deadline-hours`: a few steps, a whole hour, spot all along: the
    deadline policy starts no on-demand instance, and holds only the spot instance it needs (one
    does four steps in an hour): the other is given back as a spare during the run, so at most
    one is left to release at the end (none where its agent exited on the job's end before the
    command gave it back: the provider counts an instance whose agent ended as gone)."""
    trace = tmp_path / "two.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [2, 2, 2]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [
            str(LIVEPUT),
            "coordinator",
            "--embedded",
            "--listen",
            f"127.0.0.1:{port}",
            "--provider",
            "emulated",
            "--spot-max",
            "2",
            "--on-demand-max",
            "2",
            "--trace",
            str(trace),
            "--deadline-hours",
            "1",
            "--model",
            "tiny-gpt-small",
            "--steps",
            "4",
            "--workers",
            "2",
            "--interval",
            "1",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--etcd-dir",
            str(tmp_path / "etcd"),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "LIVEPUT_TOKEN": "cli-token",
            "PYTHONPATH": str(Path(liveput.__file__).parents[1]),
        },
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "deadline met: done at" in done.stderr and "job done" in done.stderr, done.stderr
    assert re.search(r"^released [01] instance\(s\)", done.stderr, flags=re.M), done.stderr
    logs = sorted(p.name for p in (tmp_path / "liveput-provider" / "logs").iterdir())
    assert logs == ["e-0000.log", "e-0001.log"]  # spot only: no on-demand agent started


def test_a_deadline_without_a_provider_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "coordinator",
                "--token",
                "t",
                "--etcd-dir",
                str(tmp_path / "etcd"),
                "--deadline-hours",
                "2",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--deadline-hours needs --provider" in err, err
    assert not (tmp_path / "etcd").exists()
