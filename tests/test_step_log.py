"""``train -o``'s per-step log is written as steps commit, then rewritten from the verified
ledger at the end."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from liveput.launch.steplog import StepLog
from liveput.runtime import keys
from liveput.runtime.store import MemoryStore


@dataclass
class _Plan:
    epoch: int


@dataclass
class _Progress:
    """What the log reads of the coordinator: its store, plan and last committed step."""

    store: MemoryStore
    plan: _Plan | None
    committed: int


def test_the_step_log_grows_as_steps_commit(tmp_path: Path) -> None:
    store = MemoryStore()
    for step in range(10):
        record = {"step": step, "loss": 5.0 - step / 10}
        store.set(keys.ledger_record(0, step), json.dumps(record).encode())
    log = StepLog(tmp_path / "run.jsonl")
    assert log.advance(_Progress(store, None, -1)) == 0  # nothing planned yet
    assert log.advance(_Progress(store, _Plan(0), 3)) == 4  # type: ignore[arg-type]
    assert [json.loads(line)["step"] for line in log.path.read_text().splitlines()] == [0, 1, 2, 3]
    assert log.advance(_Progress(store, _Plan(0), 3)) == 0  # type: ignore[arg-type]
    assert log.advance(_Progress(store, _Plan(0), 9)) == 6  # type: ignore[arg-type]
    lines = log.path.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(10))
    log.finish([{"step": 0, "loss": 1.0}])
    assert log.path.read_text() == '{"step": 0, "loss": 1.0}\n'
