"""The status a user reads after the fact: the events that matter shown first, one TensorBoard
loss point per committed step, and the last status kept in the job's folder once its store is
gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from liveput.cli.main import main
from liveput.operate.metrics import TensorBoardScalars, step_losses
from liveput.operate.recorder import choose_events
from liveput.operate.runner import STATUS_JSON, keep_status, read_kept_status
from liveput.runtime import keys
from liveput.runtime.store import MemoryStore


def _events() -> list[dict]:
    """A plan, then a checkpoint every step with a notice, a loss and a plan among them."""
    kinds = ["plan"] + ["checkpoint"] * 12 + ["notice", "lost", "plan"] + ["checkpoint"] * 12
    return [{"time_s": float(i), "kind": kind} for i, kind in enumerate(kinds)]


def test_the_default_events_show_plans_losses_and_notices_before_checkpoints() -> None:
    events = _events()
    chosen = choose_events(events, 10)
    kinds = [e["kind"] for e in chosen]
    assert len(chosen) == 10
    assert kinds.count("plan") == 2 and "notice" in kinds and "lost" in kinds
    # Time order kept, the newest checkpoints fill what is left.
    assert [e["time_s"] for e in chosen] == sorted(e["time_s"] for e in chosen)
    assert chosen[-1] == events[-1]
    assert choose_events(events, 0) == [] and choose_events(events[:3], 10) == events[:3]


def test_tensorboard_gets_one_loss_point_per_committed_step(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store = MemoryStore()
    for step in range(12):
        record = {"step": step, "loss": 10.0 - step}
        store.set(keys.ledger_record(0, step), json.dumps(record).encode())
    board = TensorBoardScalars(str(tmp_path / "tb"))
    # Status snapshots come far apart (here two for twelve steps).
    board.add({"step": 5, "samples_per_s": 1.0}, step_losses(store, 0, board.loss_step, 4))
    board.add({"step": 12, "samples_per_s": 2.0}, step_losses(store, 0, board.loss_step, 11))
    board.close()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    points = [(e.step, e.value) for e in accumulator.Scalars("loss")]
    assert points == [(s + 1, 10.0 - s) for s in range(12)]
    assert len(accumulator.Scalars("samples_per_s")) == 2


def test_status_after_the_store_is_gone_reads_the_job_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    store = MemoryStore()
    snapshot = {"job": "kept", "state": "finished", "reason": "all 8 steps", "step": 8}
    store.set(keys.status_now(), json.dumps(snapshot).encode())
    store.set(keys.status_events(), json.dumps(_events()).encode())
    keep_status(store, state)
    assert json.loads((state / STATUS_JSON).read_text())["state"] == "finished"
    kept = read_kept_status(state, events=10)
    assert kept is not None and len(kept["events"]) == 10
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"name: kept\nmodel: tiny-gpt\nsteps: 8\nstate_dir: {state}\n")
    assert main(["status", str(job_file), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "finished" and shown["step"] == 8
    assert {e["kind"] for e in shown["events"]} >= {"plan", "notice", "lost"}
    assert main(["stop", str(job_file)]) == 0
    assert "nothing to stop" in capsys.readouterr().err
