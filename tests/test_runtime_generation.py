"""Where a plan's slot puts an instance: its group ranks and its stage position."""

from __future__ import annotations

import itertools
import random

import pytest

from liveput.runtime.generation import group_ranks, stage_position
from liveput.runtime.protocol import RuntimePlan


def shuffled_plan(data_parallel: int, stages: int, spares: int, seed: int) -> RuntimePlan:
    """A D x P plan whose slots fall on shuffled, non-consecutive instance ids, with spares."""
    rng = random.Random(seed)
    slots: list[tuple[int, int] | None] = list(
        itertools.product(range(data_parallel), range(stages))
    )
    slots += [None] * spares
    ids = rng.sample(range(100), len(slots))
    rng.shuffle(slots)
    return RuntimePlan(
        generation=1,
        epoch=0,
        start_step=0,
        end_step=10,
        data_parallel=data_parallel,
        pipeline_stages=stages,
        boundaries=list(range(stages + 1)),
        slots=dict(zip(ids, slots, strict=True)),
        hosts=dict.fromkeys(ids, "h"),
    )


@pytest.mark.parametrize(("data_parallel", "stages", "spares"), [(1, 1, 0), (2, 3, 1), (4, 2, 2)])
def test_ranks_and_positions_follow_the_slots(data_parallel: int, stages: int, spares: int) -> None:
    plan = shuffled_plan(data_parallel, stages, spares, seed=data_parallel * 10 + stages)
    rank = {instance: plan.world.index(instance) for instance in plan.slots}
    where = {slot: instance for instance, slot in plan.slots.items() if slot is not None}
    for slot in plan.slots.values():
        if slot is None:
            assert group_ranks(plan, slot, global_norm_needed=True) == (None, None)
            continue
        pipeline, stage = slot
        stage_ranks, pipeline_ranks = group_ranks(plan, slot, global_norm_needed=True)
        assert stage_ranks == sorted(rank[where[d, stage]] for d in range(data_parallel))
        assert pipeline_ranks == sorted(rank[where[pipeline, p]] for p in range(stages))
        assert group_ranks(plan, slot, global_norm_needed=False) == (stage_ranks, None)
        position = stage_position(plan, slot)
        assert (position.pipeline, position.stage) == slot
        assert (position.data_parallel, position.pipeline_stages) == (data_parallel, stages)
        assert position.previous_rank == (rank[where[pipeline, stage - 1]] if stage > 0 else None)
        assert position.next_rank == (
            rank[where[pipeline, stage + 1]] if stage < stages - 1 else None
        )
