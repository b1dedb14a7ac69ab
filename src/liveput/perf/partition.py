"""Partitions of a model's layers into P contiguous pipeline stages, for every depth at once.

A partition method says how a pipeline engine cuts the layer sequence; the estimator must model
the one the engine actually uses, since the slowest stage sets the pipeline's clock:

- ``compute``: minimize the forward + backward time of the slowest stage (what a profile-guided
  engine does), by dynamic programming over prefix sums,

      best[p][j] = min_{i < j} max(best[p-1][i], time(i, j))   (layers i..j-1 form stage p);

- ``parameters``: the same min-max over parameter counts instead of time (DeepSpeed's pipeline
  default, ``partition_method="parameters"``);
- ``uniform``: the same number of layers per stage, ``floor(L / P)``, the last stage taking the
  remainder (DeepSpeed's ``partition_method="uniform"``, counting every module of the sequence,
  parameter-free ones included);
- ``transformer``: a quota of transformer blocks (layers named ``block.*``) per stage, counting
  the output head as one more block on the last stage: ``floor((n + 1) / P)`` each, the remainder
  one more on each stage from the second-to-last backwards; a stage ends at the block that fills
  its quota, and the last stage holds the rest (the per-block cut of Megatron-DeepSpeed GPT,
  ``partition_method="type:transformer"``). With n = 48 it gives 7 blocks to a stage at P = 8
  but 6 at P = 9, 5 at P = 12 but 4 at P = 13, where a compute-balanced cut gives the same.

For CNNs the three differ sharply: parameters sit in the late layers and compute in the early
ones, and a cut through an early, high-resolution layer sends a large activation between stages.
Each profile names the method its engine uses (``ModelProfile.partition_method``: a built-in
profile the method of its measured engine, ``builtin.BuiltinSpec``; a measured one ``compute``).
All depths 1..P_max are solved in one pass and cached per profile and method, so scoring
configurations only indexes arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.types import PARTITION_METHODS, ModelProfile

"""Ways to cut layers into stages (module docstring)."""


@dataclass(frozen=True)
class PartitionTable:
    """Per pipeline depth P (index P; row 0 unused): the partition and its per-stage figures."""

    method: str
    """The partition method (one of ``PARTITION_METHODS``)."""
    boundaries: tuple[np.ndarray, ...]
    """``boundaries[P]``: layer indices where stages start, shape (P + 1,), last = L."""
    max_stage_time_s: np.ndarray
    """Forward + backward seconds of the slowest stage, shape (P_max + 1,)."""
    max_stage_optimizer_s: np.ndarray
    """Optimizer seconds of the stage with the most, shape (P_max + 1,)."""
    max_stage_params: np.ndarray
    """Parameters of the largest stage, shape (P_max + 1,)."""
    max_boundary_bytes: np.ndarray
    """Bytes of the largest activation that crosses a stage boundary, per micro-batch (0 for
    P = 1), shape (P_max + 1,)."""
    stage_params: np.ndarray
    """Parameters of stage s at depth P, shape (P_max + 1, P_max), 0 past the last stage."""
    stage_activation_memory: np.ndarray
    """Bytes of stage s's activations while it runs one micro-batch's backward pass (recomputed
    from its saved input under activation checkpointing), shape (P_max + 1, P_max)."""
    stage_input_bytes: np.ndarray
    """Bytes of the input activation stage s keeps per micro-batch in flight, same shape."""
    stage_layer_inputs_bytes: np.ndarray
    """Sum of the inputs of stage s's layers, per micro-batch (what per-layer activation
    checkpointing keeps), same shape."""
    stage_max_layer_memory: np.ndarray
    """The largest activation memory of one layer of stage s, per micro-batch (what per-layer
    checkpointing holds while it recomputes that layer), same shape."""


def _layer_arrays(profile: ModelProfile) -> tuple[np.ndarray, ...]:
    layers = profile.layers
    # Per-layer checkpointing runs each forward twice (the estimator docstring).
    recompute = 1.0 if profile.activation_checkpointing == "layer" else 0.0
    time_s = np.array([(1 + recompute) * layer.forward_s + layer.backward_s for layer in layers])
    optimizer_s = np.array([layer.optimizer_s for layer in layers])
    params = np.array([layer.num_params for layer in layers], dtype=np.float64)
    memory = np.array([layer.activation_memory_bytes for layer in layers], dtype=np.float64)
    outputs = np.array([layer.activation_bytes for layer in layers], dtype=np.float64)
    return time_s, optimizer_s, params, memory, outputs


def _min_max_cuts(weights: np.ndarray, max_stages: int) -> list[np.ndarray]:
    """Boundaries minimizing the heaviest stage's total weight, for every depth 1..max_stages."""
    num_layers = len(weights)
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    # cost[i, j] = weight of layers i..j-1 (a stage must hold at least one layer).
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
    all_bounds = []
    for depth in range(1, max_stages + 1):
        cuts = [num_layers]
        for level in range(depth - 1, 0, -1):
            cuts.append(int(choices[level][cuts[-1]]))
        cuts.append(0)
        all_bounds.append(np.array(cuts[::-1], dtype=np.int64))
    return all_bounds


def _uniform_cuts(num_layers: int, max_stages: int) -> list[np.ndarray]:
    """``floor(L / P)`` layers per stage, the remainder on the last stage, for every depth."""
    all_bounds = []
    for depth in range(1, max_stages + 1):
        bounds = np.arange(depth + 1, dtype=np.int64) * (num_layers // depth)
        bounds[-1] = num_layers
        all_bounds.append(bounds)
    return all_bounds


def _transformer_cuts(
    is_block: np.ndarray, time_s: np.ndarray, max_stages: int
) -> list[np.ndarray]:
    """Per-stage block quotas with the head as one more block (module docstring), every depth.
    Where the quotas would leave a stage empty (a profile without a head layer, cut deeper than
    half its blocks), that depth is cut by compute instead."""
    num_layers = len(is_block)
    blocks_so_far = np.cumsum(is_block)
    num_blocks = int(blocks_so_far[-1])
    by_compute = _min_max_cuts(time_s, max_stages)
    all_bounds = []
    for depth in range(1, max_stages + 1):
        quota = np.full(depth, (num_blocks + 1) // depth)
        extra = (num_blocks + 1) % depth
        quota[depth - 1 - extra : depth - 1] += 1
        # Stage k ends right after the layer where the running block count reaches its quota.
        ends = np.searchsorted(blocks_so_far, np.cumsum(quota)[:-1]) + 1
        bounds = np.concatenate(([0], ends, [num_layers])).astype(np.int64)
        empty = quota[0] == 0 or (np.diff(bounds) < 1).any()
        all_bounds.append(by_compute[depth - 1] if empty else bounds)
    return all_bounds


def partition_table(
    profile: ModelProfile, max_stages: int, method: str | None = None
) -> PartitionTable:
    """Partitions of ``profile`` for every depth 1..``max_stages`` by ``method`` (default: the
    profile's own, ``profile.partition_method``)."""
    method = profile.partition_method if method is None else method
    if method not in PARTITION_METHODS:
        raise LiveputError(
            f"unknown partition method {method!r}; one of {', '.join(PARTITION_METHODS)}"
        )
    return _partition_table(profile, max_stages, method)


@lru_cache(maxsize=64)
def _partition_table(profile: ModelProfile, max_stages: int, method: str) -> PartitionTable:
    num_layers = profile.num_layers
    if not 1 <= max_stages <= num_layers:
        raise LiveputError(
            f"{profile.model}: cannot cut {num_layers} layers into {max_stages} stages"
        )
    time_s, optimizer_s, params, memory, outputs = _layer_arrays(profile)
    if method == "uniform":
        all_bounds = _uniform_cuts(num_layers, max_stages)
    elif method == "transformer":
        is_block = np.array([layer.name.startswith("block.") for layer in profile.layers])
        all_bounds = _transformer_cuts(is_block.astype(np.int64), time_s, max_stages)
    else:
        all_bounds = _min_max_cuts(time_s if method == "compute" else params, max_stages)
    inputs = np.concatenate(([0.0], outputs))  # layer i's input is layer i-1's output
    shape = (max_stages + 1, max_stages)
    stage_params = np.zeros(shape)
    stage_memory = np.zeros(shape)
    stage_inputs = np.zeros(shape)
    stage_layer_inputs = np.zeros(shape)
    stage_max_memory = np.zeros(shape)
    inputs_prefix = np.concatenate(([0.0], np.cumsum(inputs[:-1])))
    max_time = np.zeros(max_stages + 1)
    max_optimizer = np.zeros(max_stages + 1)
    max_boundary = np.zeros(max_stages + 1)
    time_prefix = np.concatenate(([0.0], np.cumsum(time_s)))
    param_prefix = np.concatenate(([0.0], np.cumsum(params)))
    memory_prefix = np.concatenate(([0.0], np.cumsum(memory)))
    optimizer_prefix = np.concatenate(([0.0], np.cumsum(optimizer_s)))
    for depth, bounds in enumerate(all_bounds, start=1):
        starts, ends = bounds[:-1], bounds[1:]
        stage_params[depth, :depth] = param_prefix[ends] - param_prefix[starts]
        stage_memory[depth, :depth] = memory_prefix[ends] - memory_prefix[starts]
        stage_inputs[depth, :depth] = inputs[starts]
        stage_layer_inputs[depth, :depth] = inputs_prefix[ends] - inputs_prefix[starts]
        stage_max_memory[depth, :depth] = np.maximum.reduceat(memory, starts)
        max_time[depth] = (time_prefix[ends] - time_prefix[starts]).max()
        max_optimizer[depth] = (optimizer_prefix[ends] - optimizer_prefix[starts]).max()
        max_boundary[depth] = inputs[starts[1:]].max(initial=0.0)
    return PartitionTable(
        method=method,
        boundaries=(np.zeros(1, dtype=np.int64), *all_bounds),
        max_stage_time_s=max_time,
        max_stage_optimizer_s=max_optimizer,
        max_stage_params=stage_params.max(axis=1),
        max_boundary_bytes=max_boundary,
        stage_params=stage_params,
        stage_activation_memory=stage_memory,
        stage_input_bytes=stage_inputs,
        stage_layer_inputs_bytes=stage_layer_inputs,
        stage_max_layer_memory=stage_max_memory,
    )


def partition_layers(
    profile: ModelProfile, num_stages: int, method: str | None = None
) -> np.ndarray:
    """Stage boundaries of the ``num_stages``-stage partition, shape (P + 1,), by ``method``
    (default: the profile's own, as the estimator scores it)."""
    return partition_table(profile, num_stages, method).boundaries[num_stages]
