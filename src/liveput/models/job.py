"""The training job: a model given as a sequence of layers, a dataset, a loss and an optimizer.

The global batch of step ``s`` is the samples ``s * B .. s * B + B - 1`` (modulo the dataset
length), cut into micro-batches of ``micro_batch_size``; whatever (D, P) runs it, the same
micro-batches are computed and their gradients summed, so training is the same computation.
The built-in jobs and the registry that names them are in :mod:`liveput.models.jobs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.training import TrainingConfig

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Job:
    """What to train and how; every agent builds the same job (same initial weights)."""

    layers: Sequence[nn.Module]
    """The model as layers in order; each maps one tensor to one tensor. Pipeline stages are cut
    between layers."""
    dataset: torch.utils.data.Dataset
    """Indexable: ``dataset[i]`` -> ``(input, target)`` tensors; sample i is always the same."""
    loss_fn: LossFn
    """Mean loss of the last layer's output for a micro-batch against its targets."""
    optimizer: OptimizerFactory
    """Builds an optimizer over a list of parameters. Called once per layer: the optimizer must be
    element-wise over parameters (SGD, Adam, AdamW...), so per-layer optimizers equal one global
    optimizer and a layer's state can move between instances."""
    global_batch_size: int
    """B: samples per training step, fixed whatever the configuration."""
    micro_batch_size: int = 4
    """Samples per micro-batch; ``global_batch_size`` must be a multiple of it."""
    name: str = "job"
    """Name used in logs and profiles."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Precision, gradient clipping, learning-rate schedule, activation checkpointing
    (:mod:`liveput.models.training`)."""

    def __post_init__(self) -> None:
        if not self.layers or not all(isinstance(layer, nn.Module) for layer in self.layers):
            raise LiveputError("Job.layers must be a non-empty sequence of torch.nn.Module")
        if not callable(self.loss_fn) or not callable(self.optimizer):
            raise LiveputError("Job.loss_fn and Job.optimizer must be callables")
        if self.micro_batch_size < 1 or self.global_batch_size < 1:
            raise LiveputError("Job: global_batch_size and micro_batch_size must be >= 1")
        if self.global_batch_size % self.micro_batch_size:
            raise LiveputError(
                f"Job: global_batch_size {self.global_batch_size} is not a multiple of "
                f"micro_batch_size {self.micro_batch_size}"
            )
        try:
            size = len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            raise LiveputError("Job.dataset must have a length (a map-style Dataset)") from None
        if size < 1:
            raise LiveputError("Job.dataset is empty")
        if size < self.global_batch_size:
            raise LiveputError(
                f"Job {self.name}: the dataset has {size} samples, fewer than one "
                f"batch ({self.global_batch_size})"
            )
        if not isinstance(self.training, TrainingConfig):
            raise LiveputError("Job.training must be a liveput.TrainingConfig")
        self.layers = list(self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_micro_batches(self) -> int:
        """M: micro-batches per step."""
        return self.global_batch_size // self.micro_batch_size

    def sample_ids(self, step: int, micro_batch: int) -> range:
        """Global sample indices of micro-batch ``micro_batch`` of step ``step``."""
        first = step * self.global_batch_size + micro_batch * self.micro_batch_size
        return range(first, first + self.micro_batch_size)

    def micro_batch(self, step: int, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked (inputs, targets) of one micro-batch."""
        size = len(self.dataset)  # type: ignore[arg-type]
        pairs = [self.dataset[i % size] for i in self.sample_ids(step, micro_batch)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def replica_micro_batches(num_micro_batches: int, data_parallel: int, pipeline: int) -> range:
    """Micro-batches of the step that pipeline ``pipeline`` of ``data_parallel`` computes."""
    if data_parallel > num_micro_batches:
        raise LiveputError(
            f"{data_parallel} pipelines for {num_micro_batches} micro-batches: some would idle"
        )
    start = pipeline * num_micro_batches // data_parallel
    return range(start, (pipeline + 1) * num_micro_batches // data_parallel)
