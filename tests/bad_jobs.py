"""Jobs that go wrong at a known step (agents resolve them as ``bad_jobs:<function>``): a layer
that raises in forward or in backward, a loss that becomes NaN, a dataset shorter than a batch.

Sample i's input carries ``i / SAMPLES`` in its first feature, so the first layer knows which
samples it sees: it misbehaves from the first sample of step ``BAD_STEP`` on (the profiler, which
measures on the first few samples, never triggers it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from liveput import Job, TrainingConfig

SAMPLES = 400
BATCH = 8
BAD_STEP = 5
"""The first step that goes wrong."""
_FIRST_BAD = BAD_STEP * BATCH


class _Indexed(torch.utils.data.Dataset):
    def __init__(
        self, size: int, nan_from: int | None = None, nan_until: int | None = None
    ) -> None:
        self.size = size
        self.nan_from = nan_from
        self.nan_until = nan_until

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        bad = self.nan_from is not None and self.nan_from <= index < (self.nan_until or self.size)
        target = torch.tensor([float("nan") if bad else float(index % 5) / 5])
        return torch.tensor([index / SAMPLES, 0.5, -0.25, 1.0]), target


def _bad(x: torch.Tensor) -> bool:
    return bool((x[:, 0] * SAMPLES).round().max() >= _FIRST_BAD)


class ForwardBomb(nn.Module):
    """A linear layer whose forward raises on the samples of step ``BAD_STEP``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _bad(x):
            raise ValueError("cannot handle these samples")
        return self.linear(x)


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, armed: bool) -> torch.Tensor:  # noqa: ANN001
        ctx.armed = armed
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205
        if ctx.armed:
            raise FloatingPointError("gradient overflow in a custom kernel")
        return grad, None


class BackwardBomb(nn.Module):
    """A linear layer whose backward raises on the samples of step ``BAD_STEP``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FailingBackward.apply(self.linear(x), _bad(x))


def _job(first: Callable[[], nn.Module], dataset: torch.utils.data.Dataset, name: str) -> Job:
    """``first`` makes the first layer after the seed is set: made by the caller, its weights
    came from whatever the random generator held, so two resolutions of one job (a run and its
    reference) differed whenever a test before them had drawn a different count of numbers."""
    torch.manual_seed(0)
    return Job(
        layers=[first(), nn.Sequential(nn.Tanh(), nn.Linear(4, 4)), nn.Linear(4, 1)],
        dataset=dataset,
        loss_fn=nn.functional.mse_loss,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.01),
        global_batch_size=BATCH,
        micro_batch_size=2,
        name=name,
    )


def forward_bomb_job() -> Job:
    return _job(ForwardBomb, _Indexed(SAMPLES), "forward-bomb")


def backward_bomb_job() -> Job:
    return _job(BackwardBomb, _Indexed(SAMPLES), "backward-bomb")


def nan_loss_job() -> Job:
    return _job(lambda: nn.Linear(4, 4), _Indexed(SAMPLES, nan_from=_FIRST_BAD), "nan-loss")


def nan_once_skipped_job() -> Job:
    """The loss is NaN at step ``BAD_STEP`` only; the job skips such a step's update."""
    job = _job(
        lambda: nn.Linear(4, 4),
        _Indexed(SAMPLES, nan_from=_FIRST_BAD, nan_until=_FIRST_BAD + BATCH),
        "nan-once",
    )
    return dataclasses.replace(job, training=TrainingConfig(on_nonfinite_loss="skip"))


def short_dataset_job() -> Job:
    return _job(lambda: nn.Linear(4, 4), _Indexed(BATCH - 3), "short-dataset")
