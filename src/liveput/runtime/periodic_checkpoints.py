"""One instance's periodic checkpoints during a generation: when one is due, how its write is
spread, and what each cost training.

After every K-th committed step (and each step the job evaluates the model at: it is read from
that checkpoint) the instance saves its share of the step's checkpoint
(:func:`liveput.runtime.generation.checkpoint_share`): a snapshot now, the write in the
background, spread over ``checkpoint_spread`` of K median steps so that it does not take the
instance's link whole. Each checkpoint's stall (:mod:`liveput.runtime.checkpoint_stall`) is
logged once its write is seen over, a warning where the write cost more than the snapshot.
"""

from __future__ import annotations

import logging
import time

from liveput.models.job import Job
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.checkpoint_stall import CheckpointStall, CheckpointStallWatch
from liveput.runtime.copy_keeper import CopyKeeper
from liveput.runtime.engine_config import EngineConfig
from liveput.runtime.generation import checkpoint_share
from liveput.runtime.layer_state import LayerState
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.schedule import StagePosition

LOG = logging.getLogger(__name__)


class PeriodicCheckpoints:
    """The periodic checkpoints of one generation on one instance."""

    def __init__(
        self,
        job: Job,
        checkpointer: Checkpointer | None,
        config: EngineConfig,
        instance: int,
        keeper: CopyKeeper | None = None,
    ) -> None:
        self.job = job
        self.checkpointer = checkpointer
        self.config = config
        self.instance = instance
        self.keeper = keeper
        """Keeps the memory copies, refreshed at each periodic checkpoint (None: none kept)."""
        self.stalls = CheckpointStallWatch()

    def writing(self) -> bool:
        """A write is running or waiting to (a step that begins now runs beside it)."""
        return self.checkpointer is not None and self.checkpointer.writing()

    def after_step(
        self,
        plan: RuntimePlan,
        step: int,
        layers: list[LayerState],
        position: StagePosition,
        duration_s: float,
        writing: bool,
    ) -> None:
        """Step ``step`` committed and applied in ``duration_s``, begun beside a write
        (``writing``) or not: save this instance's share if a checkpoint is due, and log the
        stall of one whose write is now seen over."""
        stalled = self.stalls.step(duration_s, writing)
        every = self.config.checkpoint_every
        periodic = bool(every) and (step + 1) % every == 0
        # After a restore, copies of its first step in the new epoch (those of the epoch
        # before no longer count): a loss before the next periodic copy reads them. Not at
        # the restore itself: its sources still serve the copies it reads.
        restored = plan.restore_step is not None and plan.restore_step >= 0
        copy = self.keeper is not None and (periodic or (restored and step == plan.start_step))
        share = self._share_due(step, layers, position)
        if copy or share:
            # One snapshot for the copies and the checkpoint: each cloned the same state.
            taken_s = time.perf_counter()
            states = {layer.index: layer.state_dict() for layer in (layers if copy else share)}
            snapshot_s = time.perf_counter() - taken_s
            spread_s = self._spread_s()
            if copy and self.keeper is not None:
                self.keeper.refresh(plan, plan.epoch, step, states, spread_s)
            if share and self.checkpointer is not None:
                written = {layer.index: states[layer.index] for layer in share}
                self.checkpointer.write_async(
                    plan.epoch, step, written, self.job.num_layers, spread_s, taken_s
                )
                stalled = self.stalls.checkpointed(step, snapshot_s) or stalled
        if stalled is not None:
            self._log(stalled)

    def _share_due(
        self, step: int, layers: list[LayerState], position: StagePosition
    ) -> list[LayerState]:
        """This instance's share of a checkpoint due after ``step`` (none: none due, or no
        checkpoints)."""
        every = self.config.checkpoint_every
        due = (every and (step + 1) % every == 0) or self.job.evaluation_due(step)
        if not due or self.checkpointer is None:
            return []
        return checkpoint_share(layers, position)

    def _spread_s(self) -> float | None:
        """Seconds a periodic write is spread over (None: not yet known, or not periodic)."""
        every = self.config.checkpoint_every
        median_s = self.stalls.median_step_s
        if not every or median_s is None:
            return None
        return self.config.checkpoint_spread * every * median_s

    def _log(self, stall: CheckpointStall) -> None:
        level = logging.WARNING if stall.slower_s > stall.snapshot_s else logging.INFO
        LOG.log(level, "instance %d: %s", self.instance, stall.describe())
