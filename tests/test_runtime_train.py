"""`liveput train` end to end: coordinator, emulated cloud, agent processes, JSON and JSONL."""

from __future__ import annotations

import json

import pytest
import torch

from liveput.cli.main import main
from liveput.models.training import LRSchedule


def test_train_replays_a_trace_and_writes_its_summary_and_step_log(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(
        [
            "train",
            "--model",
            "tiny-gpt-small",
            "--workers",
            "4",
            "--steps",
            "60",
            "--time-scale",
            "10",
            "--seed",
            "20",
            "--notice-lead",
            "30",
            "--checkpoint-every",
            "5",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--clip-grad-norm",
            "1.0",
            "--lr-schedule",
            "cosine:warmup=5,min=0.1",
            "--activation-checkpointing",
            "-o",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == summary  # --json: the same object on stdout
    assert set(summary) >= {
        "steps_completed",
        "samples",
        "initial_loss",
        "final_loss",
        "preemptions",
        "allocations",
        "migrations",
        "steps_rolled_back",
        "exactly_once",
        "wall_s",
    }
    assert set(summary["migrations"]) == {
        "intra-stage",
        "inter-stage",
        "pipeline",
        "checkpoint-restore",
    }
    assert summary["exactly_once"] is True
    assert summary["steps_completed"] == 60 and summary["samples"] == 60 * 8
    assert summary["final_loss"] < summary["initial_loss"]
    steps = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(60))
    assert (tmp_path / "ckpt" / "final").is_dir()
    # The training flags reached every agent: the last step trained at the schedule's rate.
    final = torch.load(tmp_path / "ckpt" / "final" / "layer-1.pt", weights_only=True)
    group = final["optimizer"]["param_groups"][0]
    factor = LRSchedule("cosine", 5, 60, 0.1).factor(59)
    assert group["lr"] == pytest.approx(group["initial_lr"] * factor)
    # The agents' logs are kept beside the summary; only the newest 2 checkpoints stay.
    assert summary["log_dir"] == str(tmp_path / "logs")
    assert sorted(p.name for p in (tmp_path / "logs").glob("i-*.log"))[0] == "i-0000.log"
    assert len(list((tmp_path / "ckpt").glob("step-*"))) == 2
