"""How a job trains, beyond its model and data: precision, clipping, the learning-rate schedule and
activation checkpointing.

Every option keeps training the same computation whatever (D, P) runs it (``job`` module):

- ``precision``: ``fp32``; ``bf16`` (forward and loss under ``torch.autocast``); ``fp16`` (the same,
  with a dynamic loss scale). The parameters and the per-layer optimizers stay fp32 (the master
  weights); autocast casts a copy of each weight for the forward.
- ``clip_grad_norm``: the gradients of the whole model are scaled by ``min(1, c / (norm + 1e-6))``,
  ``norm`` the L2 norm over every layer (``torch.nn.utils.clip_grad_norm_`` on the unsplit model):
  each stage computes its layers' squared norms, and the stages of a pipeline sum them.
- ``lr_schedule``: the learning rate of global step s is ``base_lr * factor(s)``
  (:class:`LRSchedule`), a function of the step alone, so it does not matter which instance
  applies step s.
- ``activation_checkpointing``: each layer keeps only its input for the backward pass and runs its
  forward again there (``torch.utils.checkpoint``): memory down, compute up (``perf/estimator.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from liveput.errors import LiveputError

PRECISIONS = ("fp32", "bf16", "fp16")
"""Values of :attr:`TrainingConfig.precision`."""
NONFINITE_LOSS = ("stop", "skip")
"""Values of :attr:`TrainingConfig.on_nonfinite_loss`."""
SCHEDULES = ("constant", "linear", "cosine")
"""Values of :attr:`LRSchedule.kind`."""


@dataclass(frozen=True)
class LRSchedule:
    """Learning rate of each global step, as a multiple of the optimizer's own (its base)."""

    kind: str = "constant"
    """``constant``, ``linear`` (decays linearly to ``min_ratio`` at ``total_steps``) or ``cosine``
    (half a cosine from 1 to ``min_ratio`` over ``total_steps``)."""
    warmup_steps: int = 0
    """Steps of linear warm-up first: step s < W trains at ``(s + 1) / W`` of the base."""
    total_steps: int | None = None
    """Step at which the decay ends (then it stays at ``min_ratio``); needed unless constant.
    ``liveput train`` sets it to ``--steps``."""
    min_ratio: float = 0.0
    """Final learning rate as a fraction of the base."""

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise LiveputError(
                f"lr schedule: unknown kind {self.kind!r}; known: {', '.join(SCHEDULES)}"
            )
        if self.warmup_steps < 0:
            raise LiveputError(f"lr schedule: warmup must be >= 0, not {self.warmup_steps}")
        if self.total_steps is not None and self.total_steps < 1:
            raise LiveputError(f"lr schedule: total steps must be >= 1, not {self.total_steps}")
        if self.kind != "constant" and self.total_steps is None:
            raise LiveputError(f"lr schedule: {self.kind} needs total_steps")
        if not (math.isfinite(self.min_ratio) and 0.0 <= self.min_ratio <= 1.0):
            raise LiveputError(f"lr schedule: min ratio must be in [0, 1], not {self.min_ratio}")

    def factor(self, step: int) -> float:
        """The learning rate of global step ``step`` over the base."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        assert self.total_steps is not None
        span = max(self.total_steps - self.warmup_steps, 1)
        progress = min(max(step - self.warmup_steps, 0) / span, 1.0)
        if self.kind == "linear":
            shape = 1.0 - progress
        else:
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_ratio + (1.0 - self.min_ratio) * shape

    @classmethod
    def parse(cls, text: str, total_steps: int | None = None) -> LRSchedule:
        """``KIND[:warmup=N][,min=F][,steps=N]`` (``cosine:warmup=20,min=0.1``); ``steps``
        defaults to ``total_steps``."""
        kind, _, rest = text.strip().partition(":")
        options: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, equals, value = item.partition("=")
            if not equals or key not in ("warmup", "min", "steps"):
                raise LiveputError(
                    f"--lr-schedule {text!r}: expected KIND[:warmup=N][,min=F]"
                    f"[,steps=N], got {item!r}"
                )
            options[key] = value
        try:
            warmup = int(options.get("warmup", "0"))
            min_ratio = float(options.get("min", "0"))
            steps = int(options["steps"]) if "steps" in options else total_steps
        except ValueError:
            raise LiveputError(
                f"--lr-schedule {text!r}: warmup and steps are integers, min a number"
            ) from None
        return cls(kind=kind, warmup_steps=warmup, total_steps=steps, min_ratio=min_ratio)


@dataclass(frozen=True)
class TrainingConfig:
    """Precision, clipping, schedule and activation checkpointing of a job (module docstring)."""

    precision: str = "fp32"
    """``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast and a dynamic loss scale); weights and
    optimizer state stay fp32."""
    clip_grad_norm: float | None = None
    """Clip the gradients to this global L2 norm (None: no clipping)."""
    lr_schedule: LRSchedule | None = None
    """Learning rate by global step (None: the optimizer's own, constant)."""
    activation_checkpointing: bool = False
    """Recompute each layer's forward in its backward pass instead of keeping its activations."""
    initial_loss_scale: float = 2.0**16
    """fp16: the loss scale of the first step."""
    loss_scale_growth_interval: int = 2000
    """fp16: steps without an overflow after which the loss scale doubles (an overflow halves it
    and skips the step's update)."""
    on_nonfinite_loss: str = "stop"
    """A step whose loss is NaN or infinite: ``stop`` the job (the step is not committed; every
    instance stops with one line naming the step), or ``skip`` its update on every stage (the
    step is committed as applied with no change to the weights, and a warning names it)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise LiveputError(
                f"training: unknown precision {self.precision!r}; known: {', '.join(PRECISIONS)}"
            )
        if self.clip_grad_norm is not None and not (
            math.isfinite(self.clip_grad_norm) and self.clip_grad_norm > 0
        ):
            raise LiveputError(
                f"training: clip_grad_norm must be a positive number, not {self.clip_grad_norm}"
            )
        if not (math.isfinite(self.initial_loss_scale) and self.initial_loss_scale >= 1):
            raise LiveputError(
                f"training: initial_loss_scale must be >= 1, not {self.initial_loss_scale}"
            )
        if self.loss_scale_growth_interval < 1:
            raise LiveputError("training: loss_scale_growth_interval must be >= 1")
        if self.on_nonfinite_loss not in NONFINITE_LOSS:
            raise LiveputError(
                f"training: on_nonfinite_loss must be one of "
                f"{', '.join(NONFINITE_LOSS)}, not {self.on_nonfinite_loss!r}"
            )

    @property
    def global_norm_needed(self) -> bool:
        """Whether a step needs the norm of every layer's gradients (clipping, or the fp16
        overflow check and the skip of a non-finite loss, which must skip the step on every
        stage at once)."""
        return (
            self.clip_grad_norm is not None
            or self.precision == "fp16"
            or self.on_nonfinite_loss == "skip"
        )

    def to_dict(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k != "lr_schedule"}
        data["lr_schedule"] = None if self.lr_schedule is None else dict(self.lr_schedule.__dict__)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> TrainingConfig:
        data = dict(data)
        schedule = data.pop("lr_schedule", None)
        return cls(**data, lr_schedule=None if schedule is None else LRSchedule(**schedule))
