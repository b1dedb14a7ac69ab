"""Where a recovery after a loss takes the lost state from, and what that costs (pure).

Notation: the configuration hit is ``(D, P)``; slot ``(d, s)`` is replica ``d`` of stage ``s``; a
stage is *wholly lost* when every one of its ``D`` replicas was on a lost instance. ``b`` is one
stage's training state (weights and optimizer, bytes), ``B = P b`` the model's; ``N`` the
notice the cloud gives (``PolicyContext.preemption_notice_s``); ``K`` the training seconds
between the job's periodic checkpoints (``PolicyContext.checkpoint_every_s``).

The sources, the first that applies (the runtime's coordinator chooses in the same order):

1. ``survivors``: no stage wholly lost; the complete pipelines regroup, no state moves.
2. ``notice``: the leaving instances send a wholly lost stage out during the notice, when one
   stage's transfer fits in it (``transfer(b) <= N``; Parcae; the runtime's Rules 3-4).
3. ``just-in-time``: else, with a notice, the leaving instances checkpoint the step they end at
   when the write fits in it (``save(B) <= N``; the runtime's Rule 9): the job restores it and
   redoes nothing, and the write's seconds are training lost (its fence).
4. ``memory``: else, with buddy copies (``PolicyContext.buddy_copies``), every wholly lost stage
   ``s`` whose keeper survived (slot ``(d, s + 1 mod P)`` for some ``d``, P > 1; the runtime's
   :func:`liveput.runtime.memory_copies.buddy_of`) comes back from that keeper's memory over a
   link, as (2) costs, and the steps since the copy point are redone: ``K / 2`` on average, a
   loss falling uniformly between two copies.
5. ``checkpoint``: else the checkpoint storage (a restore), with the same ``K / 2`` redone.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from liveput.perf.configuration import Configuration
from liveput.policies.base import Observation, PolicyContext
from liveput.policies.common import (
    lost_per_stage,
    model_state_bytes,
    stage_state_bytes,
    surviving_pipelines,
)


class RecoverySource(str, Enum):
    """Where the lost state comes from (module docstring, in order of preference)."""

    SURVIVORS = "survivors"
    NOTICE = "notice"
    JUST_IN_TIME = "just-in-time"
    MEMORY = "memory"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Recovery:
    """Where a recovery starts and what it costs besides the move the optimizer picks."""

    source: RecoverySource
    start: Configuration | None
    """The complete pipelines the survivors form without moving state (None: every pipeline
    lost a stage)."""
    salvage_stages: int | None
    """The depth P whose lost stages come back over links (sources ``notice`` and ``memory``),
    for :meth:`liveput.plan.LiveputOptimizer.recover`; None: the checkpoint, or no state to
    bring."""
    checkpoint_s: float = 0.0
    """Training seconds a just-in-time checkpoint's write takes (source ``just-in-time``)."""
    rollback_s: float = 0.0
    """Training seconds redone (sources ``memory`` and ``checkpoint``: ``K / 2``)."""


def wholly_lost_stages(
    configuration: Configuration, lost_slots: tuple[tuple[int, int], ...]
) -> np.ndarray:
    """The stages of ``configuration`` that lost every replica."""
    return np.flatnonzero(lost_per_stage(configuration, lost_slots) >= configuration.data_parallel)


def copies_cover(configuration: Configuration, lost_slots: tuple[tuple[int, int], ...]) -> bool:
    """Every wholly lost stage has a surviving keeper of its buddy copy (source 4)."""
    stages = configuration.pipeline_stages
    if stages < 2:
        return False  # one stage wholly lost: every instance of the configuration is gone
    lost = set(lost_slots)
    return all(
        any((d, (int(s) + 1) % stages) not in lost for d in range(configuration.data_parallel))
        for s in wholly_lost_stages(configuration, lost_slots)
    )


def plan_recovery(context: PolicyContext, observation: Observation) -> Recovery:
    """The source of the state lost in ``observation`` (a preemption) and its costs."""
    current = observation.current
    if current is None:
        return Recovery(RecoverySource.CHECKPOINT, None, None)
    survivors = surviving_pipelines(current, observation.lost_slots)
    if survivors > 0:
        start = Configuration(survivors, current.pipeline_stages)
        return Recovery(RecoverySource.SURVIVORS, start, None)
    notice_s = context.preemption_notice_s
    costs = context.costs
    depth = current.pipeline_stages
    if notice_s > 0 and costs.transfer_s(stage_state_bytes(context, depth)) <= notice_s:
        return Recovery(RecoverySource.NOTICE, None, depth)
    write_s = costs.checkpoint_save_s(model_state_bytes(context))
    if notice_s > 0 and write_s <= notice_s:
        return Recovery(RecoverySource.JUST_IN_TIME, None, None, checkpoint_s=write_s)
    redo_s = context.checkpoint_every_s / 2
    if context.buddy_copies and copies_cover(current, observation.lost_slots):
        return Recovery(RecoverySource.MEMORY, None, depth, rollback_s=redo_s)
    return Recovery(RecoverySource.CHECKPOINT, None, None, rollback_s=redo_s)
