"""The migration planner against brute force over every assignment."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from seeds import for_each_seed

from liveput.errors import LiveputError
from liveput.perf import MigrationCostModel, load_profile, partition_layers
from liveput.perf.configuration import Configuration
from liveput.plan.migration import CHECKPOINT, Assignment, plan_from_holdings, plan_migration

PROFILE = load_profile("bert-large")  # 24 layers: small cases stay enumerable
COSTS = MigrationCostModel()


def brute_force_bytes(
    assignment: Assignment, survivors: list[int], target: Configuration, stages_before: int
) -> int:
    layer_bytes = PROFILE.layer_state_bytes()
    old = partition_layers(PROFILE, stages_before)
    new = partition_layers(PROFILE, target.pipeline_stages)

    def held(instance: int) -> set[int]:
        slot = assignment.slots.get(instance)
        return set() if slot is None else set(range(old[slot.stage], old[slot.stage + 1]))

    slots = [s for _ in range(target.data_parallel) for s in range(target.pipeline_stages)]
    best = None
    for chosen in itertools.permutations(survivors, len(slots)):
        total = sum(
            int(layer_bytes[layer])
            for instance, stage in zip(chosen, slots)
            for layer in range(new[stage], new[stage + 1])
            if layer not in held(instance)
        )
        best = total if best is None else min(best, total)
    return best


def test_planner_moves_the_fewest_bytes() -> None:
    for_each_seed(range(8), _planner_moves_the_fewest_bytes)


def _planner_moves_the_fewest_bytes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, p = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    spares = int(rng.integers(0, 2))
    instances = list(range(d * p + spares))
    assignment = Assignment.for_configuration(Configuration(d, p), instances)
    preempted = set(rng.choice(instances, size=int(rng.integers(0, 3)), replace=False).tolist())
    allocated = [100 + i for i in range(int(rng.integers(0, 2)))]
    survivors = [i for i in instances if i not in preempted] + allocated
    new_p = int(rng.integers(1, 4))
    new_d = max(1, min(2, len(survivors) // new_p))
    if new_d * new_p > len(survivors):
        new_d, new_p = 1, 1
    target = Configuration(new_d, new_p)
    plan = plan_migration(PROFILE, COSTS, assignment, preempted, allocated, target)
    moved = plan.bytes_moved + plan.bytes_restored
    assert moved == brute_force_bytes(assignment, survivors, target, p)
    used = [s for s in plan.assignment.slots.values() if s is not None]
    assert len(used) == len(set(used)) == target.num_instances
    assert not preempted & set(plan.assignment.slots)
    for transfer in plan.transfers:
        assert transfer.source == CHECKPOINT or transfer.source not in preempted


def test_kinds_and_estimated_times() -> None:
    profile = load_profile("gpt-1.5b")
    assignment = Assignment.for_configuration(Configuration(4, 8), list(range(34)))
    same = plan_migration(profile, COSTS, assignment, set(), [], Configuration(4, 8))
    assert same.kind == "none" and same.estimated_s == 0 and same.bytes_moved == 0
    regroup = plan_migration(profile, COSTS, assignment, {3}, [], Configuration(3, 8))
    assert regroup.kind == "intra-stage" and regroup.bytes_moved == 0
    assert regroup.estimated_s == pytest.approx(COSTS.rebuild_s(24))
    refill = plan_migration(profile, COSTS, assignment, {3}, [], Configuration(4, 8))
    stage_bytes = profile.layer_state_bytes()[:6].sum()
    assert refill.kind == "inter-stage" and refill.bytes_moved == stage_bytes
    deeper = plan_migration(profile, COSTS, assignment, set(), [], Configuration(2, 16))
    # Re-partition keeps layers where they are: only the few layers a new stage's cut moves
    # across an old boundary travel (GPT's per-block cut does not nest 8 stages in 16).
    assert deeper.kind == "pipeline" and deeper.bytes_restored == 0
    assert 0 < deeper.bytes_moved <= 0.05 * profile.layer_state_bytes().sum()
    lost_stage = plan_migration(profile, COSTS, assignment, {0, 8, 16, 24}, [], Configuration(3, 8))
    assert lost_stage.kind == "checkpoint-restore" and lost_stage.bytes_restored == 3 * stage_bytes
    assert lost_stage.estimated_s > regroup.estimated_s


def test_target_larger_than_survivors_is_refused() -> None:
    assignment = Assignment.for_configuration(Configuration(2, 2), [0, 1, 2, 3])
    with pytest.raises(LiveputError, match="needs 4 instances; 3 survive"):
        plan_migration(PROFILE, COSTS, assignment, {0}, [], Configuration(2, 2))


def test_planning_from_reported_holdings_moves_the_fewest_bytes() -> None:
    for_each_seed(range(8), _planning_from_reported_holdings_moves_the_fewest_bytes)


def _planning_from_reported_holdings_moves_the_fewest_bytes(seed: int) -> None:
    """Holdings as instances report them (any layer sets, e.g. after a plan that failed halfway)
    against brute force; a layer nobody holds comes from the checkpoint, and only then."""
    rng = np.random.default_rng(100 + seed)
    layer_bytes = PROFILE.layer_state_bytes()
    instances = list(range(int(rng.integers(1, 5))))
    held = {
        i: sorted(
            set(
                rng.choice(PROFILE.num_layers, size=int(rng.integers(0, 12)), replace=True).tolist()
            )
        )
        for i in instances
    }
    new_p = int(rng.integers(1, 4))
    new_d = max(1, len(instances) // new_p)
    if new_d * new_p > len(instances):
        new_d, new_p = 1, 1
    target = Configuration(new_d, new_p)
    plan = plan_from_holdings(PROFILE, COSTS, held, target)
    new = partition_layers(PROFILE, target.pipeline_stages)
    slots = [s for _ in range(target.data_parallel) for s in range(target.pipeline_stages)]
    best = min(
        sum(
            int(layer_bytes[layer])
            for instance, stage in zip(chosen, slots, strict=True)
            for layer in range(new[stage], new[stage + 1])
            if layer not in held[instance]
        )
        for chosen in itertools.permutations(instances, len(slots))
    )
    assert plan.bytes_moved + plan.bytes_restored == best
    anyone = {layer for layers in held.values() for layer in layers}
    for transfer in plan.transfers:
        assert (transfer.source == CHECKPOINT) == (transfer.layer not in anyone)
        if transfer.source != CHECKPOINT:
            assert transfer.layer in held[transfer.source]


def test_on_demand_instances_spread_over_the_stages_then_the_fewest_bytes_move() -> None:
    for_each_seed(range(12), _on_demand_instances_spread_over_the_stages_then_the_fewest_bytes_move)


def _on_demand_instances_spread_over_the_stages_then_the_fewest_bytes_move(seed: int) -> None:
    """Constraints (4)-(5) against brute force: of every assignment that puts as many on-demand
    instances to work as can be and gives each stage q or q + 1 of them, the planner's moves
    the fewest bytes; with no on-demand instance it is the plain optimum."""
    rng = np.random.default_rng(500 + seed)
    layer_bytes = PROFILE.layer_state_bytes()
    instances = list(range(int(rng.integers(2, 7))))
    held = {
        i: sorted(
            set(
                rng.choice(PROFILE.num_layers, size=int(rng.integers(0, 14)), replace=True).tolist()
            )
        )
        for i in instances
    }
    on_demand = set(
        rng.choice(instances, size=int(rng.integers(1, len(instances) + 1)), replace=False).tolist()
    )
    new_p = int(rng.integers(1, 4))
    new_d = max(1, min(2, len(instances) // new_p))
    if new_d * new_p > len(instances):
        new_d, new_p = 1, 1
    target = Configuration(new_d, new_p)
    plan = plan_from_holdings(PROFILE, COSTS, held, target, on_demand=on_demand)
    new = partition_layers(PROFILE, new_p)
    stages = [s for _ in range(new_d) for s in range(new_p)]
    working = min(len(on_demand), target.num_instances)

    def spread(chosen: tuple[int, ...]) -> bool:
        per_stage = [
            sum(i in on_demand for i, s in zip(chosen, stages) if s == stage)
            for stage in range(new_p)
        ]
        return sum(per_stage) == working and max(per_stage) - min(per_stage) <= 1

    def moved(chosen: tuple[int, ...]) -> int:
        return sum(
            int(layer_bytes[layer])
            for instance, stage in zip(chosen, stages)
            for layer in range(new[stage], new[stage + 1])
            if layer not in held[instance]
        )

    best = min(moved(c) for c in itertools.permutations(instances, len(stages)) if spread(c))
    assert plan.bytes_moved + plan.bytes_restored == best
    placed = tuple(
        next(
            i
            for i, s in plan.assignment.slots.items()
            if s is not None and (s.pipeline, s.stage) == (d, st)
        )
        for d in range(new_d)
        for st in range(new_p)
    )
    assert spread(placed)
    assert plan.assignment.on_demand == frozenset(on_demand)


def test_a_new_on_demand_instance_takes_a_slot_from_a_spot_one() -> None:
    """A whole stage of spot replicas is what a loss can take: the on-demand newcomer goes into
    the configuration (paying a transfer) rather than idle as a spare."""
    target = Configuration(1, 2)
    assignment = Assignment.for_configuration(target, [0, 1])
    plan = plan_migration(PROFILE, COSTS, assignment, set(), [], target)
    assert plan.kind == "none"
    held = {0: range(0, 12), 1: range(12, 24), 7: ()}
    plan = plan_from_holdings(PROFILE, COSTS, held, target, assignment, 2, on_demand={7})
    assert plan.assignment.slots[7] is not None
    assert plan.kind == "inter-stage" and plan.bytes_restored == 0
