"""The exactly-once ledger: proof that every step's samples were applied once in the final model.

Each committed step is recorded once per restore epoch (``ledger/<epoch>/<step>``, written with
create-only compare-and-set by the last stage). A checkpoint restore opens a new epoch and records
where it rolled back to (``restore/<epoch>``). Replaying the epochs in order, dropping the steps a
restore undid, must give steps 0..N-1 each exactly once, each with the samples its step owns, and
within an epoch the steps must follow each other (the committed step never goes back).

A days-long job does not keep a record per step: the coordinator folds the records of steps up to
the oldest checkpoint a restore may still use (no restore can undo them any more) into one
:class:`LedgerSummary` (``ledger-summary``, signed like every value) and deletes them. The summary
says that steps ``0..through_step`` of the lineage in force at ``epoch`` were each applied once
with their own samples (checked when folded), and carries a SHA-256 chain over their records, the
restores folded in and the steps they rolled back. Verification then starts from the summary:
the records left must follow on from ``through_step + 1``, and a later restore may not roll back
below it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from liveput.runtime import keys
from liveput.runtime.store import Store

_CHAIN_SEED = "0" * 64


@dataclass(frozen=True)
class LedgerSummary:
    """Steps ``0..through_step`` of the lineage in force at restore epoch ``epoch``, folded."""

    epoch: int
    """Restore epoch in force when folded: records and restores of epochs up to it are folded
    (those of ``epoch`` itself up to ``through_step``)."""
    through_step: int
    """The last step folded (-1: none)."""
    chain: str
    """Hex SHA-256 chain over the folded records in step order (:func:`chain_records`)."""
    restores: int = 0
    """Restore records folded in."""
    steps_rolled_back: int = 0
    """Committed steps those restores undid."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> LedgerSummary:
        data = json.loads(raw)
        return cls(
            int(data["epoch"]),
            int(data["through_step"]),
            str(data["chain"]),
            int(data.get("restores", 0)),
            int(data.get("steps_rolled_back", 0)),
        )


def chain_records(chain: str, records: list[dict]) -> str:
    """``chain`` extended by ``records`` in order: h' = SHA-256(h || canonical JSON of record)."""
    digest = chain
    for record in records:
        digest = hashlib.sha256((digest + json.dumps(record, sort_keys=True)).encode()).hexdigest()
    return digest


@dataclass
class LedgerReport:  # noqa: D101 - documented per field
    """What the ledger proves."""

    exactly_once: bool
    """Steps 0..N-1 each applied once with the right samples, in the final lineage."""
    steps_rolled_back: int
    """Committed steps undone by checkpoint restores (and redone)."""
    restores: int
    """Checkpoint restores."""
    records: list[dict] = field(default_factory=list)
    """The ledger record of each step of the final lineage not folded into the summary, in step
    order."""
    problems: list[str] = field(default_factory=list)
    """What is wrong, when ``exactly_once`` is false."""
    summarized_steps: int = 0
    """Steps folded into the ledger summary (steps 0..this-1)."""

    @property
    def steps_applied(self) -> int:
        """Steps of the final lineage: folded plus recorded."""
        return self.summarized_steps + len(self.records)


@dataclass
class Replay:
    """The lineage the ledger describes (see :func:`replay`)."""

    applied: dict[int, dict]
    """Step -> record, for the steps after the summary, in the final lineage."""
    folded_through: int
    """Steps 0..this are covered by the summary (-1: none)."""
    steps_rolled_back: int
    restores: int
    problems: list[str]


def _key_parts(key: str) -> tuple[int, int] | None:
    parts = key.split("/")
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])


def read_ledger(
    store: Store,
) -> tuple[LedgerSummary | None, dict[int, dict[int, dict]], dict[int, dict]]:
    """(summary, epoch -> step -> record, epoch -> restore record) as stored."""
    raw = store.get(keys.ledger_summary())
    summary = None if raw is None else LedgerSummary.from_json(raw)
    epochs: dict[int, dict[int, dict]] = {}
    for key, value in store.get_prefix(keys.LEDGER.prefix).items():
        parts = _key_parts(key)
        if parts is not None:
            epochs.setdefault(parts[0], {})[parts[1]] = json.loads(value)
    restores = {
        int(key.split("/")[1]): json.loads(value)
        for key, value in store.get_prefix(keys.RESTORE.prefix).items()
        if key.split("/")[1].isdigit()
    }
    return summary, epochs, restores


def replay(
    summary: LedgerSummary | None,
    epochs: dict[int, dict[int, dict]],
    restores: dict[int, dict],
    global_batch_size: int,
) -> Replay:
    """Replay the epochs after ``summary`` (records it covers, still awaiting deletion, are
    skipped): the steps applied in the final lineage and what is wrong with it."""
    problems: list[str] = []
    applied: dict[int, dict] = {}
    folded = -1 if summary is None else summary.through_step
    first_epoch = 0 if summary is None else summary.epoch
    rolled_back = 0 if summary is None else summary.steps_rolled_back
    restore_count = 0 if summary is None else summary.restores
    for epoch in range(first_epoch, max([*epochs, *restores, first_epoch]) + 1):
        first = folded + 1
        if epoch > first_epoch or (summary is None and epoch > 0):
            if epoch not in restores:
                problems.append(f"epoch {epoch} has no restore record")
                continue
            restore_count += 1
            restored_to = restores[epoch]["restored_to"]
            rolled_back += max(0, restores[epoch]["committed"] - restored_to)
            if restored_to < folded:
                problems.append(
                    f"restore epoch {epoch} rolls back to step {restored_to}, "
                    f"below the summarized step {folded}"
                )
            applied = {s: r for s, r in applied.items() if s <= restored_to}
            first = restored_to + 1
        steps = sorted(
            s
            for s in epochs.get(epoch, {})
            if s > folded or epoch != first_epoch or summary is None
        )
        if steps and steps != list(range(first, steps[-1] + 1)):
            problems.append(f"epoch {epoch}: steps {steps[:3]}... do not follow on from {first}")
        for step in steps:
            record = epochs[epoch][step]
            if step in applied or step <= folded:
                problems.append(f"step {step} applied twice")
            if (record.get("first_sample"), record.get("num_samples")) != (
                step * global_batch_size,
                global_batch_size,
            ):
                problems.append(f"step {step} applied samples of another step")
            applied[step] = record
    return Replay(applied, folded, rolled_back, restore_count, problems)


def verify_ledger(store: Store, global_batch_size: int, num_steps: int) -> LedgerReport:
    """Check the ledger (summary and records) for a job of ``num_steps`` steps."""
    summary, epochs, restores = read_ledger(store)
    result = replay(summary, epochs, restores, global_batch_size)
    problems = result.problems
    if result.folded_through >= num_steps:
        problems.append(f"the summary covers step {result.folded_through}, beyond the job")
    missing = [s for s in range(result.folded_through + 1, num_steps) if s not in result.applied]
    if missing:
        problems.append(f"steps never applied: {missing[:5]}")
    return LedgerReport(
        exactly_once=not problems,
        steps_rolled_back=result.steps_rolled_back,
        restores=result.restores,
        records=[result.applied[s] for s in sorted(result.applied)],
        problems=problems,
        summarized_steps=result.folded_through + 1,
    )


def fold_epoch(
    summary: LedgerSummary | None, restores: dict[int, dict], epoch: int, through: int
) -> int:
    """The epoch to fold steps ``0..through`` at, when ``epoch`` is in force: the newest one, at
    most ``epoch``, that restored to ``through`` or below (or the summary's, or 0).

    Every later restore rolled back to a step past ``through``, so none undoes a folded step;
    and what older epochs put in that epoch's lineage is at most ``through``, so their records
    may go. (``through`` may be older than the restore point of ``epoch`` itself: the fallback
    checkpoint before a corrupt one is.)"""
    floor = 0 if summary is None else summary.epoch
    for candidate in range(epoch, floor, -1):
        restore = restores.get(candidate)
        if restore is not None and restore["restored_to"] <= through:
            return candidate
    return floor


@dataclass(frozen=True)
class Fold:
    """A new summary and the ledger keys it makes dead."""

    summary: LedgerSummary
    dead_keys: list[str]


def fold(
    summary: LedgerSummary | None,
    epochs: dict[int, dict[int, dict]],
    restores: dict[int, dict],
    epoch: int,
    checkpoint_step: int,
    global_batch_size: int,
) -> Fold | None:
    """Fold the steps up to ``checkpoint_step`` (no restore can undo them any more) of the
    lineage of restore epoch ``epoch`` (:func:`fold_epoch`) into a new summary; None when there
    is nothing new to fold or the part to fold does not prove exactly-once (its records are then
    kept as evidence).

    Records of older epochs and restore records up to ``epoch`` go with the fold: the steps they
    put in the lineage are at most the restore point of ``epoch``, which :func:`fold_epoch`
    keeps at or below ``checkpoint_step``."""
    through = checkpoint_step
    folded = -1 if summary is None else summary.through_step
    if through <= folded or (summary is not None and epoch < summary.epoch):
        return None
    known = {e: dict(steps) for e, steps in epochs.items() if e <= epoch}
    result = replay(
        summary, known, {e: r for e, r in restores.items() if e <= epoch}, global_batch_size
    )
    if result.problems or any(s not in result.applied for s in range(folded + 1, through + 1)):
        return None
    chain = chain_records(
        _CHAIN_SEED if summary is None else summary.chain,
        [result.applied[s] for s in range(folded + 1, through + 1)],
    )
    dead = [
        keys.ledger_record(e, s)
        for e, steps in epochs.items()
        for s in steps
        if e < epoch or (e == epoch and s <= through)
    ]
    dead += [keys.restore(e) for e in restores if e <= epoch]
    return Fold(
        LedgerSummary(epoch, through, chain, result.restores, result.steps_rolled_back),
        sorted(dead),
    )
