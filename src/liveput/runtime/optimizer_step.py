"""From reduced gradients to the update: loss-scale unscaling, the global norm, clipping, the
learning rate of the step, and the fp16 loss scaler.

After its stage all-reduce each stage holds the full gradients of its layers. When the step needs
the global norm (:attr:`TrainingConfig.global_norm_needed`) each stage writes the squared norm of
each of its layers into a vector of L entries (zeros elsewhere) and the P stages of a pipeline sum
it: every entry is one stage's value plus exact zeros, and every stage then adds the L entries in
the same order, so every stage, whatever (D, P), gets the same norm to the bit. A non-finite norm
is an fp16 overflow somewhere in the model: every stage skips the update and halves the scale.

The loss scaler's state (scale, steps since the last overflow) is the same on every instance; it
travels with each layer (``LayerState.training``) through transfers and checkpoints, so a layer
restored or received anywhere resumes with the scale it was trained with.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from liveput.models.training import TrainingConfig
from liveput.runtime.comm import Groups
from liveput.runtime.layer_state import LayerState

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_BACKOFF, _GROWTH = 0.5, 2.0
"""The loss scale's change after an overflow and after ``loss_scale_growth_interval`` clean
steps (``torch.amp.GradScaler``'s defaults)."""


def autocast(config: TrainingConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward's precision context (``nullcontext`` for fp32)."""
    dtype = _AUTOCAST_DTYPES.get(config.precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class StepDecision:
    """What the update of one step does, the same on every stage."""

    grad_norm: float | None
    """Global L2 norm of the unscaled gradients (None when not computed)."""
    clip_coefficient: float
    """Factor applied to every gradient before the update (1: no clipping)."""
    skip: bool
    """An fp16 overflow, or a non-finite loss to skip: no update this step."""


class OptimizerStep:
    """One instance's update rule and loss-scaler state."""

    def __init__(self, config: TrainingConfig) -> None:
        self.config = config
        self.loss_scale = config.initial_loss_scale if config.precision == "fp16" else 1.0
        """Multiplies the loss before the backward pass (1 unless fp16)."""
        self.clean_steps = 0
        """fp16: steps since the last overflow (or the last growth)."""

    # --- state that moves with the layers ---------------------------------------------------
    def state_dict(self) -> dict:
        return {"loss_scale": self.loss_scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.loss_scale = float(state["loss_scale"])
        self.clean_steps = int(state["clean_steps"])

    def adopt(self, layers: list[LayerState]) -> None:
        """Take the scaler state the layers carry (all of one step: any one of them)."""
        for layer in layers:
            if layer.training:
                self.load_state_dict(layer.training)
                return
        self.load_state_dict(OptimizerStep(self.config).state_dict())  # fresh layers: the start

    def stamp(self, layers: list[LayerState]) -> None:
        for layer in layers:
            layer.training = self.state_dict()

    # --- the step ---------------------------------------------------------------------------
    def decide(
        self,
        layers: list[LayerState],
        num_layers: int,
        groups: Groups | None = None,
        nonfinite_loss: bool = False,
        duplicates: frozenset[int] = frozenset(),
    ) -> StepDecision:
        """Unscale the gradients and decide the update; with ``groups``, the stages of this
        pipeline exchange their squared norms (a collective: every stage calls it).
        ``nonfinite_loss``: the last stage saw a NaN or infinite loss (its norm entry is made
        NaN, so every stage of the pipeline decides the same). ``duplicates``: ``id`` of the
        parameters the norm leaves out (the later copy of tied weights: one matrix, counted
        once)."""
        if self.loss_scale != 1.0:
            inverse = 1.0 / self.loss_scale
            for parameter in _parameters(layers):
                if parameter.grad is not None:
                    parameter.grad.mul_(inverse)
        if not self.config.global_norm_needed:
            return StepDecision(None, 1.0, False)
        squares = torch.zeros(num_layers, dtype=torch.float64)
        for layer in layers:
            norms = [
                p.grad.detach().float().norm(2)
                for p in layer.module.parameters()
                if p.grad is not None and id(p) not in duplicates
            ]
            if norms:
                squares[layer.index] = float(torch.stack(norms).double().pow(2).sum())
        if nonfinite_loss and layers:
            squares[layers[0].index] = math.nan
        if groups is not None:
            squares = groups.allreduce_pipeline(squares)
        norm = math.sqrt(float(squares.sum()))
        if not math.isfinite(norm):
            return StepDecision(
                norm,
                1.0,
                self.config.precision == "fp16" or self.config.on_nonfinite_loss == "skip",
            )
        coefficient = 1.0
        if self.config.clip_grad_norm is not None:
            coefficient = min(1.0, self.config.clip_grad_norm / (norm + 1e-6))
        return StepDecision(norm, coefficient, False)

    def apply(self, layers: list[LayerState], step: int, decision: StepDecision) -> None:
        """Apply global step ``step``'s update as decided, then move the loss scale."""
        factor = 1.0 if self.config.lr_schedule is None else self.config.lr_schedule.factor(step)
        for layer in layers:
            optimizer = layer.optimizer
            if optimizer is None:
                continue
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
                group["lr"] = group["initial_lr"] * factor
            if not decision.skip:
                if decision.clip_coefficient < 1.0:
                    for parameter in layer.module.parameters():
                        if parameter.grad is not None:
                            parameter.grad.mul_(decision.clip_coefficient)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if self.config.precision == "fp16":
            if decision.skip:
                self.loss_scale *= _BACKOFF
                self.clean_steps = 0
            else:
                self.clean_steps += 1
                if self.clean_steps >= self.config.loss_scale_growth_interval:
                    self.loss_scale *= _GROWTH
                    self.clean_steps = 0
        self.stamp(layers)


def _parameters(layers: list[LayerState]) -> list[torch.nn.Parameter]:
    return [p for layer in layers for p in layer.module.parameters()]
