"""Balanced partitions of a model's layers into P contiguous pipeline stages.

For each depth P, the partition minimizes the forward + backward time of the slowest stage (the
pipeline's clock), by dynamic programming over prefix sums:

    best[p][j] = min_{i < j} max(best[p-1][i], time(i, j))      (layers i..j-1 form stage p)

All depths 1..P_max are solved in one pass (each step is one vectorized min over an L x L matrix)
and cached per profile, so scoring configurations only indexes arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.types import ModelProfile


@dataclass(frozen=True)
class PartitionTable:
    """Per pipeline depth P (index P; row 0 unused): the partition and its per-stage figures."""

    boundaries: tuple[np.ndarray, ...]
    """``boundaries[P]``: layer indices where stages start, shape (P + 1,), last = L."""
    max_stage_time_s: np.ndarray
    """Forward + backward seconds of the slowest stage, shape (P_max + 1,)."""
    max_stage_optimizer_s: np.ndarray
    """Optimizer seconds of the stage with the most, shape (P_max + 1,)."""
    max_stage_params: np.ndarray
    """Parameters of the largest stage, shape (P_max + 1,)."""
    stage_params: np.ndarray
    """Parameters of stage s at depth P, shape (P_max + 1, P_max), 0 past the last stage."""
    stage_activation_memory: np.ndarray
    """Bytes of stage s's activations while it runs one micro-batch's backward pass (recomputed
    from its saved input under activation checkpointing), shape (P_max + 1, P_max)."""
    stage_input_bytes: np.ndarray
    """Bytes of the input activation stage s keeps per micro-batch in flight, same shape."""


def _layer_arrays(profile: ModelProfile) -> tuple[np.ndarray, ...]:
    layers = profile.layers
    time_s = np.array([layer.forward_s + layer.backward_s for layer in layers])
    optimizer_s = np.array([layer.optimizer_s for layer in layers])
    params = np.array([layer.num_params for layer in layers], dtype=np.float64)
    memory = np.array([layer.activation_memory_bytes for layer in layers], dtype=np.float64)
    outputs = np.array([layer.activation_bytes for layer in layers], dtype=np.float64)
    return time_s, optimizer_s, params, memory, outputs


@lru_cache(maxsize=64)
def partition_table(profile: ModelProfile, max_stages: int) -> PartitionTable:
    """Balanced partitions of ``profile`` for every depth 1..``max_stages``."""
    num_layers = profile.num_layers
    if not 1 <= max_stages <= num_layers:
        raise LiveputError(
            f"{profile.model}: cannot cut {num_layers} layers into {max_stages} stages"
        )
    time_s, optimizer_s, params, memory, outputs = _layer_arrays(profile)
    inputs = np.concatenate(([0.0], outputs))  # layer i's input is layer i-1's output
    prefix = np.concatenate(([0.0], np.cumsum(time_s)))
    # cost[i, j] = time of layers i..j-1 (a stage must hold at least one layer).
    cost = prefix[None, :] - prefix[:, None]
    index = np.arange(num_layers + 1)
    cost[index[:, None] >= index[None, :]] = np.inf
    best = cost[0].copy()
    choices: list[np.ndarray] = [np.zeros(num_layers + 1, dtype=np.int64)]
    for _ in range(2, max_stages + 1):
        candidates = np.maximum(best[:, None], cost)
        choice = np.argmin(candidates, axis=0)
        best = candidates[choice, index]
        choices.append(choice)
    boundaries: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    shape = (max_stages + 1, max_stages)
    stage_params = np.zeros(shape)
    stage_memory = np.zeros(shape)
    stage_inputs = np.zeros(shape)
    max_time = np.zeros(max_stages + 1)
    max_optimizer = np.zeros(max_stages + 1)
    param_prefix = np.concatenate(([0.0], np.cumsum(params)))
    memory_prefix = np.concatenate(([0.0], np.cumsum(memory)))
    optimizer_prefix = np.concatenate(([0.0], np.cumsum(optimizer_s)))
    for depth in range(1, max_stages + 1):
        cuts = [num_layers]
        for level in range(depth - 1, 0, -1):
            cuts.append(int(choices[level][cuts[-1]]))
        cuts.append(0)
        bounds = np.array(cuts[::-1], dtype=np.int64)
        boundaries.append(bounds)
        starts, ends = bounds[:-1], bounds[1:]
        stage_params[depth, :depth] = param_prefix[ends] - param_prefix[starts]
        stage_memory[depth, :depth] = memory_prefix[ends] - memory_prefix[starts]
        stage_inputs[depth, :depth] = inputs[starts]
        max_time[depth] = (prefix[ends] - prefix[starts]).max()
        max_optimizer[depth] = (optimizer_prefix[ends] - optimizer_prefix[starts]).max()
    return PartitionTable(
        boundaries=tuple(boundaries),
        max_stage_time_s=max_time,
        max_stage_optimizer_s=max_optimizer,
        max_stage_params=stage_params.max(axis=1),
        stage_params=stage_params,
        stage_activation_memory=stage_memory,
        stage_input_bytes=stage_inputs,
    )


def partition_layers(profile: ModelProfile, num_stages: int) -> np.ndarray:
    """Stage boundaries of the balanced ``num_stages``-stage partition, shape (P + 1,)."""
    return partition_table(profile, num_stages).boundaries[num_stages]
