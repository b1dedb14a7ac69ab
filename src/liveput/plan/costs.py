"""Seconds lost to move between configurations, for every pair of candidates at once.

Kinds (cheapest first), between the running (D, P) and a target (D', P') on n instances:

- ``none``: the same configuration;
- ``intra-stage``: P' = P, D' < D: survivors regroup, only communication groups are rebuilt:
  ``rebuild_s(n)``;
- ``inter-stage``: P' = P, D' > D: new replicas receive one stage's parameters and optimizer
  state, in parallel: ``rebuild_s(n) + transfer_s(stage_state_bytes)``;
- ``pipeline``: P' != P: layers are re-partitioned; each new stage goes to an instance that holds
  the most of its layers and receives only the missing ones, in parallel:
  ``rebuild_s(n) + transfer_s(max over new stages of missing bytes)``;
- ``checkpoint-restore``: from nothing running: ``restart_s(n) + checkpoint_load_s(model bytes)``:
  the whole checkpoint comes through the storage's bandwidth, however many stages share it (as
  the simulator's policies charge it, ``policies.common.restart_s``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import numpy as np

from liveput.perf.configuration import MigrationKind
from liveput.perf.partition import partition_layers
from liveput.perf.types import ModelProfile


class CostModel(Protocol):
    """What the planner needs to know about moving state (``perf.MigrationCostModel``)."""

    def transfer_s(self, num_bytes: float) -> float: ...
    def rebuild_s(self, num_nodes: int) -> float: ...
    def restart_s(self, num_nodes: int) -> float: ...
    def checkpoint_save_s(self, num_bytes: float) -> float: ...
    def checkpoint_load_s(self, num_bytes: float) -> float: ...


def migration_kind(
    data_parallel: int, stages: int, new_data_parallel: int, new_stages: int
) -> MigrationKind:
    """The kind of migration from (D, P) to (D', P'); D = 0 means nothing runs."""
    if new_data_parallel == 0 or (data_parallel, stages) == (new_data_parallel, new_stages):
        return MigrationKind.NONE
    if data_parallel == 0:
        return MigrationKind.CHECKPOINT_RESTORE
    if stages == new_stages:
        if new_data_parallel < data_parallel:
            return MigrationKind.INTRA_STAGE
        return MigrationKind.INTER_STAGE
    return MigrationKind.PIPELINE


@lru_cache(maxsize=16)
def _missing_bytes_of(profile: ModelProfile) -> dict[tuple[int, int], float]:
    """:func:`_missing_bytes` of ``profile`` by ``(stages, new_stages)``, filled as asked: a
    profile is hashed (every layer of it) once a table of depths, not once a pair of them (under
    cProfile the hashing took a fifth of a deadline simulation, which builds an optimizer per
    policy)."""
    return {}


def _missing_bytes(profile: ModelProfile, stages: int, new_stages: int) -> float:
    """Largest state a new stage lacks when placed on the old stage that overlaps it most."""
    layer_bytes = np.concatenate(([0], np.cumsum(profile.layer_state_bytes())))
    old = partition_layers(profile, stages)
    new = partition_layers(profile, new_stages)
    starts = np.maximum(new[:-1, None], old[None, :-1])
    ends = np.minimum(new[1:, None], old[None, 1:])
    overlap = np.where(
        ends > starts, layer_bytes[np.maximum(ends, starts)] - layer_bytes[starts], 0
    )
    need = layer_bytes[new[1:]] - layer_bytes[new[:-1]]
    return float((need - overlap.max(axis=1)).max())


def depth_costs(
    profile: ModelProfile,
    costs: CostModel,
    depths: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Lookups by depth that do not depend on the instance count: ``repartition[P, P']``
    (seconds to send the layers a new stage lacks, P != P') and ``stage_transfer[P]`` (one
    stage's state), for the depths ``P > 0`` in ``depths``."""
    total_bytes = float(profile.layer_state_bytes().sum())
    depth = int(depths.max(initial=0))
    unique_stages = sorted({int(p) for p in depths if p > 0})
    repartition = np.zeros((depth + 1, depth + 1))
    stage_transfer = np.zeros(depth + 1)
    missing = _missing_bytes_of(profile)
    for p in unique_stages:
        stage_transfer[p] = costs.transfer_s(total_bytes / p)
        for q in unique_stages:
            if p != q:
                if (p, q) not in missing:
                    missing[p, q] = _missing_bytes(profile, p, q)
                repartition[p, q] = costs.transfer_s(missing[p, q])
    return repartition, stage_transfer


def restore_s(profile: ModelProfile, costs: CostModel, num_instances: int) -> float:
    """Seconds of a checkpoint restore on ``num_instances``: restart plus the whole checkpoint."""
    total_bytes = float(profile.layer_state_bytes().sum())
    return costs.restart_s(num_instances) + costs.checkpoint_load_s(total_bytes)


def migration_seconds(
    profile: ModelProfile,
    costs: CostModel,
    data_parallel: np.ndarray,
    stages: np.ndarray,
    num_instances: int,
) -> np.ndarray:
    """``seconds[a, b]`` to move from candidate a to candidate b (D = 0: nothing runs).

    Dense (candidates x candidates): for tests and small tables; the optimizer reads the same
    seconds row by row or by depth (``plan.transitions``)."""
    rebuild = costs.rebuild_s(num_instances)
    # Per (P, P') lookups: re-partition transfer, one stage's transfer, restore from checkpoint.
    repartition, stage_transfer = depth_costs(profile, costs, stages)
    restore = np.where(
        np.arange(len(stage_transfer)) > 0, restore_s(profile, costs, num_instances), 0.0
    )
    d_from, d_to = data_parallel[:, None], data_parallel[None, :]
    p_from, p_to = stages[:, None], stages[None, :]
    running = (d_from > 0) & (d_to > 0)
    same_depth = running & (p_from == p_to)
    seconds = np.zeros((len(stages), len(stages)))
    seconds = np.where(same_depth & (d_to < d_from), rebuild, seconds)
    seconds = np.where(same_depth & (d_to > d_from), rebuild + stage_transfer[p_to], seconds)
    seconds = np.where(running & (p_from != p_to), rebuild + repartition[p_from, p_to], seconds)
    seconds = np.where((d_from == 0) & (d_to > 0), restore[p_to], seconds)
    return seconds
