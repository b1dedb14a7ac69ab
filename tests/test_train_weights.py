"""`liveput train` leaves the trained model where the user finds it, even without
``--checkpoint-dir`` (its checkpoints then go with the run's temporary folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from liveput.cli.main import main
from liveput.models.jobs import resolve_job
from liveput.testbed.reference import ATOL, RTOL, reference_layers

STEPS = 6


@pytest.mark.process
def test_train_without_a_checkpoint_dir_leaves_the_trained_model_named_in_its_summary(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "train",
            "--model",
            "tiny-gpt-small",
            "--workers",
            "2",
            "--steps",
            str(STEPS),
            "--time-scale",
            "10",
            "--checkpoint-every",
            "3",
            "--log-dir",
            str(tmp_path / "logs"),
            "--json",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["exactly_once"] is True and summary["steps_completed"] == STEPS
    # A new folder of its own under ./liveput-out/, said before the run starts and in --json.
    model_path = Path(summary["model"])
    assert model_path.name == "model.pt" and model_path.parent.parent == Path("liveput-out")
    assert f"model: {model_path}" in captured.err

    job = resolve_job("tiny-gpt-small")
    # The fault-free reference: the same steps in one process, exactly once.
    trained = nn.Sequential(*(layer.module for layer in reference_layers(job, STEPS))).eval()
    model = nn.Sequential(*job.layers).eval()
    initial = torch.stack([job.dataset[i][0] for i in range(4)])
    with torch.no_grad():
        before = model(initial)
    model.load_state_dict(torch.load(tmp_path / model_path, weights_only=True))
    with torch.no_grad():
        after = model(initial)
        torch.testing.assert_close(after, trained(initial), rtol=RTOL * 10, atol=ATOL * 10)
    assert not torch.allclose(after, before)
