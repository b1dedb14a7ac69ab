"""Pruning the store: the dead-key rules, the ledger summary, deletes on the TCP store's index."""

from __future__ import annotations

import json
import random

import pytest
from seeds import for_each_seed

from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job
from liveput.runtime import keys, protocol
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.ledger import fold, fold_epoch, read_ledger, verify_ledger
from liveput.runtime.planning import profile_job
from liveput.runtime.prune import PruneConfig, PruneView, dead_keys, forgotten
from liveput.runtime.store import MemoryStore, SignedStore, TCPStoreBackend, open_store

BATCH = 4


def _record(store, epoch: int, step: int) -> None:  # noqa: ANN001
    protocol.record_step(
        store,
        epoch,
        protocol.LedgerRecord(
            step=step,
            generation=epoch,
            first_sample=step * BATCH,
            num_samples=BATCH,
            loss=1.0 / (step + 1),
            data_parallel=1,
            pipeline_stages=1,
            committed_unix_s=float(step),
        ),
    )


def _fold_into(store, epoch: int, checkpoint: int) -> bool:  # noqa: ANN001
    """What the coordinator's pruner does: write the summary, then delete the folded keys."""
    summary, epochs, restores = read_ledger(store)
    epoch = fold_epoch(summary, restores, epoch, checkpoint)
    folded = fold(summary, epochs, restores, epoch, checkpoint, BATCH)
    if folded is None:
        return False
    store.set(keys.ledger_summary(), folded.summary.to_json())
    for key in folded.dead_keys:
        store.delete(key)
    return True


def _random_job(seed: int, folding: bool):  # noqa: ANN202
    """A random lineage: steps commit, checkpoints complete every K steps (the newest two kept),
    restores roll back to the newest checkpoint or, when a file of it is corrupt, to the one
    before; with ``folding`` the ledger is folded at random moments up to the oldest checkpoint
    a restore may still use (as the coordinator's pruner does)."""
    rng, folds = random.Random(seed), random.Random(-seed)  # the same job either way
    store = SignedStore(MemoryStore(), "token")
    num_steps, every = rng.randint(5, 40), rng.randint(1, 6)
    epoch, step, kept = 0, 0, [-1]
    while step < num_steps:
        _record(store, epoch, step)
        if (step + 1) % every == 0:
            kept = [*kept, step][-2:]
        step += 1
        if rng.random() < 0.15 and step < num_steps:  # a loss the next plan restores from
            if len(kept) == 2 and rng.random() < 0.3:
                kept = kept[:1]  # the newest is corrupt: the one before is used
            epoch += 1
            protocol.record_restore(store, epoch, step - 1, kept[-1])
            step = kept[-1] + 1
        if folding and min(kept) >= 0 and folds.random() < 0.4:
            _fold_into(store, epoch, min(kept))
    return store, num_steps


def test_folding_the_ledger_proves_what_the_whole_ledger_proves() -> None:
    for_each_seed(range(60), _folding_the_ledger_proves_what_the_whole_ledger_proves)


def _folding_the_ledger_proves_what_the_whole_ledger_proves(seed: int) -> None:
    whole, num_steps = _random_job(seed, folding=False)
    folded, _ = _random_job(seed, folding=True)
    want = verify_ledger(whole, BATCH, num_steps)
    got = verify_ledger(folded, BATCH, num_steps)
    assert want.exactly_once and got.exactly_once, (want.problems, got.problems)
    assert (got.steps_applied, got.steps_rolled_back, got.restores) == (
        want.steps_applied,
        want.steps_rolled_back,
        want.restores,
    )
    assert got.records == want.records[got.summarized_steps :]
    # And it is shorter: records of the folded steps are gone.
    assert len(folded.get_prefix("ledger/")) <= len(whole.get_prefix("ledger/"))


def _folded_job():  # noqa: ANN202
    store = SignedStore(MemoryStore(), "token")
    for step in range(10):
        _record(store, 0, step)
    protocol.record_restore(store, 1, 9, 7)  # steps 8, 9 rolled back
    for step in range(8, 20):
        _record(store, 1, step)
    assert _fold_into(store, 1, 15)
    return store


def test_a_folded_ledger_still_catches_missing_doubled_and_forged_steps():
    store = _folded_job()
    report = verify_ledger(store, BATCH, 20)
    assert report.exactly_once, report.problems
    assert (report.summarized_steps, report.steps_rolled_back, report.restores) == (16, 2, 1)
    assert sorted(store.get_prefix("ledger/")) == [f"ledger/1/{s}" for s in range(16, 20)]
    assert store.get_prefix("restore/") == {}
    assert not verify_ledger(store, BATCH, 21).exactly_once  # step 20 never applied

    missing = _folded_job()
    missing.delete("ledger/1/17")
    assert any("do not follow on" in p for p in verify_ledger(missing, BATCH, 20).problems)

    doubled = _folded_job()  # a restore that rolls back below the summary re-applies steps
    protocol.record_restore(doubled, 2, 19, 10)
    for step in range(11, 20):
        _record(doubled, 2, step)
    problems = verify_ledger(doubled, BATCH, 20).problems
    assert any("below the summarized step 15" in p for p in problems), problems

    forged = _folded_job()  # a summary claiming more, written without the token
    raw = json.loads(forged.get(keys.ledger_summary()))
    raw["through_step"] = 19
    forged.inner.set(keys.ledger_summary(), json.dumps(raw).encode())
    with pytest.raises(Exception, match="refused"):
        verify_ledger(forged, BATCH, 20)


def test_nothing_is_folded_when_the_records_do_not_prove_exactly_once():
    store = SignedStore(MemoryStore(), "token")
    for step in (0, 1, 3, 4):  # step 2 is missing
        _record(store, 0, step)
    summary, epochs, restores = read_ledger(store)
    assert fold(summary, epochs, restores, 0, 4, BATCH) is None
    assert fold(summary, epochs, restores, 0, 1, BATCH) is None  # the evidence stays whole
    _record(store, 0, 2)
    summary, epochs, restores = read_ledger(store)
    assert fold(summary, epochs, restores, 0, 1, BATCH).summary.through_step == 1


def test_dead_keys_of_a_job():
    keys = {
        "commit/3/10",
        "done/3/10",
        "commit/3/11",
        "done/3/11",
        "commit/3/12",
        "done/3/12",
        "commit/5/40",
        "done/5/40",
        "commit/5/41",
        "done/5/41",
        "commit/5/42",
        "commit/5/43",
        "arrived/3",
        "arrived/3/7",
        "arrived/3/all",
        "started/3",
        "fail/3/7",
        "failed/3",
        "arrived/4",
        "started/5",
        "plan/2",
        "plan/3",
        "plan/4",
        "plan/5",
        "plan/current",
        "ckpt/0/9",
        "ckpt/1/19",
        "ckpt/1/29",
        "ckpt/1/39",
        "ckpt/latest",
        "ckpt/complete",
        "members/7",
        "hb/7",
        "state/7",
        "holds/7",
        "notice/7",
        "lost/7",
        "members/8",
        "hb/8",
        "job/spec",
        "events/3",
        "coord/history",
        "stats/preemptions",
    }
    view = PruneView(
        generation=5, committed=43, retire_before=4, checkpoint=(1, 29), forgotten=frozenset({7})
    )
    assert dead_keys(keys, view) == sorted(
        [
            "commit/3/10",
            "done/3/10",
            "commit/3/11",
            "done/3/11",
            "commit/3/12",
            "done/3/12",
            "commit/5/40",
            "done/5/40",
            "commit/5/41",
            "done/5/41",  # < committed - 1 = 42
            "arrived/3",
            "arrived/3/7",
            "arrived/3/all",
            "started/3",
            "fail/3/7",
            "failed/3",
            "plan/2",  # plan 3 stays while generation 4's holdings may name its successor
            "ckpt/0/9",
            "ckpt/1/19",
            "members/7",
            "hb/7",
            "state/7",
            "holds/7",
            "notice/7",
            "lost/7",
        ]
    )
    assert forgotten({7: 400.0, 8: 400.0, 9: 10.0}, {8}, 300.0) == frozenset({7})


@pytest.mark.process
def test_tcp_store_deletes_leave_a_bounded_index_and_rewritten_keys_listed(monkeypatch):
    monkeypatch.setattr("liveput.runtime.store.tcp._SWEEP_MIN_ENTRIES", 16)
    server = TCPStoreBackend("127.0.0.1", 0, host=True)
    writer = TCPStoreBackend("127.0.0.1", server.port)
    lister = TCPStoreBackend("127.0.0.1", server.port)
    try:
        writer.set("hb/1", b"1")
        writer.get("hb/1")  # TCPStore's set is one-way: a round trip makes it land first
        baseline = server.key_count()
        for step in range(300):
            writer.add(f"commit/0/{step}", 1)
            writer.compare_and_set(f"done/0/{step}", None, b"committed")
            if step % 20 == 0:
                assert lister.get_prefix("done/")  # reads index entries as they come
            if step >= 2:
                server.delete(f"commit/0/{step - 2}")
                server.delete(f"done/0/{step - 2}")
        assert sorted(lister.get_prefix("done/")) == ["done/0/298", "done/0/299"]
        # Two keys, each with its marker and index entry, plus the count: nothing else left.
        assert server.key_count() - baseline == 4 * 3
        # The lister never listed commit/: it forgets those keys at its checks (every doubling).
        assert len(lister._entries) <= 2 * 16
        # A key deleted and written again (by a client that wrote it before) is listed again.
        server.delete("hb/1")
        assert lister.get_prefix("hb/") == {}
        writer.set("hb/1", b"2")
        assert lister.get_prefix("hb/") == {"hb/1": b"2"}
    finally:
        for store in (lister, writer, server):
            store.close()


def test_a_pruning_coordinator_keeps_the_store_small_and_a_restarted_one_recovers():
    """A real coordinator (manual clock) over agents that write what engines write: the store
    stays small, a lost instance is forgotten, and a coordinator restarted after pruning
    finds the committed step from the floor, not from the deleted outcomes."""
    from bench.bench_store import ObedientAgents

    steps = 600
    job = resolve_job("tiny-gpt")
    profile = profile_job(job, repeats=1)
    store = SignedStore(MemoryStore(), "token")
    clock = ManualClock()
    config = CoordinatorConfig(
        num_steps=steps,
        num_micro_batches=job.num_micro_batches,
        capacity=3,
        initial_workers=3,
        interval_s=60.0,
        heartbeat_timeout_s=3.0,
        prune=PruneConfig(interval_s=5.0, generation_grace_s=5.0, forget_after_s=10.0),
    )
    coordinator = Coordinator(store, profile, config, clock=clock)
    agents = ObedientAgents(store, job.num_layers, job.global_batch_size)
    for _ in range(3):
        agents.join()
    restarted = churned = False
    peak = 0
    while coordinator.tick():
        for _ in range(4):
            clock.advance(0.2)
            agents.follow()
            agents.step()
        agents.beat()
        peak = max(peak, len(store.get_prefix("")))
        if agents.last >= 150 and not churned:
            churned = True
            agents.alive.discard(0)
            agents.join()
        if agents.last >= 450 and not restarted:
            restarted = True
            assert store.get(keys.prune_floor()) is not None
            assert store.get(f"done/{agents.plan.generation}/{agents.plan.start_step}") is None
            coordinator = Coordinator(store, profile, config, clock=clock)
            assert coordinator.committed == agents.last
        assert clock.now_s() < 2_000, f"stuck at step {agents.last}: {coordinator.status}"
    report = verify_ledger(store, job.global_batch_size, steps)
    assert report.exactly_once, report.problems
    assert report.summarized_steps >= 500
    assert peak < 300  # unpruned: about 3 keys per step, 1,800 here
    assert not [
        k
        for k in store.get_prefix("")
        if k.split("/")[-1] == "0"
        and k.split("/")[0] in ("members", "hb", "state", "holds", "lost")
    ]


def test_etcd_markers_do_not_pile_up_and_history_is_compacted(etcd_url):
    store = open_store(etcd_url)
    try:
        for step in range(150):
            store.add("hb/1", 1)
            store.compare_and_set(f"done/0/{step}", None, b"committed")
            store.delete(f"done/0/{step}")
        # hb/1 and at most one batch of markers not yet deleted by a later transaction.
        assert store.key_count() <= 1 + 16 + 1
        before = store.revision()
        store.compact_history()
        assert int(store.status()["dbSizeInUse"]) > 0  # int64s come as strings
        old = {"key": "aGIvMQ==", "revision": before - 10}  # hb/1, ten writes ago
        with pytest.raises(
            LiveputError, match="failed"
        ):  # etcd: "required revision has been compacted"
            store._post("kv/range", old)
        assert store.get("hb/1") == b"150"
    finally:
        store.close()


def test_nothing_a_corrupt_checkpoint_fallback_may_roll_back_to_is_folded():
    from liveput.runtime.prune import checkpoint_point

    store = MemoryStore()
    assert checkpoint_point(store) is None
    store.set("ckpt/latest", b'{"epoch": 1, "step": 9}')
    assert checkpoint_point(store) == (1, 9)
    # Step 4's checkpoint is still on disk: if a file of step 9's is corrupt, the restore
    # falls back to it and redoes steps 5..9, so their records must stay records.
    store.set("ckpt/complete", b"[4, 9]")
    assert checkpoint_point(store) == (1, 4)
    store.set("ckpt/latest", b'{"epoch": 2, "step": -1}')  # every checkpoint discarded
    assert checkpoint_point(store) is None
