"""What ``liveput train``'s progress bar shows of a local run, read from the job's store."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from liveput.runtime import keys
from liveput.runtime.checkpoint import latest_checkpoint
from liveput.runtime.coordinator import Coordinator
from liveput.runtime.store import Store, readers


@dataclass
class Progress:
    """What the progress bar shows."""

    step: int
    loss: float | None
    configuration: str
    instances: int
    events: int
    state: str = ""
    """What the job is doing (the coordinator's words: training, migrating, restoring, ...)."""
    cloud_elapsed_s: float = 0.0
    """Wall seconds since the emulated cloud started its first instances (it starts before
    the coordinator is built, so the first progress comes a few seconds later)."""
    checkpoints_failed: int = 0
    """Checkpoint writes that failed so far."""
    checkpoint_step: int | None = None
    """Step of the newest complete checkpoint (None: none yet)."""


def read_progress(store: Store, coordinator: Coordinator, cloud_started_s: float) -> Progress:
    """The progress now (``cloud_started_s``: when the emulated cloud started, monotonic)."""
    plan = coordinator.plan
    loss = None
    if plan is not None and coordinator.committed >= 0:
        raw = store.get(keys.ledger_record(plan.epoch, coordinator.committed))
        loss = json.loads(raw)["loss"] if raw else None
    return Progress(
        step=coordinator.committed + 1,
        loss=loss,
        configuration="-" if plan is None else f"{plan.data_parallel}x{plan.pipeline_stages}",
        instances=len(coordinator.available),
        events=0 if plan is None else plan.generation,
        state=coordinator.status,
        cloud_elapsed_s=time.monotonic() - cloud_started_s,
        checkpoints_failed=readers.checkpoint_failures(store)[0],
        checkpoint_step=latest_checkpoint(store),
    )
