"""A checkpoint's cost to training: the snapshot and the slowdown of the steps its write ran
beside, measured per checkpoint."""

from __future__ import annotations

import pytest
import torch

from liveput.models.jobs import resolve_job
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.checkpoint_stall import CheckpointStallWatch
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.store import MemoryStore


def test_a_write_that_slows_no_step_costs_its_snapshot_alone():
    watch = CheckpointStallWatch()
    for _ in range(5):
        assert watch.step(0.20, writing=False) is None
    assert watch.checkpointed(9, snapshot_s=0.015) is None
    assert watch.step(0.19, writing=True) is None
    assert watch.step(0.21, writing=True) is None
    stall = watch.step(0.20, writing=False)  # the write is over
    assert stall is not None and stall.step == 9 and stall.steps_during == 2
    assert stall.slower_s == pytest.approx(0.0)
    assert stall.stall_s == pytest.approx(0.015)


def test_the_steps_a_write_slows_count_beyond_the_median_step_without_one():
    watch = CheckpointStallWatch()
    for duration_s in (0.20, 0.22, 0.18, 0.20, 0.90):  # one slow outlier: the median ignores it
        watch.step(duration_s, writing=False)
    watch.checkpointed(19, snapshot_s=0.01)
    for duration_s in (0.50, 0.35, 0.30):
        watch.step(duration_s, writing=True)
    stall = watch.step(0.2, writing=False)
    assert stall is not None and stall.steps_during == 3 and stall.median_step_s == 0.20
    assert stall.slower_s == pytest.approx(1.15 - 3 * 0.20)
    assert stall.stall_s == pytest.approx(0.01 + 0.55)
    assert "checkpoint of step 19 cost training 0.560 s" in stall.describe()


def test_a_checkpoint_taken_before_the_last_write_was_seen_over_reports_that_one_first():
    watch = CheckpointStallWatch()
    watch.step(0.2, writing=False)
    watch.checkpointed(4, snapshot_s=0.02)
    watch.step(0.4, writing=True)
    previous = watch.checkpointed(9, snapshot_s=0.03)
    assert previous is not None and previous.step == 4 and previous.steps_during == 1
    assert watch.step(0.2, writing=False).step == 9


def test_the_checkpointer_says_how_long_a_snapshot_took_and_while_it_writes(tmp_path):
    job = resolve_job("tiny-gpt-small")
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(MemoryStore(), str(tmp_path / "ckpt"))
    try:
        assert not checkpointer.writing()
        snapshot_s = checkpointer.save_async(0, 9, layers, job.num_layers)
        assert 0.0 < snapshot_s < 5.0
        checkpointer.flush()
        assert not checkpointer.writing()
        assert (tmp_path / "ckpt" / "step-9" / "layer-0.pt").exists()
    finally:
        checkpointer.close()
