"""The fault-free reference: what a run's final parameters must equal, however it was disturbed.

A job trained without faults in one process (one pipeline, one stage) applies the same samples in
the same order as any distributed run of it that applied every step exactly once, so their final
parameters agree to float tolerance (the engine test's ``allclose``).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from liveput import Job
from liveput.objectstore import url_to_fs
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.layer_state import LayerState, fresh_layer
from liveput.runtime.optimizer_step import OptimizerStep
from liveput.runtime.schedule import StagePosition, compute_gradients
from liveput.runtime.tied_gradients import TiedGradients

__all__ = [
    "RTOL",
    "ATOL",
    "reference_layers",
    "reference_parameters",
    "final_parameters",
    "parameter_mismatches",
]

RTOL = 1e-4
"""Relative tolerance of a parameter against the reference (``torch.allclose``)."""
ATOL = 1e-6
"""Absolute tolerance of a parameter against the reference."""


def reference_layers(job: Job, steps: int, device: str = "cpu") -> list[LayerState]:
    """Every layer (parameters, optimizer, training state) after an uninterrupted
    single-process run of ``steps`` steps on ``device``, with the job's precision, clipping and
    schedule."""
    layers = [fresh_layer(job, i, torch.device(device)) for i in range(job.num_layers)]
    update = OptimizerStep(job.training)
    ties = TiedGradients.of_whole_model(job)
    for step in range(steps):
        loss = compute_gradients(
            job, layers, StagePosition(0, 0, 1, 1, None, None), None, step, update.loss_scale
        )
        ties.sum(layers, None)
        nonfinite = not math.isfinite(loss)
        decision = update.decide(layers, job.num_layers, None, nonfinite, ties.duplicates(layers))
        update.apply(layers, step, decision)
    return layers


def reference_parameters(job: Job, steps: int) -> list[dict[str, torch.Tensor]]:
    """Every layer's parameters after an uninterrupted single-process run of ``steps`` steps."""
    return [layer.module.state_dict() for layer in reference_layers(job, steps)]


def final_parameters(checkpoint_dir: str | Path, num_layers: int) -> list[dict[str, torch.Tensor]]:
    """The final weights a run saved under ``<checkpoint_dir>/final/``."""
    reader = Checkpointer.__new__(Checkpointer)  # reads only: no store, no writer thread
    reader.fs, reader.root = url_to_fs(str(checkpoint_dir))
    return [reader.load_layer_file(f"final/layer-{i}.pt")["module"] for i in range(num_layers)]


def parameter_mismatches(
    got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]
) -> list[str]:
    """``layer.name`` of every parameter of ``got`` not allclose to ``want`` (empty: equal)."""
    if len(got) != len(want):
        return [f"{len(got)} layers, not {len(want)}"]
    return [
        f"{index}.{name}"
        for index, (layer_got, layer_want) in enumerate(zip(got, want))
        for name, value in layer_want.items()
        if name not in layer_got
        or layer_got[name].shape != value.shape
        or not torch.allclose(layer_got[name], value, rtol=RTOL, atol=ATOL)
    ]
