"""The store's schema: keys on the wire and what pruning removes, pinned to their literal forms."""

from __future__ import annotations

import json

from liveput.runtime import protocol
from liveput.runtime.prune import PruneConfig, Pruner, PruneView
from liveput.runtime.store import MemoryStore

BATCH = 4


class _RecordingStore(MemoryStore):
    """A memory store that remembers the order of its deletes."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        super().delete(key)


def _populate(store: MemoryStore) -> None:
    """A key of every family a job writes, for generations 0..3, instances 0..3 and checkpoints
    of two restore epochs, written by their literal wire forms."""
    for g in range(4):
        for s in range(6):
            store.set(f"commit/{g}/{s}", b"2")
            store.set(f"done/{g}/{s}", b"committed")
        store.set(f"arrived/{g}", b"2")
        store.set(f"arrived/{g}/0", b"1")
        store.set(f"arrived/{g}/all", b"1")
        store.set(f"started/{g}", b"1")
        store.set(f"fail/{g}/1", b"{}")
        store.set(f"failed/{g}", b"1")
        store.set(f"plan/{g}", b"{}")
        store.set(f"events/{g}", b"{}")
        store.set(f"rdzv/{g}", b"h:1")
        store.set(f"perf/steps/{g}", b"{}")
    store.set("plan/current", b"3")
    for i in range(4):
        for head in ("members", "hb", "state", "holds", "notice", "lost"):
            store.set(f"{head}/{i}", b"1")
    for e, s in ((0, 1), (0, 3), (0, 5), (1, 5)):
        store.set(f"ckpt/{e}/{s}", b"2")
    store.set("ckpt/latest", json.dumps({"epoch": 0, "step": 3}).encode())
    store.set("ckpt/complete", b"[1, 3]")
    for s in range(6):
        protocol.record_step(store, 0, protocol.LedgerRecord(
            step=s, generation=0, first_sample=s * BATCH, num_samples=BATCH, loss=1.0,
            data_parallel=1, pipeline_stages=1, committed_unix_s=float(s)))
    for key in ("stats/preemptions", "stats/migrations/pipeline", "coord/history", "coord/started",
                "job/spec", "job/done", "job/error", "job/profile", "job/stop", "job/file",
                "ids/next", "notices/i-0001", "status/now", "status/series", "status/events"):
        store.set(key, b"1")


# What a pruning pass removed from the populated store before the schema had its own module
# (generation 3 running with step 4 committed, generations below 2 retired, restores from
# checkpoint (0, 3), instance 1 forgotten): the forgotten instance first, its registration
# first of all, then the dead keys in sorted order, then the folded ledger records.
_DELETED_BEFORE = [
    "members/1", "hb/1", "holds/1", "lost/1", "notice/1", "state/1",
    "arrived/0", "arrived/0/0", "arrived/0/all", "arrived/1", "arrived/1/0", "arrived/1/all",
    "ckpt/0/1",
    *(f"commit/{g}/{s}" for g in (0, 1) for s in range(6)), "commit/3/0", "commit/3/1", "commit/3/2",
    *(f"done/{g}/{s}" for g in (0, 1) for s in range(6)), "done/3/0", "done/3/1", "done/3/2",
    "fail/0/1", "fail/1/1", "failed/0", "failed/1", "plan/0", "started/0", "started/1",
    "ledger/0/0", "ledger/0/1", "ledger/0/2", "ledger/0/3",
]


def test_pruning_a_populated_store_removes_the_same_keys_as_before():
    store = _RecordingStore()
    _populate(store)
    before = set(store.get_prefix(""))
    pruner = Pruner(store, PruneConfig(deletes_per_tick=1000), BATCH)
    view = PruneView(generation=3, committed=4, retire_before=2, checkpoint=(0, 3),
                     forgotten=frozenset({1}))
    pruner.plan_pass(view, pruner.keys(), epoch=0, now_s=0.0)
    assert store.deleted == _DELETED_BEFORE[:6]  # a forgotten instance goes at once
    pruner.delete_some()
    assert store.deleted == _DELETED_BEFORE
    after = store.get_prefix("")
    assert set(after) == (before - set(_DELETED_BEFORE)) | {"coord/floor", "ledger-summary"}
    assert json.loads(after["coord/floor"]) == {"generation": 3, "step": 3}
