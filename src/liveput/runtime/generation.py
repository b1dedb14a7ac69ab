"""What a generation of a plan is for one instance: where its slot puts it (its ranks, its stage
position, the layers it checkpoints), why the generation ended and how it went."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from liveput.runtime.layer_state import LayerState
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.schedule import StagePosition

__all__ = [
    "Ending",
    "GenerationResult",
    "Slot",
    "checkpoint_share",
    "group_ranks",
    "stage_position",
]

Slot = tuple[int, int]
"""(pipeline, stage) of an instance in a plan."""


class Ending(enum.Enum):
    """Why a generation ended for this instance."""

    FENCED = "fenced"
    """The coordinator ended it at a step boundary (a new plan follows)."""
    FINISHED = "finished"
    """The job's last step was applied."""
    FAILED = "failed"
    """Communication with a peer failed (it died); the step in flight was not applied."""
    SPARE = "spare"
    """This instance has no slot in the plan (it only sent layers)."""
    STOPPED = "stopped"
    """The agent asked to stop (its instance is about to be preempted)."""


@dataclass
class GenerationResult:
    """How a generation went for this instance."""

    ending: Ending
    last_applied: int
    """The last step whose update this instance holds."""
    setup_s: float = 0.0
    """Seconds from the start of the generation to its first step (rendezvous + state moves)."""
    losses: dict[int, float] = field(default_factory=dict)
    """Loss of each step applied (last stage only)."""


def group_ranks(
    plan: RuntimePlan, slot: Slot | None, global_norm_needed: bool
) -> tuple[list[int] | None, list[int] | None]:
    """The world ranks of ``slot``'s stage group (its replicas: the same stage of every
    pipeline) and of its pipeline group (only when the update needs a global norm); None for an
    instance without a slot."""
    if slot is None:
        return None, None
    stage_ranks = sorted(
        plan.rank_of(i) for i, s in plan.slots.items() if s is not None and s[1] == slot[1]
    )
    pipeline_ranks = None
    if global_norm_needed:
        pipeline_ranks = sorted(
            plan.rank_of(i) for i, s in plan.slots.items() if s is not None and s[0] == slot[0]
        )
    return stage_ranks, pipeline_ranks


def stage_position(plan: RuntimePlan, slot: Slot) -> StagePosition:
    """Where ``slot`` sits in the plan's configuration, with the ranks of its neighbour stages."""
    return StagePosition(
        pipeline=slot[0],
        stage=slot[1],
        data_parallel=plan.data_parallel,
        pipeline_stages=plan.pipeline_stages,
        previous_rank=plan.rank_of(plan.instance_at(slot[0], slot[1] - 1)) if slot[1] > 0 else None,
        next_rank=plan.rank_of(plan.instance_at(slot[0], slot[1] + 1))
        if slot[1] < plan.pipeline_stages - 1
        else None,
    )


def checkpoint_share(layers: list[LayerState], position: StagePosition) -> list[LayerState]:
    """The layers this instance writes to a checkpoint: of its stage's layers, those whose index
    is its pipeline modulo D. The D instances of a stage hold the same layers, so every layer
    of the model is written exactly once, and the writing (serializing, signing, the disk) is
    spread over the D replicas instead of falling on pipeline 0 alone, whose peers would
    wait for it at the next all-reduce."""
    return [layer for layer in layers if layer.index % position.data_parallel == position.pipeline]
