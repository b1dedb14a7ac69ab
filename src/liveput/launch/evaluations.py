"""The evaluations of a local run, gathered from its store after the last step: each in its
step's record of the per-step log."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from liveput.runtime.store import Store, readers

if TYPE_CHECKING:
    from liveput.launch.cloud import LocalCloud
    from liveput.models.job import Job

LOG = logging.getLogger("liveput.launch.local")


def gather_evaluations(
    store: Store, job: Job, steps: int, timeout_s: float, cloud: LocalCloud, started_s: float
) -> list[dict]:
    """The job's evaluations of the run. The last ones may still run when the last step
    commits (an agent finishes its evaluations before it exits): they are waited for while an
    agent is left, within the run's ``timeout_s`` from ``started_s``; one whose agent was lost
    is left out."""
    due = [step for step in range(steps) if job.evaluation_due(step)]
    found = readers.evaluations(store, due)
    while len(found) < len(due) and cloud.agents_running:
        if time.monotonic() - started_s > timeout_s:
            break
        time.sleep(0.2)
        found.update(readers.evaluations(store, [s for s in due if s not in found]))
    missing = [step for step in due if step not in found]
    if missing:
        LOG.warning("train: no evaluation after step(s) %s (their instance was lost)", missing)
    fields = ("step", "metrics", "error", "instance", "eval_s")
    return [{k: found[s][k] for k in fields if k in found[s]} for s in sorted(found)]


def attach_evaluations(records: list[dict], evaluations: list[dict]) -> None:
    """Each evaluation in its step's ledger record (the per-step log's line), as ``eval``."""
    by_step = {e["step"]: e.get("metrics", {"error": e.get("error")}) for e in evaluations}
    for record in records:
        if record.get("step") in by_step:
            record["eval"] = by_step[record["step"]]
