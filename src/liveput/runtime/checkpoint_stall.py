"""What a periodic checkpoint costs training, as one instance measures it.

A checkpoint copies the layers' state at a step boundary (the snapshot, on training's critical
path) and writes it in a background thread. On shaped links the write shares the instance's link
with activations and stage transfers, and on busy cores its serializing shares them with
training: the steps that run while it writes may be slower. The stall of a checkpoint is

    stall_s = snapshot_s + max(0, sum(d_i for the steps during the write) - n * median_outside_s)

where the d_i are the durations, seconds, of the n steps that began while the write was running
and ``median_outside_s`` the median duration of the newest steps that began while no write was.
Where the write is free, the stall is the snapshot alone.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class CheckpointStall:
    """One checkpoint's cost to training on this instance."""

    step: int
    """The step checkpointed."""
    snapshot_s: float
    """Seconds the copy of this instance's share took, at the step boundary."""
    steps_during: int
    """Steps that began while its write was running."""
    slower_s: float
    """Seconds those steps took beyond as many median steps without a write (may be < 0)."""
    median_step_s: float | None
    """The median step without a write it was measured against (None: none measured yet)."""

    @property
    def stall_s(self) -> float:
        """Seconds training lost to it: the snapshot and the write's slowdown (module
        docstring)."""
        return self.snapshot_s + max(0.0, self.slower_s)

    def describe(self) -> str:
        against = "" if self.median_step_s is None else f" (median step {self.median_step_s:.3f} s)"
        return (
            f"checkpoint of step {self.step} cost training {self.stall_s:.3f} s: snapshot "
            f"{self.snapshot_s:.3f} s, {self.steps_during} steps during its write "
            f"{self.slower_s:+.3f} s{against}"
        )


class CheckpointStallWatch:
    """Feeds on one instance's steps and checkpoints; gives each checkpoint's stall once its
    write is over."""

    def __init__(self, window: int = 32) -> None:
        self.outside: deque[float] = deque(maxlen=window)
        """Durations of the newest steps that began with no write running."""
        self._pending: tuple[int, float, list[float]] | None = None

    @property
    def median_step_s(self) -> float | None:
        """The median of the newest steps without a write (None: none yet)."""
        return statistics.median(self.outside) if self.outside else None

    def checkpointed(self, step: int, snapshot_s: float) -> CheckpointStall | None:
        """A checkpoint of ``step`` was snapshotted in ``snapshot_s``; the stall of the one
        before if its write had not been seen over (None: none)."""
        previous = self._close()
        self._pending = (step, snapshot_s, [])
        return previous

    def step(self, duration_s: float, writing: bool) -> CheckpointStall | None:
        """A step of ``duration_s`` that began with a write running (``writing``) or not; the
        stall of the checkpoint whose write is now seen over (None: none)."""
        if writing and self._pending is not None:
            self._pending[2].append(duration_s)
            return None
        finished = self._close()
        self.outside.append(duration_s)
        return finished

    def _close(self) -> CheckpointStall | None:
        if self._pending is None:
            return None
        step, snapshot_s, during = self._pending
        self._pending = None
        median_s = self.median_step_s
        slower_s = 0.0 if median_s is None else sum(during) - len(during) * median_s
        return CheckpointStall(step, snapshot_s, len(during), slower_s, median_s)
