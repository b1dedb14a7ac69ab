"""Where a recovery takes lost state from (policies.recovery): each source in its order, buddy
copy coverage against the runtime's own buddy map, and the simulator paying each source."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from liveput.errors import LiveputError
from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.policies import Observation, PolicyContext, make_policy
from liveput.policies.common import model_state_bytes, stage_state_bytes
from liveput.policies.recovery import (
    RecoverySource,
    copies_cover,
    plan_recovery,
    wholly_lost_stages,
)
from liveput.runtime.memory_copies import buddy_of
from liveput.runtime.protocol import RuntimePlan
from liveput.sim import SimulationConfig, simulate_policy
from liveput.traces import IntervalTrace

GPT = load_profile("gpt-1.5b")
TABLE = estimate_configs(GPT, 32)
COSTS = MigrationCostModel.from_profile(GPT)
HIT = Configuration(2, 6)  # the best of 12 instances for GPT-1.5B
# Both replicas of stage 1 lost: the stage is wholly lost; its keepers (stage 2) survive.
STAGE_ONE_LOST = ((0, 1), (1, 1))


def context(**fields: object) -> PolicyContext:
    return PolicyContext(GPT, TABLE, COSTS, capacity=32, predictor="persistence", **fields)


def loss(lost_slots: tuple[tuple[int, int], ...], spares: int = 0) -> Observation:
    counts = np.array([12])
    history = IntervalTrace("h", 60.0, counts, np.zeros(1, dtype=int), np.zeros(1, dtype=int))
    return Observation(
        time_s=10.0,
        interval_index=0,
        interval_s=60.0,
        history=history,
        num_available=12 - len(lost_slots) + spares,
        current=HIT,
        capacity=32,
        event="preemption",
        lost_slots=lost_slots,
        remaining_s=50.0,
    )


def test_survivors_regroup_without_moving_state() -> None:
    recovery = plan_recovery(context(preemption_notice_s=0.0), loss(((0, 1), (1, 2))))
    assert recovery.source is RecoverySource.SURVIVORS
    assert recovery.start == Configuration(1, 6)
    assert (recovery.rollback_s, recovery.checkpoint_s) == (0.0, 0.0)


def test_a_notice_that_fits_a_stage_sends_it_out() -> None:
    recovery = plan_recovery(context(checkpoint_every_s=40.0), loss(STAGE_ONE_LOST))
    assert recovery.source is RecoverySource.NOTICE
    assert (recovery.salvage_stages, recovery.rollback_s) == (6, 0.0)


def test_a_notice_too_short_for_a_transfer_but_long_enough_for_a_write_checkpoints_in_it() -> None:
    slow_links = replace(COSTS, network_gbps=0.1)  # a stage takes minutes over its link
    notice_s = 30.0
    assert slow_links.transfer_s(stage_state_bytes(context(), 6)) > notice_s
    write_s = slow_links.checkpoint_save_s(model_state_bytes(context()))
    assert write_s <= notice_s
    recovery = plan_recovery(
        replace(context(checkpoint_every_s=40.0), costs=slow_links, preemption_notice_s=notice_s),
        loss(STAGE_ONE_LOST),
    )
    assert recovery.source is RecoverySource.JUST_IN_TIME
    assert recovery.checkpoint_s == pytest.approx(write_s)
    assert (recovery.salvage_stages, recovery.rollback_s) == (None, 0.0)


def test_without_a_notice_a_stage_comes_back_from_its_buddy_copy_or_the_checkpoint() -> None:
    with_copies = plan_recovery(
        context(preemption_notice_s=0.0, buddy_copies=True, checkpoint_every_s=40.0),
        loss(STAGE_ONE_LOST),
    )
    assert with_copies.source is RecoverySource.MEMORY
    assert (with_copies.salvage_stages, with_copies.rollback_s) == (6, 20.0)
    without = plan_recovery(
        context(preemption_notice_s=0.0, checkpoint_every_s=40.0), loss(STAGE_ONE_LOST)
    )
    assert without.source is RecoverySource.CHECKPOINT
    assert (without.salvage_stages, without.rollback_s) == (None, 20.0)
    # Stage 1 and its keeper, stage 2, lost in every pipeline: the copy went with it.
    both = plan_recovery(
        context(preemption_notice_s=0.0, buddy_copies=True, checkpoint_every_s=40.0),
        loss(((0, 1), (1, 1), (0, 2), (1, 2))),
    )
    assert both.source is RecoverySource.CHECKPOINT


def _runtime_plan(configuration: Configuration) -> RuntimePlan:
    d, p = configuration.data_parallel, configuration.pipeline_stages
    slots: dict[int, tuple[int, int] | None] = {
        i * p + s: (i, s) for i in range(d) for s in range(p)
    }
    return RuntimePlan(
        1, 0, 0, 10, d, p, list(range(p + 1)), slots, dict.fromkeys(slots, "127.0.0.1")
    )


@pytest.mark.parametrize("d,p", [(1, 2), (1, 3), (2, 2), (2, 3), (3, 2), (1, 4), (2, 1)])
def test_copy_coverage_matches_the_runtimes_buddy_map_for_every_loss(d: int, p: int) -> None:
    configuration = Configuration(d, p)
    plan = _runtime_plan(configuration)
    slots = [(i, s) for i in range(d) for s in range(p)]
    for size in range(1, len(slots) + 1):
        for lost in itertools.combinations(slots, size):
            lost_instances = {plan.instance_at(*slot) for slot in lost}
            # Brute force with the runtime's map: every layer of a wholly lost stage has a
            # holder up, or a keeper of some lost holder's copy up.
            holders_up = {s for (i, s) in slots if plan.instance_at(i, s) not in lost_instances}
            kept_up = {
                s
                for (i, s) in lost
                if (keeper := buddy_of(plan, plan.instance_at(i, s))) is not None
                and keeper not in lost_instances
            }
            expected = all(s in holders_up | kept_up for s in range(p))
            if not len(wholly_lost_stages(configuration, lost)):
                assert expected
                continue
            assert copies_cover(configuration, lost) == expected, (d, p, lost)


def test_a_context_refuses_a_negative_checkpoint_interval() -> None:
    with pytest.raises(LiveputError, match="checkpoint_every_s"):
        context(checkpoint_every_s=-1.0)
    with pytest.raises(LiveputError, match="checkpoint interval"):
        SimulationConfig(checkpoint_every_s=-1.0)


def test_the_liveput_policy_pays_the_source_it_recovers_from() -> None:
    observation = loss(STAGE_ONE_LOST, spares=2)  # (2, 6) again, with two spares
    base = context(preemption_notice_s=0.0, checkpoint_every_s=40.0)
    from_memory = make_policy("liveput", replace(base, buddy_copies=True)).decide(observation)
    from_storage = make_policy("liveput", base).decide(observation)
    assert from_memory.rollback_s == from_storage.rollback_s == 20.0
    # Over a link one stage's state is cheaper than a restart and the whole checkpoint.
    assert from_memory.configuration == HIT
    assert from_memory.downtime_s == pytest.approx(
        COSTS.rebuild_s(12) + COSTS.transfer_s(stage_state_bytes(base, 6))
    )
    assert from_memory.downtime_s < from_storage.downtime_s


def test_the_simulator_trains_more_with_buddy_copies_and_less_when_redoing_steps() -> None:
    # A pipeline that loses instances without a notice every few minutes.
    counts = np.array([8, 8, 6, 8, 8, 6, 8, 8, 6, 8] * 3)
    preempted = np.array([0, 2, 0, 0, 2, 0, 0, 2, 0, 0] * 3)
    allocated = np.append(np.diff(counts) + preempted[:-1], 0)
    trace = IntervalTrace("losses", 60.0, counts, preempted, allocated)

    def samples(**fields: object) -> float:
        config = SimulationConfig(preemption_notice_s=0.0, predictor="persistence", **fields)
        return simulate_policy(trace, GPT, "liveput", config).samples

    copies = samples(buddy_copies=True)
    storage = samples(buddy_copies=False)
    redone = samples(buddy_copies=False, checkpoint_every_s=120.0)
    assert copies > storage > redone
