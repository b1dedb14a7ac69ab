"""The job's evaluation (``Job.evaluate``): its settings refused in one line, run by the instance
that completes an evaluation step's checkpoint on exactly that step's weights, recorded in the
store (the newest restore epoch winning), and shown by status, Prometheus, TensorBoard and
``liveput train``'s summary and per-step log."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from eval_job import EVERY_STEPS, probe_metrics, target
from torch import nn

from liveput.errors import LiveputError
from liveput.operate.metrics import TensorBoardScalars, prometheus_text, step_evaluations
from liveput.operate.recorder import RecorderConfig, StatusRecorder
from liveput.runtime import keys
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.evaluation import Evaluation, metrics_of, record_evaluation
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.store import MemoryStore, readers
from liveput.testbed.reference import reference_layers

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"evaluate": "accuracy"}, "Job.evaluate must be None or a callable"),
        ({"evaluate_every_steps": 0}, "Job.evaluate_every_steps must be an int >= 1, not 0"),
        ({"evaluate_every_steps": -3}, "must be an int >= 1, not -3"),
        ({"evaluate_every_steps": 2.5}, "must be an int >= 1, not 2.5"),
        ({"evaluate_every_steps": True}, "must be an int >= 1, not True"),
    ],
)
def test_a_bad_evaluation_setting_is_refused_in_one_line(change, message):
    with pytest.raises(LiveputError, match=message) as caught:
        dataclasses.replace(target(), **change)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_the_steps_evaluated_are_every_nth_counted_from_one():
    job = dataclasses.replace(target(), evaluate_every_steps=3)
    assert [s for s in range(10) if job.evaluation_due(s)] == [2, 5, 8]
    assert not any(dataclasses.replace(job, evaluate=None).evaluation_due(s) for s in range(10))


def test_what_evaluate_returns_becomes_named_floats_or_a_one_line_error():
    assert metrics_of(0.5) == {"value": 0.5}
    assert metrics_of(torch.tensor(2.0)) == {"value": 2.0}
    assert metrics_of({"accuracy": np.float32(0.25), "loss": 3}) == {"accuracy": 0.25, "loss": 3.0}
    assert math.isnan(metrics_of({"loss": float("nan")})["loss"])  # a diverged model says so
    for bad, message in (
        ({}, "empty mapping"),
        ({"": 1.0}, "named ''"),
        ({3: 1.0}, "named 3"),
        ({"accuracy": "high"}, "accuracy=str, not a number"),
        ({"logits": torch.ones(3)}, "logits=Tensor, not a number"),
        (None, "value=NoneType, not a number"),
    ):
        with pytest.raises(LiveputError, match=message):
            metrics_of(bad)


def _checkpoint(checkpointer: Checkpointer, job, epoch: int, step: int, shift: float) -> None:  # noqa: ANN001
    """A checkpoint of step ``step`` written in two shares (two instances' writes): the job's
    initial weights plus ``shift``; the second share completes it."""
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    with torch.no_grad():
        for layer in layers:
            for parameter in layer.module.parameters():
                parameter.add_(shift)
    checkpointer.save_async(epoch, step, layers[:2], job.num_layers)
    checkpointer.flush()
    checkpointer.save_async(epoch, step, layers[2:], job.num_layers)
    checkpointer.flush()


def _shifted_model(job, shift: float) -> nn.Sequential:  # noqa: ANN001
    model = nn.Sequential(*(fresh_layer(job, i, torch.device("cpu")).module for i in range(3)))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(shift)
    return model


def test_the_instance_completing_an_evaluation_steps_checkpoint_evaluates_its_weights(tmp_path):
    job = target()
    store = MemoryStore()
    checkpointer = Checkpointer(store, str(tmp_path / "ckpt"), keep=5, token=b"t")
    Evaluation(job, store, 7, checkpointer)
    _checkpoint(checkpointer, job, 0, 1, shift=0.1)  # 0-based step 1: after 2 steps, due
    _checkpoint(checkpointer, job, 0, 2, shift=0.2)  # not due: a checkpoint, no evaluation
    checkpointer.close()  # waits for the evaluation: its result is in the store now
    found = readers.evaluations(store)
    assert list(found) == [1]
    with torch.no_grad():
        want = probe_metrics(_shifted_model(job, 0.1))
        assert want != probe_metrics(_shifted_model(job, 0.0))
    assert found[1]["metrics"] == pytest.approx(want, rel=1e-6)
    assert found[1]["instance"] == 7 and found[1]["epoch"] == 0 and found[1]["eval_s"] >= 0
    assert readers.latest_evaluation(store) == found[1]
    # The job's own layers are untouched (the model evaluated was a copy).
    with torch.no_grad():
        assert probe_metrics(nn.Sequential(*job.layers)) == probe_metrics(_shifted_model(job, 0))


def test_an_evaluation_that_raises_is_recorded_and_training_goes_on(tmp_path):
    def broken(model: nn.Module) -> dict[str, float]:
        raise ValueError("no such split\nsecond line")

    job = target(evaluate=broken)
    store = MemoryStore()
    checkpointer = Checkpointer(store, str(tmp_path / "ckpt"))
    Evaluation(job, store, 3, checkpointer)
    _checkpoint(checkpointer, job, 0, 3, shift=0.0)
    checkpointer.close()
    record = readers.evaluations(store)[3]
    assert record["error"] == "ValueError: no such split" and "metrics" not in record
    assert json.loads(store.get(keys.latest_checkpoint()))["step"] == 3  # the checkpoint stands


def test_the_newest_restore_epochs_evaluation_of_a_step_wins():
    store = MemoryStore()
    assert record_evaluation(store, {"step": 5, "epoch": 0, "metrics": {"value": 1.0}})
    # A restore to step 3 opened epoch 1; step 3 is evaluated again, then a late result of
    # epoch 0 for step 3 arrives: it does not replace the newer one.
    assert record_evaluation(store, {"step": 3, "epoch": 1, "metrics": {"value": 2.0}})
    assert not record_evaluation(store, {"step": 3, "epoch": 0, "metrics": {"value": 9.0}})
    assert readers.evaluations(store)[3]["metrics"] == {"value": 2.0}
    assert readers.latest_evaluation(store)["step"] == 3  # (1, 3) is newer than (0, 5)
    assert readers.evaluations(store, [3, 4]) == {3: readers.evaluations(store)[3]}


def test_status_prometheus_and_tensorboard_show_the_evaluations(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from liveput.cli.main import main
    from liveput.operate.runner import keep_status

    store = MemoryStore()
    recorder = StatusRecorder(store, RecorderConfig(job="j", num_steps=8, global_batch_size=8))
    coordinator = SimpleNamespace(plan=None, committed=3, available=[], status="training")
    assert recorder.record(coordinator, 0.0, force=True)["eval"] is None
    record_evaluation(store, {"step": 1, "epoch": 0, "metrics": {"acc": 0.5, "loss": 2.0}})
    record_evaluation(store, {"step": 3, "epoch": 0, "metrics": {"acc": 0.75, "loss": 1.5}})
    snapshot = recorder.record(coordinator, 1.0, force=True)
    assert snapshot["eval"] == {"step": 3, "metrics": {"acc": 0.75, "loss": 1.5}}
    record_evaluation(store, {"step": 5, "epoch": 0, "error": "KeyError: 'x'"})
    snapshot = recorder.record(coordinator, 2.0, force=True)
    assert snapshot["eval"] == {"step": 5, "error": "KeyError: 'x'"}
    events = [e for e in recorder.events if e["kind"].startswith("eval")]
    assert [(e["kind"], e["step"]) for e in events] == [("eval", 3), ("eval-failed", 5)]
    assert events[0]["reason"] == "acc 0.75, loss 1.5" and "KeyError" in events[1]["reason"]

    record_evaluation(store, {"step": 7, "epoch": 0, "metrics": {"acc": 0.875, "loss": 1.0}})
    snapshot = recorder.record(coordinator, 3.0, force=True)
    metrics = prometheus_text(store).decode()
    assert 'liveput_eval{job="j",name="acc"} 0.875' in metrics
    assert 'liveput_eval_step{job="j"} 8.0' in metrics  # steps committed, as liveput_step
    # No instance registered: every market and state is a series at 0, none missing.
    counts = re.findall(
        r'^liveput_instances\{job="j",market="([^"]+)",state="([^"]+)"\} (\S+)$', metrics, re.M
    )
    assert sorted(counts) == sorted(
        (market, state, "0.0")
        for market in ("spot", "on-demand")
        for state in ("running", "noticed", "joining")
    )

    board = TensorBoardScalars(str(tmp_path / "tb"))
    due = target().evaluation_due
    board.add_evaluations(step_evaluations(store, due, board.eval_step, snapshot))
    board.add_evaluations(step_evaluations(store, due, board.eval_step, snapshot))  # no repeat
    board.close()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("eval/acc")] == [
        (2, 0.5),
        (4, 0.75),
        (8, 0.875),
    ]  # the failed one (step 6) has no point

    state = tmp_path / "state"
    state.mkdir()
    keep_status(store, state)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(f"name: j\nmodel: tiny-gpt\nsteps: 8\nstate_dir: {state}\n")
    assert main(["status", str(job_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval"] == snapshot["eval"]
    assert main(["status", str(job_file)]) == 0
    assert "after 8 steps: acc 0.875, loss 1" in capsys.readouterr().out


@pytest.mark.process
def test_liveput_train_evaluates_after_every_nth_step_the_weights_of_that_step(tmp_path):
    """A real run (agents, emulated cloud): results at exactly the steps N, 2N, ..., each
    equal to evaluating the uninterrupted reference's weights after that many steps, in the
    summary and in the per-step log. K = 5 does not divide N = 2: the evaluation steps are
    checkpointed all the same."""
    from liveput.cli.main import main

    steps, out = 6, tmp_path / "run.json"
    model = f"{TESTS / 'eval_job.py'}:target"
    argv = ["train", "--model", model, "--workers", "2", "--steps", str(steps)]
    # At time scale 1 the trace's first kill is 41 s away: at 10 (4 s) it could land as the
    # last evaluation ran, which an instance lost while it evaluates does not record.
    argv += ["--time-scale", "1", "--checkpoint-every", "5", "-o", str(out)]
    assert main([*argv, "--log-dir", str(tmp_path / "logs")]) == 0
    summary = json.loads(out.read_text())
    assert summary["exactly_once"] is True and summary["steps_completed"] == steps
    evaluated = [e["step"] for e in summary["evaluations"]]
    assert evaluated == [s for s in range(steps) if (s + 1) % EVERY_STEPS == 0] == [1, 3, 5]
    job = target()
    for evaluation in summary["evaluations"]:
        layers = reference_layers(job, evaluation["step"] + 1)
        with torch.no_grad():
            want = probe_metrics(nn.Sequential(*(layer.module for layer in layers)))
        assert evaluation["metrics"] == pytest.approx(want, rel=1e-4, abs=1e-6)
    lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(steps))
    assert {line["step"]: line["eval"] for line in lines if "eval" in line} == {
        e["step"]: e["metrics"] for e in summary["evaluations"]
    }
