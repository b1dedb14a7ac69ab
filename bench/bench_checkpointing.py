"""Activation checkpointing: the estimator's predicted time and memory effect against a measured
training step of ``tiny-gpt`` on this machine (``python -m bench checkpointing``).

Time: seconds per step at (1, 1), one core, fp32, the fastest of four interleaved rounds (each
the median of 3 steps after a warm-up), with and without per-layer checkpointing; the prediction
is the ratio of the estimator's iteration times for the job's profile with
``activation_checkpointing`` = ``layer`` and ``none``. Memory: the bytes a forward of one
micro-batch leaves for the backward pass (every tensor autograd saves, counted through
``torch.autograd.graph.saved_tensors_hooks``; under ``torch.utils.checkpoint`` only each layer's
input; the weights autograd saves left out, as the profiler does), against the estimator's
``sum A_l`` and ``sum x_l`` (``docs/perf.md``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from liveput.models.job import Job
from liveput.models.jobs import resolve_job
from liveput.models.training import TrainingConfig
from liveput.perf.estimator import Calibration, estimate_configs
from liveput.perf.partition import partition_table
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.optimizer_step import OptimizerStep
from liveput.runtime.planning import profile_job
from liveput.runtime.schedule import StagePosition, _forward, compute_gradients


def step_seconds(job: Job, repeats: int = 7) -> float:
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    update = OptimizerStep(job.training)
    times = []
    for step in range(repeats + 2):
        start = time.perf_counter()
        compute_gradients(job, layers, StagePosition(0, 0, 1, 1, None, None), None, step)
        update.apply(layers, step, update.decide(layers, job.num_layers))
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def saved_bytes(job: Job) -> int:
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    held: list[int] = []
    # Weights saved for the backward are held anyway: not activations (as the profiler counts).
    weights = {
        p.untyped_storage().data_ptr() for layer in layers for p in layer.module.parameters()
    }

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in weights:
            held.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _forward(layers, job.micro_batch(0, 0)[0], job.training.activation_checkpointing)
    return sum(held)


def main() -> None:
    torch.set_num_threads(1)
    base = resolve_job("tiny-gpt")
    jobs = {
        mode: dataclasses.replace(
            base, training=TrainingConfig(activation_checkpointing=mode == "layer")
        )
        for mode in ("none", "layer")
    }
    profile = profile_job(jobs["none"])
    profiles = {mode: dataclasses.replace(profile, activation_checkpointing=mode) for mode in jobs}
    rows = {mode: estimate_configs(p, 1, Calibration()) for mode, p in profiles.items()}
    predicted_ratio = float(rows["none"].samples_per_s[0] / rows["layer"].samples_per_s[0])
    # Interleaved rounds, each mode keeping its fastest: load from other jobs only slows a
    # measurement down, and bursts then hit both modes alike.
    measured = {mode: float("inf") for mode in jobs}
    for _ in range(4):
        for mode, job in jobs.items():
            measured[mode] = min(measured[mode], step_seconds(job, repeats=3))
    measured_ratio = measured["layer"] / measured["none"]
    print(
        f"tiny-gpt (1, 1), one core, fp32: step {measured['none'] * 1e3:.1f} ms without, "
        f"{measured['layer'] * 1e3:.1f} ms with per-layer checkpointing: x{measured_ratio:.2f}"
        f" measured, x{predicted_ratio:.2f} predicted"
    )
    table = partition_table(profiles["none"], 1)
    predicted_saved = {
        "none": float(table.stage_activation_memory[1, 0]),
        "layer": float(table.stage_layer_inputs_bytes[1, 0]),
    }
    for mode, job in jobs.items():
        print(
            f"  {mode:>5}: bytes kept for the backward per micro-batch: measured "
            f"{saved_bytes(job) / 1e6:.2f} MB, estimator {predicted_saved[mode] / 1e6:.2f} MB"
        )
    print(
        f"  estimator's (1, 1) memory: {rows['none'].memory_gb[0] * 1e3:.1f} MB without, "
        f"{rows['layer'].memory_gb[0] * 1e3:.1f} MB with (one micro-batch in flight; the "
        f"recomputed layer's {float(table.stage_max_layer_memory[1, 0]) / 1e6:.2f} MB "
        "included)"
    )


if __name__ == "__main__":
    main()
