"""A tiny job that evaluates its model every 2 steps on a fixed input (``Job.evaluate``): the
evaluation tests' job, given to ``liveput train`` as ``<this file>:target``."""

from __future__ import annotations

import torch
from torch import nn

import liveput

EVERY_STEPS = 2
"""N: the job evaluates after steps 2, 4, 6, ... (0-based 1, 3, 5, ...)."""
PROBE = torch.linspace(-1.0, 1.0, 12).reshape(3, 4)
"""The fixed input the evaluation runs the model on."""


def probe_metrics(model: nn.Module) -> dict[str, float]:
    """Two numbers that change whenever a weight does."""
    output = model(PROBE)
    return {"probe_sum": float(output.sum()), "probe_abs": float(output.abs().mean())}


def target(evaluate=probe_metrics) -> liveput.Job:  # noqa: ANN001 - a test's knob
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(32, 4, generator=generator)
    targets = torch.randn(32, 2, generator=generator)
    torch.manual_seed(0)  # the same initial weights in every agent
    return liveput.Job(
        layers=[nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)],
        dataset=list(zip(inputs, targets, strict=True)),
        loss_fn=nn.functional.mse_loss,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        global_batch_size=8,
        micro_batch_size=2,
        name="eval-probe",
        evaluate=evaluate,
        evaluate_every_steps=EVERY_STEPS,
    )
