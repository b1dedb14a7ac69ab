"""The exactly-once ledger: proof that every step's samples were applied once in the final model.

Each committed step is recorded once per restore epoch (``ledger/<epoch>/<step>``, written with
create-only compare-and-set by the last stage). A checkpoint restore opens a new epoch and records
where it rolled back to (``restore/<epoch>``). Replaying the epochs in order, dropping the steps a
restore undid, must give steps 0..N-1 each exactly once, each with the samples its step owns, and
within an epoch the steps must follow each other (the committed step never goes back).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from liveput.runtime.store import Store


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
    """The ledger record of each step of the final lineage, in step order."""
    problems: list[str] = field(default_factory=list)
    """What is wrong, when ``exactly_once`` is false."""


def verify_ledger(store: Store, global_batch_size: int, num_steps: int) -> LedgerReport:
    """Check the ledger for a job of ``num_steps`` steps."""
    epochs: dict[int, dict[int, dict]] = {}
    for key, raw in store.get_prefix("ledger/").items():
        _, epoch, step = key.split("/")
        epochs.setdefault(int(epoch), {})[int(step)] = json.loads(raw)
    restores = {int(key.split("/")[1]): json.loads(raw)
                for key, raw in store.get_prefix("restore/").items()}
    problems: list[str] = []
    applied: dict[int, dict] = {}
    rolled_back = 0
    for epoch in range(max([*epochs, *restores, 0]) + 1):
        first = 0
        if epoch > 0:
            if epoch not in restores:
                problems.append(f"epoch {epoch} has no restore record")
                continue
            restored_to = restores[epoch]["restored_to"]
            rolled_back += max(0, restores[epoch]["committed"] - restored_to)
            applied = {s: r for s, r in applied.items() if s <= restored_to}
            first = restored_to + 1
        steps = sorted(epochs.get(epoch, {}))
        if steps and steps != list(range(first, steps[-1] + 1)):
            problems.append(f"epoch {epoch}: steps {steps[:3]}... do not follow on from {first}")
        for step in steps:
            record = epochs[epoch][step]
            if step in applied:
                problems.append(f"step {step} applied twice")
            if (record["first_sample"], record["num_samples"]) != (step * global_batch_size,
                                                                   global_batch_size):
                problems.append(f"step {step} applied samples of another step")
            applied[step] = record
    missing = sorted(set(range(num_steps)) - set(applied))
    if missing:
        problems.append(f"steps never applied: {missing[:5]}")
    return LedgerReport(
        exactly_once=not problems, steps_rolled_back=rolled_back, restores=len(restores),
        records=[applied[s] for s in sorted(applied)], problems=problems)
