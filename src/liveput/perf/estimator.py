"""Throughput and memory of every (D, P) configuration, scored at once.

Notation, for a configuration of D pipelines of P stages and a model of L layers:

- ``m = B / (D * b)``: micro-batches per pipeline per iteration (global batch B, micro-batch b),
  as a mean: when D does not divide B / b the pipelines' shares differ by one micro-batch, and the
  measured iteration times follow the mean (VGG-19's D = 13, 14, 15 at P = 2 get faster step by
  step although ``ceil(64 / D) = 5`` for all three);
- ``t_P``: forward + backward time of the slowest stage of the P-stage partition (s), cut the way
  the model's engine cuts it (``partition``: by compute, parameters or layer count);
- ``o_P``: optimizer time of that partition's slowest stage (s);
- ``a_P``: bytes of the largest activation crossing a stage boundary, per micro-batch (0 if P = 1);
- ``g_P``: gradient bytes of the largest stage (parameters x 4 bytes, fp32 all-reduce);
- ``W``: network bandwidth between instances (bytes/s).

Iteration time of 1F1B (P - 1 micro-batch slots of bubble), in seconds:

    T(D, P) = (m + P - 1) * (alpha * t_P                    # pipeline with bubble: compute,
                             + gamma * 2 * a_P / W + c)     # blocking activation + gradient
                                                            # transfer, c per slot
              + beta * 2 (D - 1) / D * g_P / W              # ring all-reduce among D replicas
              + alpha * o_P + d                              # optimizer step and fixed cost

with per-model calibrated constants ``alpha`` (compute scale, 1), ``gamma`` (measured / ideal time
of the boundary transfer, 1), ``c`` (per-slot overhead: kernel launches and the latency of the
stage-to-stage messages, s), ``beta`` (all-reduce inefficiency, 1) and ``d`` (s), fitted in
``calibrate.py``. Throughput is ``B / T`` samples/s. The transfer term is what makes a CNN's
throughput non-monotone in P: a cut through an early, high-resolution layer sends megabytes per
micro-batch over the 10 Gb/s link, and the engine blocks on it every slot.

Memory of stage s (0-based) under 1F1B, bytes, with ``n_s = min(P - s, m)`` micro-batches in
flight, ``A_l`` the bytes layer l keeps for its backward per micro-batch
(``activation_memory_bytes``) and ``x_l`` its input's bytes per micro-batch, by the profile's
``activation_checkpointing``:

    stage (the DeepSpeed engine of the built-in tables): the stage's input per micro-batch in
           flight, and the full activations of one micro-batch while it recomputes and runs its
           backward (the recompute's time is inside the calibrated alpha):
           M_s = params_s * state_bytes_per_param + sum_{l in s} A_l + x_first(s) * n_s
    none:  every layer's activations for every micro-batch in flight:
           M_s = params_s * state_bytes_per_param + n_s * sum_{l in s} A_l
    layer: each layer keeps only its input; the backward recomputes one layer at a time:
           M_s = params_s * state_bytes_per_param + max_{l in s} A_l + n_s * sum_{l in s} x_l
           and every layer's forward runs twice: t_P sums 2 f_l + b_l (seconds) instead of
           f_l + b_l, so checkpointing trades about f / (f + b) (a third, with b = 2 f) more
           compute for the activations of n_s micro-batches.

A configuration is feasible when ``max_s M_s <= GPU memory``, ``P <= L``, ``m >= 1`` and P is at
least the profile's known minimum depth. The GPU memory is the profile's instance type's, or a
job's per-instance memory budget in its place (``types.with_instance_memory``); an agent checks the
stage it is given against the same budget with :func:`stage_peak_bytes`, the same ``M_s`` for one
stage's layers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.partition import PartitionTable, partition_table
from liveput.perf.types import ConfigTable, ModelProfile

GRADIENT_BYTES_PER_PARAM = 4


@dataclass(frozen=True)
class Calibration:
    """Per-model constants of the iteration-time formula (module docstring)."""

    compute_scale: float = 1.0
    """alpha: measured / derived compute time (dimensionless)."""
    slot_overhead_s: float = 0.0
    """c: seconds per micro-batch slot per stage (activation transfer, kernel launches)."""
    allreduce_scale: float = 1.0
    """beta: measured / ideal ring all-reduce time (dimensionless)."""
    transfer_scale: float = 1.0
    """gamma: measured / ideal time of the blocking activation and gradient transfer across the
    busiest stage boundary, ``2 * a_P / W`` per slot (dimensionless)."""
    iteration_overhead_s: float = 0.0
    """d: fixed seconds per iteration."""


@lru_cache(maxsize=1)
def _calibrations() -> dict[str, Calibration]:
    text = resources.files("liveput.data").joinpath("perf_calibration.json").read_text()
    return {name: Calibration(**values) for name, values in json.loads(text).items()}


def calibration_for(model: str) -> Calibration:
    """The fitted constants of a built-in model; a profiled model uses its measured times as is."""
    return _calibrations().get(model, Calibration())


def candidate_configs(max_nodes: int, num_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """All (D, P) with D * P <= max_nodes and P <= num_layers, as two int arrays."""
    pipelines, stages = np.meshgrid(
        np.arange(1, max_nodes + 1), np.arange(1, max_nodes + 1), indexing="ij"
    )
    keep = (pipelines * stages <= max_nodes) & (stages <= num_layers)
    return pipelines[keep], stages[keep]


def estimate_configs(
    profile: ModelProfile, max_nodes: int, calibration: Calibration | None = None
) -> ConfigTable:
    """Throughput, memory and feasibility of every (D, P) up to ``max_nodes`` instances."""
    calibration = calibration or calibration_for(profile.model)
    data_parallel, stages = candidate_configs(max_nodes, profile.num_layers)
    table = partition_table(profile, min(max_nodes, profile.num_layers))
    return score(profile, table, data_parallel, stages, calibration)


def score(
    profile: ModelProfile,
    table: PartitionTable,
    data_parallel: np.ndarray,
    stages: np.ndarray,
    calibration: Calibration,
) -> ConfigTable:
    """Vectorized scoring of the configurations ``(data_parallel[k], stages[k])``."""
    batch = profile.global_batch_size
    micro = batch / (data_parallel * profile.micro_batch_size)
    bandwidth_bytes_per_s = profile.instance_type.network_gbps * 1e9 / 8
    slots = micro + stages - 1
    ring = 2 * (data_parallel - 1) / data_parallel
    gradient_bytes = table.max_stage_params[stages] * GRADIENT_BYTES_PER_PARAM
    transfer_s = 2 * table.max_boundary_bytes[stages] / bandwidth_bytes_per_s
    iteration_s = (
        slots
        * (
            calibration.compute_scale * table.max_stage_time_s[stages]
            + calibration.transfer_scale * transfer_s
            + calibration.slot_overhead_s
        )
        + calibration.allreduce_scale * ring * gradient_bytes / bandwidth_bytes_per_s
        + calibration.compute_scale * table.max_stage_optimizer_s[stages]
        + calibration.iteration_overhead_s
    )
    # Memory: per-stage arrays padded to the deepest pipeline, stage index s along axis 1.
    stage_index = np.arange(table.stage_params.shape[1])
    in_flight = np.minimum(stages[:, None] - stage_index[None, :], np.ceil(micro)[:, None])
    in_flight = np.clip(in_flight, 0, None)
    memory_bytes = stage_memory_bytes(profile, table, stages, in_flight).max(axis=1)
    memory_gb = memory_bytes / 1e9
    fits_memory = memory_gb <= profile.instance_type.gpu_memory_gb
    enough_samples = batch >= data_parallel * profile.micro_batch_size
    deep_enough = stages >= profile.min_pipeline_stages
    feasible = fits_memory & enough_samples & deep_enough
    limit_gb = profile.instance_type.gpu_memory_gb
    reasons = tuple(
        None
        if ok
        else (
            f"fewer samples ({batch}) than D x micro-batch ({d * profile.micro_batch_size})"
            if not samples_ok
            else f"out of memory: {mem:.1f} GB > {limit_gb:g} GB"
            if not memory_ok
            else f"pipeline shallower than the model's minimum of "
            f"{profile.min_pipeline_stages} stages"
        )
        for ok, samples_ok, memory_ok, d, mem in zip(
            feasible, enough_samples, fits_memory, data_parallel, memory_gb, strict=True
        )
    )
    samples_per_s = np.where(feasible, batch / iteration_s, 0.0)
    return ConfigTable(
        model=profile.model,
        instance_type=profile.instance_type.name,
        data_parallel=data_parallel,
        pipeline_stages=stages,
        samples_per_s=samples_per_s,
        memory_gb=memory_gb,
        feasible=feasible,
        reason=reasons,
    )


def stage_memory_bytes(
    profile: ModelProfile, table: PartitionTable, stages: np.ndarray, in_flight: np.ndarray
) -> np.ndarray:
    """Memory of every stage of each configuration, bytes, shape (K, P_max)."""
    occupied = in_flight > 0
    state = table.stage_params[stages] * profile.state_bytes_per_param
    if profile.activation_checkpointing == "none":
        return state + table.stage_activation_memory[stages] * in_flight
    if profile.activation_checkpointing == "layer":
        return (
            state
            + table.stage_max_layer_memory[stages] * occupied
            + table.stage_layer_inputs_bytes[stages] * in_flight
        )
    return (
        state
        + table.stage_activation_memory[stages] * occupied
        + table.stage_input_bytes[stages] * in_flight
    )


def stage_peak_bytes(
    profile: ModelProfile, layers: range, stage: int, pipeline_stages: int, data_parallel: int
) -> float:
    """``M_s`` of the module docstring for one stage: the peak bytes of stage ``stage`` (0-based)
    of a ``pipeline_stages``-deep pipeline among ``data_parallel``, holding ``layers``: its
    weights, gradients and optimizer state, and the activations of the micro-batches it has in
    flight under 1F1B (the most a pipeline computes when D does not divide them). The same
    figure :func:`score` takes the most of, for one stage and whatever cut holds it."""
    if not layers or not 0 <= stage < pipeline_stages or data_parallel < 1:
        raise LiveputError(
            f"{profile.model}: no stage {stage} of {pipeline_stages} holding layers {layers}"
        )
    micro = math.ceil(profile.global_batch_size / (data_parallel * profile.micro_batch_size))
    in_flight = max(min(pipeline_stages - stage, micro), 0)
    held = profile.layers[layers.start : layers.stop]
    state = sum(layer.num_params for layer in held) * profile.state_bytes_per_param
    memory = [layer.activation_memory_bytes for layer in held]
    # Layer i's input is layer i - 1's output (the first layer's, the samples: not counted).
    inputs = [profile.layers[i - 1].activation_bytes if i > 0 else 0 for i in layers]
    if profile.activation_checkpointing == "none":
        return float(state + sum(memory) * in_flight)
    occupied = in_flight > 0
    if profile.activation_checkpointing == "layer":
        return float(state + max(memory) * occupied + sum(inputs) * in_flight)
    return float(state + sum(memory) * occupied + inputs[0] * in_flight)


def smallest_fit(profile: ModelProfile) -> tuple[int, float] | None:
    """The shallowest pipeline of one replica (D = 1: its P instances) that fits the profile's
    instance memory, with its peak memory per instance, GB; None when no depth up to the
    model's layers does."""
    stages = np.arange(1, profile.num_layers + 1)
    table = score(
        profile,
        partition_table(profile, profile.num_layers),
        np.ones_like(stages),
        stages,
        calibration_for(profile.model),
    )
    fits = np.flatnonzero(table.feasible)
    if not len(fits):
        return None
    return int(table.pipeline_stages[fits[0]]), float(table.memory_gb[fits[0]])


def iteration_features(
    profile: ModelProfile, table: PartitionTable, data_parallel: np.ndarray, stages: np.ndarray
) -> np.ndarray:
    """Columns of the iteration-time formula that multiply (alpha, gamma, c, beta, d): for
    fitting."""
    micro = profile.global_batch_size / (data_parallel * profile.micro_batch_size)
    slots = micro + stages - 1
    ring = 2 * (data_parallel - 1) / data_parallel
    bandwidth = profile.instance_type.network_gbps * 1e9 / 8
    gradient_bytes = table.max_stage_params[stages] * GRADIENT_BYTES_PER_PARAM
    return np.stack(
        [
            slots * table.max_stage_time_s[stages] + table.max_stage_optimizer_s[stages],
            slots * 2 * table.max_boundary_bytes[stages] / bandwidth,
            slots,
            ring * gradient_bytes / bandwidth,
            np.ones_like(slots, dtype=float),
        ],
        axis=1,
    )


def min_feasible_stages(config_table: ConfigTable) -> int | None:
    """The smallest P of any feasible configuration (None if none is)."""
    feasible = config_table.pipeline_stages[config_table.feasible]
    return int(feasible.min()) if len(feasible) else None
