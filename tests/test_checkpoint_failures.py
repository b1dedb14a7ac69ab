"""A checkpoint that cannot be written is never silent: the location is checked before work
starts, and every failed write (the final weights included) is counted in the store, where the
status, the summary and the exit code read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from liveput.errors import LiveputError
from liveput.files import check_writable_url
from liveput.models.jobs import resolve_job
from liveput.runtime.checkpoint import Checkpointer, latest_checkpoint
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.store import MemoryStore, readers


def test_a_checkpoint_location_that_cannot_be_made_is_refused_before_work_starts(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(LiveputError, match=r"^checkpoint dir .*a-file/ckpt cannot be written: "):
        check_writable_url(str(blocker / "ckpt"), "checkpoint dir")
    # A folder it made for the probe goes with it: a command refused later leaves none behind.
    check_writable_url(str(tmp_path / "new" / "ckpt"), "checkpoint dir")
    assert not (tmp_path / "new").exists()


def test_every_failed_checkpoint_write_is_counted_in_the_store(tmp_path: Path) -> None:
    store = MemoryStore()
    job = resolve_job("tiny-gpt")
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    checkpointer = Checkpointer(store, str(blocker / "ckpt"))
    assert readers.checkpoint_failures(store) == (0, None)
    for step in (4, 9):
        checkpointer.save_async(0, step, layers, job.num_layers)
        checkpointer.flush()
    count, last = readers.checkpoint_failures(store)
    assert count == 2 and last is not None and last["step"] == 9 and last["final"] is False
    assert str(blocker) in last["error"] and latest_checkpoint(store) is None
    assert checkpointer.save_now("final", layers) is False
    count, last = readers.checkpoint_failures(store)
    assert count == 3 and last is not None and last["final"] is True
    checkpointer.close()
    fine = Checkpointer(store, str(tmp_path / "ok"))
    assert fine.save_now("final", layers) is True
    assert json.loads(json.dumps(readers.checkpoint_failures(store)[1]))["final"] is True


def test_a_run_whose_final_weights_failed_does_not_end_as_saved() -> None:
    from liveput.runtime import keys
    from liveput.runtime.checkpoint import final_weights_written

    store = MemoryStore()
    assert final_weights_written(store, "train") == 0
    store.add(keys.checkpoint_failures(), 2)
    store.set(keys.checkpoint_failure(), json.dumps({"step": 9, "final": False}).encode())
    assert final_weights_written(store, "train") == 2  # mid-run ones: counted, not fatal
    store.add(keys.checkpoint_failures(), 1)
    detail = {"step": None, "final": True, "error": "s3://b/ckpt: AccessDenied"}
    store.set(keys.checkpoint_failure(), json.dumps(detail).encode())
    with pytest.raises(LiveputError, match=r"^train: the trained weights could not be saved "):
        final_weights_written(store, "train")


@pytest.mark.parametrize("command", ["train", "coordinator"])
def test_train_and_coordinator_refuse_a_checkpoint_dir_they_cannot_write(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from liveput.cli.main import main

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    argv = [command, "--steps", "2", "--checkpoint-dir", str(blocker / "ckpt")]
    if command == "train":
        argv += [
            "--workers",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
            "-o",
            str(tmp_path / "r.json"),
        ]
    else:
        argv += ["--embedded", "--token", "t", "--listen", "127.0.0.1:1"]
    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "--checkpoint-dir" in errors[0]
    assert "cannot be written" in errors[0]
    assert not (tmp_path / "r.json").exists()
