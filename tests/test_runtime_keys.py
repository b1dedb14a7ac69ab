"""The store's schema: keys on the wire and what pruning removes, pinned to their literal forms."""

from __future__ import annotations

import json

from liveput.runtime import keys, protocol
from liveput.runtime.prune import PruneConfig, Pruner, PruneView
from liveput.runtime.store import MemoryStore, readers

BATCH = 4

# Each key function and the string the code wrote for the same arguments before the schema had
# its own module (the strings are what agents and coordinators of other versions read).
_OLD_STRINGS = [
    (keys.member(7), "members/7"),
    (keys.heartbeat(7), "hb/7"),
    (keys.state(7), "state/7"),
    (keys.holding(7), "holds/7"),
    (keys.notice(7), "notice/7"),
    (keys.lost(7), "lost/7"),
    (keys.current_plan(), "plan/current"),
    (keys.plan(12), "plan/12"),
    (keys.commit(3, 41), "commit/3/41"),
    (keys.done(3, 41), "done/3/41"),
    (keys.arrived_count(3), "arrived/3"),
    (keys.arrivals(3), "arrived/3/"),
    (keys.arrived(3, 7), "arrived/3/7"),
    (keys.all_arrived(3), "arrived/3/all"),
    (keys.started(3), "started/3"),
    (keys.failures(3), "fail/3/"),
    (keys.failure(3, 7), "fail/3/7"),
    (keys.failed(3), "failed/3"),
    (keys.event(3), "events/3"),
    (keys.rendezvous(3), "rdzv/3"),
    (keys.step_times(3), "perf/steps/3"),
    (keys.checkpoint_layers(2, 40), "ckpt/2/40"),
    (keys.latest_checkpoint(), "ckpt/latest"),
    (keys.complete_checkpoints(), "ckpt/complete"),
    (keys.ledger_record(2, 40), "ledger/2/40"),
    (keys.restore(2), "restore/2"),
    (keys.ledger_summary(), "ledger-summary"),
    (keys.job_spec(), "job/spec"),
    (keys.job_profile(), "job/profile"),
    (keys.job_file(), "job/file"),
    (keys.job_error(), "job/error"),
    (keys.job_done(), "job/done"),
    (keys.job_stop(), "job/stop"),
    (keys.next_instance_id(), "ids/next"),
    (keys.coordinator_started(), "coord/started"),
    (keys.coordinator_history(), "coord/history"),
    (keys.prune_floor(), "coord/floor"),
    (keys.preemptions(), "stats/preemptions"),
    (keys.migrations_prefix(), "stats/migrations/"),
    (keys.migrations("checkpoint-restore"), "stats/migrations/checkpoint-restore"),
    (keys.status_now(), "status/now"),
    (keys.status_series(), "status/series"),
    (keys.status_events(), "status/events"),
    (keys.cloud_notice("i-0003"), "notices/i-0003"),
]


def test_each_key_function_gives_the_old_string():
    assert [key for key, _ in _OLD_STRINGS] == [old for _, old in _OLD_STRINGS]


def test_every_key_belongs_to_the_family_its_table_row_names():
    for key, _ in _OLD_STRINGS:
        family = keys.family_of(key)
        assert family is not None and key.startswith(family.prefix), key
    assert keys.family_of("__liveput_index__/1") is None
    assert keys.family_of("failed/3") is keys.FAILED and keys.family_of("fail/3/1") is keys.FAILURE
    assert keys.HEARTBEAT.instance_of("hb/12") == 12
    assert (
        keys.HEARTBEAT.instance_of("hb/x") is None and keys.HEARTBEAT.instance_of("state/1") is None
    )


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
        protocol.record_step(
            store,
            0,
            protocol.LedgerRecord(
                step=s,
                generation=0,
                first_sample=s * BATCH,
                num_samples=BATCH,
                loss=1.0,
                data_parallel=1,
                pipeline_stages=1,
                committed_unix_s=float(s),
            ),
        )
    for key in (
        "stats/preemptions",
        "stats/migrations/pipeline",
        "coord/history",
        "coord/started",
        "job/spec",
        "job/done",
        "job/error",
        "job/profile",
        "job/stop",
        "job/file",
        "ids/next",
        "notices/i-0001",
        "status/now",
        "status/series",
        "status/events",
    ):
        store.set(key, b"1")


# What a pruning pass removed from the populated store before the schema had its own module
# (generation 3 running with step 4 committed, generations below 2 retired, restores from
# checkpoint (0, 3), instance 1 forgotten): the forgotten instance first, its registration
# first of all, then the dead keys in sorted order, then the folded ledger records.
_DELETED_BEFORE = [
    "members/1",
    "hb/1",
    "holds/1",
    "lost/1",
    "notice/1",
    "state/1",
    "arrived/0",
    "arrived/0/0",
    "arrived/0/all",
    "arrived/1",
    "arrived/1/0",
    "arrived/1/all",
    "ckpt/0/1",
    *(f"commit/{g}/{s}" for g in (0, 1) for s in range(6)),
    "commit/3/0",
    "commit/3/1",
    "commit/3/2",
    *(f"done/{g}/{s}" for g in (0, 1) for s in range(6)),
    "done/3/0",
    "done/3/1",
    "done/3/2",
    "fail/0/1",
    "fail/1/1",
    "failed/0",
    "failed/1",
    "plan/0",
    "started/0",
    "started/1",
    "ledger/0/0",
    "ledger/0/1",
    "ledger/0/2",
    "ledger/0/3",
]


def test_pruning_a_populated_store_removes_the_same_keys_as_before():
    store = _RecordingStore()
    _populate(store)
    before = set(store.get_prefix(""))
    pruner = Pruner(store, PruneConfig(deletes_per_tick=1000), BATCH)
    view = PruneView(
        generation=3, committed=4, retire_before=2, checkpoint=(0, 3), forgotten=frozenset({1})
    )
    pruner.plan_pass(view, pruner.keys(), epoch=0, now_s=0.0)
    assert store.deleted == _DELETED_BEFORE[:6]  # a forgotten instance goes at once
    pruner.delete_some()
    assert store.deleted == _DELETED_BEFORE
    after = store.get_prefix("")
    assert set(after) == (before - set(_DELETED_BEFORE)) | {"coord/floor", "ledger-summary"}
    assert json.loads(after["coord/floor"]) == {"generation": 3, "step": 3}


def test_the_shared_readers_parse_their_families():
    store = MemoryStore()
    for instance, count in ((2, b"5"), (10, b"1")):
        store.set(keys.heartbeat(instance), count)
    store.set("hb/stray", b"9")  # not an instance id: left out
    assert readers.by_instance(store, keys.HEARTBEAT) == {10: b"1", 2: b"5"}
    assert list(readers.by_instance(store, keys.HEARTBEAT)) == [10, 2]  # the store's key order
    assert readers.current_generation(store) is None
    store.set(keys.current_plan(), b"11")
    assert readers.current_generation(store) == 11
    for generation in (10, 9, 2):
        store.set(keys.event(generation), json.dumps({"generation": generation}).encode())
    assert [e["generation"] for e in readers.events(store)] == [2, 9, 10]  # by number
    store.add(keys.migrations("pipeline"), 2)
    store.add(keys.migrations("checkpoint-restore"), 1)
    store.add(keys.preemptions(), 4)
    assert readers.migrations(store) == {"pipeline": 2, "checkpoint-restore": 1}


def test_the_notice_ends_and_checkpoint_requests_are_pruned_with_their_instance_and_generation():
    from liveput.runtime.prune import is_dead

    assert (keys.notice_end(7), keys.checkpoint_request(3)) == ("notice-end/7", "ckpt-now/3")
    assert keys.family_of("notice-end/7") is keys.NOTICE_END
    assert keys.family_of("notice/7") is keys.NOTICE  # prefixes that do not shadow each other
    assert keys.family_of("ckpt-now/3") is keys.CHECKPOINT_REQUEST
    assert keys.family_of("ckpt/0/3") is keys.CHECKPOINT
    view = PruneView(
        generation=3, committed=4, retire_before=2, checkpoint=(0, 3), forgotten=frozenset({1})
    )
    assert is_dead("notice-end/1", view) and not is_dead("notice-end/2", view)
    assert is_dead("ckpt-now/1", view) and not is_dead("ckpt-now/2", view)
