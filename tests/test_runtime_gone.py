"""The cloud's word that an instance ended: the executor that rents it writes ``gone/<n>`` for a
registered instance, and the coordinator's observation counts that instance as having left (dead
at once: decide's notation), with no heartbeat timeout to wait out."""

from __future__ import annotations

import json

from liveput.launch.cloud import tell_gone
from liveput.runtime import keys
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator.observe import JobProgress, Observer
from liveput.runtime.decide import CoordinatorConfig
from liveput.runtime.store import MemoryStore


def _registered(store: MemoryStore, *instances: int) -> None:
    for instance in instances:
        store.set(keys.member(instance), json.dumps({"host": "127.0.0.1"}).encode())
        store.add(keys.heartbeat(instance), 1)


def test_only_registered_instances_are_told_gone_and_each_once() -> None:
    store = MemoryStore()
    _registered(store, 0, 1)
    seen: set[int] = set()
    tell_gone(store, [0, 7], seen)  # 7 never registered: nothing of it to plan around
    assert store.get(keys.gone(0)) == b"1" and store.get(keys.gone(7)) is None
    store.delete(keys.gone(0))
    _registered(store, 7)  # an ended instance is looked at once, not at every tick
    tell_gone(store, [0, 1, 7], seen)  # told once: not written again
    assert store.get(keys.gone(0)) is None and store.get(keys.gone(1)) == b"1"
    assert store.get(keys.gone(7)) is None
    assert seen == {0, 1, 7}
    assert keys.family_of(keys.gone(1)) is keys.GONE
    assert keys.GONE.pruned is keys.Pruned.FORGOTTEN  # forgotten with its instance


def test_an_instance_the_cloud_ended_is_seen_as_left_while_its_heartbeat_is_fresh() -> None:
    store = MemoryStore()
    _registered(store, 0, 1)
    clock = ManualClock()
    config = CoordinatorConfig(num_steps=10, num_micro_batches=2, capacity=2)
    observer = Observer(store, config, clock, clock.now_s(), wall_clock=lambda: 0.0)
    members = observer.members(clock.now_s(), JobProgress(plan=None))
    assert not members[0].left and not members[1].left
    tell_gone(store, [1], set())
    members = observer.members(clock.now_s(), JobProgress(plan=None))
    assert members[1].left and members[1].heartbeat_age_s < config.suspect_after_s
    assert not members[0].left
