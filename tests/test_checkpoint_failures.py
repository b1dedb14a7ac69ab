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
    check_writable_url(str(tmp_path / "new" / "ckpt"), "checkpoint dir")
    assert (tmp_path / "new" / "ckpt").is_dir() and not list((tmp_path / "new" / "ckpt").iterdir())


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
