"""Readers of key families that several parts of a job list: the coordinator, ``liveput status``
and the dashboard (:mod:`liveput.operate`), ``liveput train``'s result, and the tests.

Each parses the keys of its family (:mod:`liveput.runtime.keys`) in one place; values stay as
stored unless every caller wants them parsed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from liveput.runtime import keys
from liveput.runtime.store.base import Store


def by_instance(store: Store, family: keys.Family) -> dict[int, bytes]:
    """Instance id -> value of every key ``<prefix><id>`` of a per-instance family (heartbeats,
    states, notices, registrations, holdings, lost marks), in the store's listing order."""
    found = {}
    for key, raw in store.get_prefix(family.prefix).items():
        instance = family.instance_of(key)
        if instance is not None:
            found[instance] = raw
    return found


def current_generation(store: Store) -> int | None:
    """The generation of the plan in force, or None before the first plan."""
    raw = store.get(keys.current_plan())
    return None if raw is None else int(raw)


def events(store: Store) -> list[dict]:
    """Why each plan was made (``events/<g>``), oldest plan first."""
    found = []
    for key, raw in store.get_prefix(keys.EVENT.prefix).items():
        generation = key[len(keys.EVENT.prefix) :]
        if generation.isdigit():
            found.append((int(generation), json.loads(raw)))
    return [event for _, event in sorted(found, key=lambda pair: pair[0])]


def checkpoint_failures(store: Store) -> tuple[int, dict | None]:
    """(how many checkpoint writes failed, the newest failure: ``step``, ``final``, ``error``)."""
    count = store.get(keys.checkpoint_failures())
    last = store.get(keys.checkpoint_failure())
    return (0 if count is None else int(count)), (None if last is None else json.loads(last))


def migrations(store: Store) -> dict[str, int]:
    """Migration kind -> how many plans of that kind were published."""
    prefix = keys.migrations_prefix()
    return {key.removeprefix(prefix): int(value) for key, value in store.get_prefix(prefix).items()}


def evaluations(store: Store, steps: Iterable[int] | None = None) -> dict[int, dict]:
    """0-based step -> the job's evaluation after it (``eval/<s>``: ``metrics`` or ``error``),
    by step; ``steps``: only those (one read each), else every one (one listing)."""
    if steps is not None:
        found = {step: store.get(keys.evaluation(step)) for step in steps}
        return {step: json.loads(raw) for step, raw in found.items() if raw is not None}
    listed = {}
    for key, raw in store.get_prefix(keys.EVALUATION.prefix).items():
        step = key[len(keys.EVALUATION.prefix) :]
        if step.isdigit():
            listed[int(step)] = json.loads(raw)
    return dict(sorted(listed.items()))


def latest_evaluation(store: Store) -> dict | None:
    """The newest evaluation (of the newest restore epoch), or None before the first."""
    raw = store.get(keys.latest_evaluation())
    if raw is None:
        return None
    found = store.get(keys.evaluation(int(json.loads(raw)["step"])))
    return None if found is None else json.loads(found)
