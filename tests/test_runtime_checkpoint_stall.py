"""A checkpoint's cost to training: the snapshot and the slowdown of the steps its write ran
beside, measured per checkpoint."""

from __future__ import annotations

import io
import time

import pytest
import torch

from liveput.models.jobs import resolve_job
from liveput.objectstore import PACED_CHUNK_BYTES, PacedReader, Pacer
from liveput.perf.configuration import Configuration
from liveput.runtime.checkpoint import Checkpointer, latest_record
from liveput.runtime.checkpoint_stall import CheckpointStallWatch
from liveput.runtime.engine import EngineConfig
from liveput.runtime.inprocess import ThreadCluster
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.planning import profile_job
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


class _FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept_s: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept_s.append(seconds)
        self.now_s += seconds


def test_a_pacer_lets_bytes_through_at_its_rate_on_average():
    clock = _FakeClock()
    pacer = Pacer(1000.0, clock, clock.sleep)
    for _ in range(5):
        pacer.admit(500)
    # The first 500 at once, then each 500 half a second after the one before.
    assert clock.slept_s == pytest.approx([0.5, 0.5, 0.5, 0.5])
    clock.now_s += 10.0  # idle: no credit for it, so no burst after it
    pacer.admit(500)
    pacer.admit(500)
    assert clock.slept_s == pytest.approx([0.5] * 5)
    assert pacer.admitted_bytes == 3500


def test_a_paced_reader_reads_in_small_chunks_through_its_pacer():
    clock = _FakeClock()
    reader = PacedReader(io.BytesIO(bytes(1_000_000)), Pacer(500_000.0, clock, clock.sleep))
    chunks = iter(lambda: reader.read(2**20), b"")
    assert sum(len(chunk) for chunk in chunks) == 1_000_000
    assert clock.now_s - 100.0 == pytest.approx(2.0, abs=PACED_CHUNK_BYTES / 500_000.0)


def test_a_spread_checkpoint_takes_its_spread_to_write_and_an_unspread_one_does_not(tmp_path):
    job = resolve_job("tiny-gpt-small")
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(MemoryStore(), str(tmp_path / "ckpt"))
    try:
        for step, spread_s in ((9, 0.6), (19, None)):
            started_s = time.perf_counter()
            checkpointer.save_async(0, step, layers, job.num_layers, spread_s)
            while checkpointer.writing():  # not flush(): waiting for a write unpaces it
                time.sleep(0.01)
            took_s = time.perf_counter() - started_s
            if spread_s is None:
                assert took_s < 0.5
            else:
                assert took_s >= 0.5 * spread_s  # its bytes' last chunk goes at most this early
                # Recorded unpaced: what a checkpoint waited for would take (Rule 9's lead).
                write_s = latest_record(checkpointer.store)[1]
                assert write_s is not None and write_s < took_s - 0.25 * spread_s
        for step in (9, 19):
            restored = fresh_layer(job, 1, torch.device("cpu"))
            restored.load_state_dict(checkpointer.load_layer(step, 1))
            assert all(
                torch.equal(a, b)
                for a, b in zip(
                    restored.module.parameters(), layers[1].module.parameters(), strict=True
                )
            )
    finally:
        checkpointer.close()


@pytest.mark.process  # gloo groups in threads
@pytest.mark.parametrize("spread", [0.5, 0.0])
def test_a_periodic_checkpoint_is_spread_over_its_share_of_k_median_steps(
    spread, tmp_path, monkeypatch
):
    spreads: list[float | None] = []
    write = Checkpointer.write_async  # the periodic writes (their snapshot shared with copies)

    def recording(self, epoch, step, states, num_layers, spread_s=None, taken_s=None):
        spreads.append(spread_s)
        return write(self, epoch, step, states, num_layers, spread_s, taken_s)

    monkeypatch.setattr(Checkpointer, "write_async", recording)
    job = resolve_job("tiny-gpt-small")
    cluster = ThreadCluster(
        job,
        profile_job(job, repeats=1),
        str(tmp_path / "ckpt"),
        12,
        EngineConfig(checkpoint_every=4, comm_timeout_s=30, checkpoint_spread=spread),
    )
    cluster.migrate(Configuration(1, 1), set(), [0], 12)
    assert len(spreads) >= 2
    if spread:
        # K = 4 steps of a tiny model's median step: well under a second, never nothing.
        assert all(s is not None and 0 < s < 4 * 4 * spread for s in spreads)
    else:
        assert all(not s for s in spreads)


def test_a_hurried_pacer_lets_every_byte_through_at_once():
    clock = _FakeClock()
    pacer = Pacer(1000.0, clock, clock.sleep)
    pacer.admit(500)
    pacer.hurry()
    for _ in range(10):
        pacer.admit(500)
    assert clock.slept_s == [] and pacer.admitted_bytes == 5500


def test_waiting_for_a_spread_write_unpaces_it(tmp_path):
    """A checkpoint asked for before instances go waits for the periodic one being spread
    before it (one writer): the wait must not last the spread."""
    job = resolve_job("tiny-gpt-small")
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    checkpointer = Checkpointer(MemoryStore(), str(tmp_path / "ckpt"))
    try:
        started_s = time.perf_counter()
        checkpointer.save_async(0, 9, layers, job.num_layers, spread_s=30.0)
        checkpointer.save_async(0, 10, layers, job.num_layers)
        checkpointer.flush()
        assert time.perf_counter() - started_s < 10.0
        assert (tmp_path / "ckpt" / "step-10" / "layer-0.pt").exists()
    finally:
        checkpointer.close()
