"""Pruning the store: which keys a running job no longer needs, and deleting them a few at a time.

Without it a job's keys grow by about three per step (a commit counter, its outcome, a ledger
record) and by a few per generation and per instance that ever joined; a days-long job would
hold millions. :func:`dead_keys` decides, from the keys and a :class:`PruneView` of the job,
which are dead; :func:`liveput.runtime.ledger.fold` replaces old ledger records by one signed
summary; :class:`Pruner` (run by the coordinator, once per ``prune_interval_s``) carries both
out, at most ``deletes_per_tick`` deletes per coordinator tick, then compacts the store's history
(etcd's revisions).

A key is dead when nothing can read it any more. Which rule applies to a key is its family's
row of the schema's table (:data:`liveput.runtime.keys.FAMILIES`, column ``pruned``); what each
rule means:

- ``commit/<g>/<s>``, ``done/<g>/<s>`` of the running generation for ``s < committed - 1``: every
  working rank has read the outcome of a step before any votes for the step after it, and ranks
  vote at most one step past ``committed``. ``coord/floor`` records that those steps committed,
  so a restarted coordinator does not take their absence for "not committed".
- Everything of a *retired* generation (older than the newest one that ran, for at least
  ``generation_grace_s``: a straggler of it has long read its fence): its ``commit``, ``done``,
  ``arrived``, ``started``, ``fail``, ``failed`` and ``ckpt-now`` keys; its ``plan`` once the
  generation after it is retired too (holding reports name their generation's successor's
  start).
- ``ckpt/<e>/<s>`` counters of checkpoints older than the oldest one a restore may use
  (:func:`checkpoint_point`).
- ``members``, ``hb``, ``state``, ``holds``, ``notice``, ``lost``, ``notice-end`` of an instance
  silent for ``forget_after_s`` and not in the newest plan (an agent that comes back
  re-registers when its heartbeat counter starts again from 1).

``events/<g>`` (the plans' history, one per replan), ``stats/`` counters and ``coord/history``
(one number per decision interval) are kept: they grow with replans and wall time, not with steps.
``eval/<s>`` (the user's evaluations, one per ``Job.evaluate_every_steps``) are kept too: they are
the job's results.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.runtime import keys, ledger
from liveput.runtime.keys import Pruned
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)

_BY_GENERATION = (Pruned.RETIRED, Pruned.RETIRED_OR_OLD_STEP, Pruned.SUCCESSOR_RETIRED)
_INSTANCE_PREFIXES = tuple(f.prefix for f in keys.pruned_when(Pruned.FORGOTTEN))
"""The per-instance families, the registration first."""
_STEP_PREFIXES = tuple(f.prefix for f in keys.pruned_when(Pruned.RETIRED_OR_OLD_STEP))
_LISTED = tuple(
    f.prefix for f in keys.pruned_when(Pruned.FORGOTTEN, Pruned.OLDER_CHECKPOINT, *_BY_GENERATION)
)
"""The prefixes a pass lists (the ledger's are the fold's: :func:`ledger.read_ledger`)."""


@dataclass(frozen=True)
class PruneConfig:
    """How the coordinator prunes the store."""

    interval_s: float = 30.0
    """Seconds between two pruning passes (each lists the pruned prefixes once)."""
    deletes_per_tick: int = 200
    """Most deletes per coordinator tick (the rest wait for the next ticks)."""
    generation_grace_s: float = 60.0
    """A generation is retired this long after a newer one ran, seconds."""
    forget_after_s: float = 300.0
    """An instance silent this long, and not in the newest plan, is forgotten, seconds."""
    fold_ledger: bool = True
    """Fold the ledger records up to the oldest checkpoint a restore may use into the summary
    (``liveput train`` keeps them all: it writes the per-step log from them at the end)."""
    enabled: bool = True
    """Prune at all."""

    def __post_init__(self) -> None:
        if min(self.interval_s, self.generation_grace_s, self.forget_after_s) <= 0:
            raise LiveputError(
                "prune: interval_s, generation_grace_s and forget_after_s must be positive"
            )
        if self.deletes_per_tick < 1:
            raise LiveputError(f"prune: deletes_per_tick must be >= 1, got {self.deletes_per_tick}")


@dataclass(frozen=True)
class PruneView:
    """What the decision needs to know about the job."""

    generation: int
    """The newest plan's generation (-1: none yet)."""
    committed: int
    """The last step committed by the newest plan."""
    retire_before: int
    """Generations below this are retired."""
    checkpoint: tuple[int, int] | None
    """(epoch, step) of the oldest checkpoint a restore may use (:func:`checkpoint_point`)."""
    forgotten: frozenset[int]
    """Instances to forget."""


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def is_dead(key: str, view: PruneView) -> bool:
    """Whether ``key`` is dead in ``view`` (module docstring); ledger keys are :func:`fold`'s."""
    family = keys.family_of(key)
    rule = Pruned.NEVER if family is None else family.pruned
    parts = key.split("/")
    if rule is Pruned.FORGOTTEN:
        return len(parts) == 2 and _number(parts[1]) in view.forgotten
    if rule is Pruned.OLDER_CHECKPOINT:
        if len(parts) != 3 or view.checkpoint is None:
            return False
        epoch, step = _number(parts[1]), _number(parts[2])
        return epoch is not None and step is not None and (epoch, step) < view.checkpoint
    if rule not in _BY_GENERATION or len(parts) < 2:
        return False
    generation = _number(parts[1])
    if generation is None:  # plan/current
        return False
    if rule is Pruned.SUCCESSOR_RETIRED:
        return generation < view.retire_before - 1
    if generation < view.retire_before:
        return True
    if rule is Pruned.RETIRED_OR_OLD_STEP and generation == view.generation and len(parts) == 3:
        step = _number(parts[2])
        return step is not None and step < view.committed - 1
    return False


def dead_keys(listed: Iterable[str], view: PruneView) -> list[str]:
    """The keys of ``listed`` that are dead in ``view``, sorted."""
    return sorted(key for key in listed if is_dead(key, view))


def forgotten(
    silent_s: dict[int, float], in_plan: set[int], forget_after_s: float
) -> frozenset[int]:
    """Instances silent for ``forget_after_s`` (``silent_s``: seconds since each was last
    heard) that the newest plan does not name."""
    return frozenset(i for i, s in silent_s.items() if s >= forget_after_s and i not in in_plan)


def instances_named(named: Iterable[str]) -> set[int]:
    """Instance ids that per-instance keys name."""
    found = set()
    for key in named:
        family = keys.family_of(key)
        instance = (
            None
            if family is None or family.scope is not keys.Scope.INSTANCE
            else family.instance_of(key)
        )
        if instance is not None:
            found.add(instance)
    return found


def read_floor(store: Store, generation: int) -> int | None:
    """The step before which generation ``generation``'s steps are known committed, if pruned."""
    raw = store.get(keys.prune_floor())
    if raw is None:
        return None
    data = json.loads(raw)
    return int(data["step"]) if int(data["generation"]) == generation else None


class Pruner:
    """Carries out the pruning decisions against the store (the coordinator's executor)."""

    def __init__(self, store: Store, config: PruneConfig, global_batch_size: int) -> None:
        self.store = store
        self.config = config
        self.global_batch_size = global_batch_size
        self.pending: deque[str] = deque()
        """Dead keys still to delete."""
        self.deleted = 0
        """Keys deleted so far (by this process)."""
        self._next_pass_s: float | None = None
        self._compact_due = False
        self._started_seen: list[tuple[int, float]] = []
        """(started generation, clock time first seen), oldest first, for the grace."""

    def retire_before(self, started: int, now_s: float) -> int:
        """Generations below the newest one that has run for ``generation_grace_s``."""
        if not self._started_seen or self._started_seen[-1][0] != started:
            self._started_seen.append((started, now_s))
        ripe = [
            g
            for g, seen_s in self._started_seen
            if now_s - seen_s >= self.config.generation_grace_s
        ]
        if ripe:
            self._started_seen = [(g, s) for g, s in self._started_seen if g >= ripe[-1]]
        return ripe[-1] if ripe else -1

    def keys(self) -> set[str]:
        """Every key under the pruned prefixes."""
        found: set[str] = set()
        for prefix in _LISTED:
            found.update(self.store.get_prefix(prefix))
        return found

    def due(self, now_s: float) -> bool:
        if not self.config.enabled:
            return False
        if self._next_pass_s is None:
            self._next_pass_s = now_s + self.config.interval_s
        return not self.pending and now_s >= self._next_pass_s

    def plan_pass(self, view: PruneView, listed: set[str], epoch: int, now_s: float) -> None:
        """Queue the dead keys of ``listed`` (after writing what makes them safe to delete)."""
        self._next_pass_s = now_s + self.config.interval_s
        dead = dead_keys(listed, view)
        floor = view.committed - 1
        if any(
            k.startswith(_STEP_PREFIXES) and k.split("/")[1] == str(view.generation) for k in dead
        ):
            self.store.set(
                keys.prune_floor(),
                json.dumps({"generation": view.generation, "step": floor}).encode(),
            )
        if self.config.fold_ledger and view.checkpoint is not None and view.checkpoint[0] == epoch:
            dead += self._fold(epoch, view.checkpoint[1])
        # A forgotten instance goes at once, its registration first: half deleted, it would
        # look like a new member (no heartbeat history) or be counted lost again.
        forgotten_keys = sorted(
            (k for k in dead if k.startswith(_INSTANCE_PREFIXES)),
            key=lambda k: (not k.startswith(keys.MEMBER.prefix), k),
        )
        for key in forgotten_keys:
            self.store.delete(key)
        self.deleted += len(forgotten_keys)
        dead = [k for k in dead if not k.startswith(_INSTANCE_PREFIXES)]
        self.pending.extend(dead)
        self._compact_due = True
        if dead:
            LOG.info("pruning %d dead keys", len(dead))

    def _fold(self, epoch: int, checkpoint_step: int) -> list[str]:
        summary, epochs, restores = ledger.read_ledger(self.store)
        epoch = ledger.fold_epoch(summary, restores, epoch, checkpoint_step)
        folded = ledger.fold(
            summary, epochs, restores, epoch, checkpoint_step, self.global_batch_size
        )
        if folded is None:
            if summary is None or summary.through_step < checkpoint_step:
                LOG.debug("ledger: nothing to fold before step %d", checkpoint_step)
            return []
        # The summary first: until it is written, the records are the only proof.
        self.store.set(keys.ledger_summary(), folded.summary.to_json())
        LOG.info("ledger: steps 0..%d folded into the summary", folded.summary.through_step)
        return folded.dead_keys

    def delete_some(self) -> int:
        """Delete at most ``deletes_per_tick`` queued keys, then compact once the queue is
        empty; how many were deleted."""
        count = 0
        while self.pending and count < self.config.deletes_per_tick:
            self.store.delete(self.pending[0])
            self.pending.popleft()
            count += 1
        self.deleted += count
        if not self.pending and self._compact_due:
            self._compact_due = False
            self.store.compact_history()
        return count


def checkpoint_point(store: Store) -> tuple[int, int] | None:
    """(epoch, step) of the oldest checkpoint a restore may still use, or None: the newest
    complete one, or an older one still on disk (``ckpt/complete``), which a restore falls back
    to when a file of the newest is corrupt (:meth:`Checkpointer.discard`). Nothing it may roll
    back to is folded."""
    raw = store.get(keys.latest_checkpoint())
    if raw is None:
        return None
    data = json.loads(raw)
    step = int(data["step"])
    kept = store.get(keys.complete_checkpoints())
    if kept:
        step = min([step, *(int(s) for s in json.loads(kept))])
    return None if step < 0 else (int(data.get("epoch", 0)), step)
