"""The per-step log of a run (``-o run.json`` -> ``run.jsonl``), written as steps commit.

Each line is a committed step's ledger record (step, loss, samples, configuration, commit time).
Lines are appended as the coordinator commits steps, so a long run's log can be followed (``tail
-f``) and survives an interrupted run; at the end the file is rewritten from the verified ledger
(a step redone after a restore is logged once, as the ledger counts it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from liveput.files import write_text_atomic
from liveput.runtime import keys

if TYPE_CHECKING:
    from liveput.runtime.coordinator import Coordinator


class StepLog:
    """Appends committed steps' records to ``path`` (JSON lines) as a run goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.last_step = -1
        """The newest step (0-based) written."""
        path.write_text("")

    def advance(self, coordinator: Coordinator) -> int:
        """Append the records of the steps committed since the last call; how many."""
        plan = coordinator.plan
        if plan is None or coordinator.committed <= self.last_step:
            return 0
        lines = []
        for step in range(self.last_step + 1, coordinator.committed + 1):
            raw = coordinator.store.get(keys.ledger_record(plan.epoch, step))
            if raw is None:  # from an earlier epoch (before a restore): the final rewrite has it
                continue
            lines.append(json.dumps(json.loads(raw)) + "\n")
        self.last_step = coordinator.committed
        with self.path.open("a") as handle:
            handle.writelines(lines)
        return len(lines)

    def finish(self, records: list[dict]) -> None:
        """The whole log from the verified ledger's ``records``, replacing what was appended."""
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in records))
