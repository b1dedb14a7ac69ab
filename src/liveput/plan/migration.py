"""The migration planner: which instance takes which slot of the target, and what it receives.

Notation. Surviving instances i (old ones not preempted, plus new ones), each holding the layers
of its old stage (none if new or spare). Target slots (d, s) for d < D', s < P', slot (d, s) needs
the layers of stage s of the target partition. ``bytes(L)`` = parameters + optimizer state of
layers L. ``x[i, (d, s)] = 1`` assigns instance i to slot (d, s).

Objective: minimize the bytes moved, ``sum x[i, (d,s)] * bytes(need(s) - held(i))``.
Constraints: (1) every slot gets exactly one instance; (2) an instance takes at most one slot
(the rest become spares); (3) only surviving instances are assigned.

On-demand instances (never preempted) go where a loss would hurt most: a stage whose replicas
are all spot can be lost whole, which costs a checkpoint restore and a rollback, so on-demand
instances are spread over the stages first (the performance model's
:func:`~liveput.plan.liveput.on_demand_per_stage` assumes the same). With ``k`` on-demand
survivors, ``k' = min(k, D' * P')`` of them work, ``k' = q * P' + r``:
(4) an on-demand instance takes only a slot of pipeline ``d < ceil(k' / P')``, a spot one only
of pipeline ``d >= q`` (so each stage holds ``q`` or ``q + 1`` on-demand instances);
(5) as many on-demand instances work as can: each one assigned earns a bonus larger than the
bytes of any one slot, so no spot instance takes a slot an idle on-demand one could.
Bytes are minimized under (4)-(5); with no on-demand instance nothing changes.

This is a rectangular assignment problem, solved exactly by ``linear_sum_assignment``. Layers a
slot lacks are sent by a surviving holder (the least loaded one); a layer that no survivor holds
is restored from the last checkpoint, which makes the migration a ``checkpoint-restore``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.configuration import Configuration, MigrationKind
from liveput.perf.partition import partition_layers
from liveput.perf.types import ModelProfile
from liveput.plan.costs import CostModel

CHECKPOINT = -1
"""Source id of a layer restored from the checkpoint."""


@dataclass(frozen=True)
class Slot:
    """Stage ``stage`` of pipeline ``pipeline``."""

    pipeline: int
    stage: int


@dataclass(frozen=True)
class Assignment:
    """Which instance runs which slot (None: spare) under a partition into ``num_stages``."""

    slots: dict[int, Slot | None]
    """Instance id -> slot or None."""
    num_stages: int
    """P of the running configuration (0 when nothing runs)."""
    on_demand: frozenset[int] = field(default_factory=frozenset)
    """Instances that are on-demand (never preempted)."""

    @classmethod
    def for_configuration(cls, configuration: Configuration, instances: list[int]) -> Assignment:
        """The canonical assignment: instance ``d * P + s`` holds stage s of pipeline d."""
        size = configuration.num_instances
        if len(instances) < size:
            raise LiveputError(
                f"configuration {configuration} needs {size} instances, {len(instances)} given"
            )
        slots: dict[int, Slot | None] = dict.fromkeys(instances)
        for index, instance in enumerate(instances[:size]):
            slots[instance] = Slot(
                index // configuration.pipeline_stages, index % configuration.pipeline_stages
            )
        return cls(slots, configuration.pipeline_stages)


@dataclass(frozen=True)
class LayerTransfer:
    """One layer's parameters and optimizer state sent to an instance."""

    layer: int
    source: int
    """Instance id, or ``CHECKPOINT``."""
    destination: int
    num_bytes: int


@dataclass(frozen=True)
class MigrationPlan:
    """What the runtime executes to reach the target."""

    target: Configuration
    assignment: Assignment
    """The new slot of every surviving instance."""
    transfers: tuple[LayerTransfer, ...]
    bytes_moved: int
    """Bytes sent peer to peer (checkpoint restores excluded)."""
    bytes_restored: int
    """Bytes loaded from the checkpoint."""
    kind: MigrationKind
    """``none``, ``intra-stage``, ``inter-stage``, ``pipeline`` or ``checkpoint-restore``."""
    estimated_s: float


def _held_layers(assignment: Assignment, boundaries: np.ndarray | None, instance: int) -> range:
    slot = assignment.slots.get(instance)
    if slot is None or boundaries is None:
        return range(0)
    return range(int(boundaries[slot.stage]), int(boundaries[slot.stage + 1]))


def plan_migration(
    profile: ModelProfile,
    costs: CostModel,
    assignment: Assignment,
    preempted: set[int],
    allocated: list[int],
    target: Configuration,
    num_stages_before: int | None = None,
) -> MigrationPlan:
    """The cheapest plan (fewest bytes moved) from ``assignment`` to ``target``."""
    stages_before = assignment.num_stages if num_stages_before is None else num_stages_before
    survivors = [i for i in assignment.slots if i not in preempted] + list(allocated)
    if len(set(survivors)) != len(survivors):
        raise LiveputError("an allocated instance id is already in the assignment")
    old_bounds = partition_layers(profile, stages_before) if stages_before > 0 else None
    held = {i: _held_layers(assignment, old_bounds, i) for i in survivors}
    return plan_from_holdings(
        profile,
        costs,
        held,
        target,
        assignment,
        stages_before,
        preempted,
        allocated,
        assignment.on_demand & set(survivors),
    )


def plan_from_holdings(
    profile: ModelProfile,
    costs: CostModel,
    held: Mapping[int, Collection[int]],
    target: Configuration,
    previous: Assignment | None = None,
    stages_before: int = 0,
    preempted: set[int] | frozenset[int] = frozenset(),
    allocated: list[int] | None = None,
    on_demand: Collection[int] = (),
) -> MigrationPlan:
    """The cheapest plan to ``target`` for the instances of ``held`` (instance -> the layers it
    holds, all at the step the target starts from), in the order given.

    ``previous`` is the assignment that last ran (for the migration's kind; None: nothing ran);
    ``on_demand`` the instances of ``held`` that are on-demand (constraints 4-5)."""
    survivors = list(held)
    previous = previous or Assignment({}, 0)
    if target.num_instances > len(survivors):
        raise LiveputError(
            f"target {target} needs {target.num_instances} instances; {len(survivors)} survive"
        )
    layer_bytes = profile.layer_state_bytes()
    new_bounds = partition_layers(profile, target.pipeline_stages)
    holding = np.zeros((len(survivors), profile.num_layers), dtype=bool)
    for row, instance in enumerate(survivors):
        layers = [layer for layer in held[instance] if 0 <= layer < profile.num_layers]
        holding[row, layers] = True
    slots = [Slot(d, s) for d in range(target.data_parallel) for s in range(target.pipeline_stages)]
    need = np.zeros((len(slots), profile.num_layers), dtype=bool)
    for column, slot in enumerate(slots):
        need[column, new_bounds[slot.stage] : new_bounds[slot.stage + 1]] = True
    # cost[i, j] = bytes slot j needs that instance i lacks (constraints 1-3 by construction).
    missing = need[None, :, :] & ~holding[:, None, :]
    cost = (missing * layer_bytes[None, None, :]).sum(axis=2).astype(float)
    _place_on_demand(cost, survivors, slots, target, set(on_demand), float(layer_bytes.sum()))
    # Imported here: scipy.optimize costs an agent process (which never plans) a CPU-second.
    from scipy.optimize import linear_sum_assignment

    rows, columns = linear_sum_assignment(cost)
    new_slots: dict[int, Slot | None] = dict.fromkeys(survivors)
    holders = {
        layer: list(np.flatnonzero(holding[:, layer])) for layer in range(profile.num_layers)
    }
    load = np.zeros(len(survivors))
    transfers: list[LayerTransfer] = []
    received = np.zeros(len(survivors))
    for row, column in zip(rows, columns, strict=True):
        instance = survivors[row]
        new_slots[instance] = slots[column]
        for layer in np.flatnonzero(missing[row, column]):
            sources = holders[int(layer)]
            if sources:
                source_row = min(sources, key=lambda r: load[r])
                load[source_row] += layer_bytes[layer]
                source = survivors[source_row]
            else:
                source = CHECKPOINT
            transfers.append(LayerTransfer(int(layer), source, instance, int(layer_bytes[layer])))
            received[row] += layer_bytes[layer]
    moved = sum(t.num_bytes for t in transfers if t.source != CHECKPOINT)
    restored = sum(t.num_bytes for t in transfers if t.source == CHECKPOINT)
    old_running = stages_before > 0 and any(s is not None for s in previous.slots.values())
    kind = _kind(
        previous,
        new_slots,
        stages_before,
        target,
        moved,
        restored,
        set(preempted),
        list(allocated or []),
        old_running,
    )
    estimated_s = 0.0
    if kind != MigrationKind.NONE:
        estimated_s = costs.rebuild_s(target.num_instances)
        if moved:
            estimated_s += costs.transfer_s(float(received.max()))
        if restored:
            estimated_s += costs.checkpoint_load_s(float(restored))
    return MigrationPlan(
        target=target,
        assignment=Assignment(
            new_slots, target.pipeline_stages, frozenset(on_demand) & frozenset(survivors)
        ),
        transfers=tuple(transfers),
        bytes_moved=int(moved),
        bytes_restored=int(restored),
        kind=kind,
        estimated_s=float(estimated_s),
    )


def _place_on_demand(
    cost: np.ndarray,
    survivors: list[int],
    slots: list[Slot],
    target: Configuration,
    on_demand: set[int],
    total_bytes: float,
) -> None:
    """Constraints (4) and (5) written into the assignment's cost matrix (in place)."""
    rows = [row for row, instance in enumerate(survivors) if instance in on_demand]
    if not rows:
        return
    working = min(len(rows), target.num_instances)
    low = working // target.pipeline_stages
    high = -(-working // target.pipeline_stages)
    pipeline = np.array([slot.pipeline for slot in slots])
    spot = np.ones(len(survivors), dtype=bool)
    spot[rows] = False
    on_demand_rows = np.asarray(rows, dtype=np.intp)
    cost[np.ix_(on_demand_rows, np.flatnonzero(pipeline >= high))] = np.inf  # (4)
    cost[np.ix_(np.flatnonzero(spot), np.flatnonzero(pipeline < low))] = np.inf  # (4)
    cost[rows] -= total_bytes + 1.0  # (5)


def _kind(
    old: Assignment,
    new_slots: dict[int, Slot | None],
    stages_before: int,
    target: Configuration,
    moved: int,
    restored: int,
    preempted: set[int],
    allocated: list[int],
    old_running: bool,
) -> MigrationKind:
    if restored or not old_running:
        return MigrationKind.CHECKPOINT_RESTORE
    if stages_before != target.pipeline_stages:
        return MigrationKind.PIPELINE
    if moved:
        return MigrationKind.INTER_STAGE
    unchanged = not preempted.intersection(
        i for i, s in old.slots.items() if s is not None
    ) and all(old.slots.get(i) == s for i, s in new_slots.items() if s is not None)
    return MigrationKind.NONE if unchanged else MigrationKind.INTRA_STAGE
