"""The training job: a model given as a sequence of layers, a dataset, a loss and an optimizer.

The global batch of step ``s`` is the samples ``s * B .. s * B + B - 1`` (modulo the dataset
length), cut into micro-batches of ``micro_batch_size``; whatever (D, P) runs it, the same
micro-batches are computed and their gradients summed, so training is the same computation.
Built-in jobs are registered by name in :data:`JOBS`; a user's job is ``module:function``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.registry import Registry, call_spec
from liveput.runtime.training import TrainingConfig

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
    (:mod:`liveput.runtime.training`)."""

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
                f"micro_batch_size {self.micro_batch_size}")
        try:
            size = len(self.dataset)  # type: ignore[arg-type]
        except TypeError:
            raise LiveputError("Job.dataset must have a length (a map-style Dataset)") from None
        if size < 1:
            raise LiveputError("Job.dataset is empty")
        if size < self.global_batch_size:
            raise LiveputError(f"Job {self.name}: the dataset has {size} samples, fewer than one "
                               f"batch ({self.global_batch_size})")
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
            f"{data_parallel} pipelines for {num_micro_batches} micro-batches: some would idle")
    start = pipeline * num_micro_batches // data_parallel
    return range(start, (pipeline + 1) * num_micro_batches // data_parallel)


JOBS: Registry[Callable[..., Job]] = Registry("job")
"""Built-in jobs by name: factories called without arguments, or with ``data=PATH`` (the
user's ``--data``) where they take it."""


@dataclass(frozen=True)
class TinyGPTJobConfig:
    """Shape and training settings of the built-in tiny-gpt job."""

    num_blocks: int = 4
    """Transformer blocks."""
    d_model: int = 256
    """Width of the residual stream."""
    seq_len: int = 64
    """Context length in bytes."""
    global_batch_size: int = 16
    """Samples per step."""
    micro_batch_size: int = 4
    """Samples per micro-batch."""
    learning_rate: float = 1e-3
    """AdamW learning rate (SGD with momentum when ``sgd``)."""
    sgd: bool = False
    """Use SGD with momentum instead of AdamW (bit-stable across configurations; tests)."""
    corpus_bytes: int = 2_000_000
    """Bytes of the standard library's sources to read."""
    seed: int = 0
    """Initialization seed."""


def tiny_gpt_job(config: TinyGPTJobConfig | None = None) -> Job:
    """tiny-gpt on the standard library's sources."""
    from liveput.models.corpus import ByteWindows, load_stdlib_corpus
    from liveput.models.tiny_gpt import TinyGPTConfig, build_tiny_gpt, language_model_loss

    config = config or TinyGPTJobConfig()
    model = TinyGPTConfig(seq_len=config.seq_len, d_model=config.d_model,
                          num_blocks=config.num_blocks, num_heads=4)
    rate = config.learning_rate

    def optimizer(parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        if config.sgd:
            return torch.optim.SGD(parameters, lr=rate, momentum=0.9)
        return torch.optim.AdamW(parameters, lr=rate, weight_decay=0.0)

    return Job(
        layers=build_tiny_gpt(model, seed=config.seed),
        dataset=ByteWindows(load_stdlib_corpus(config.corpus_bytes), config.seq_len),
        loss_fn=language_model_loss, optimizer=optimizer,
        global_batch_size=config.global_batch_size, micro_batch_size=config.micro_batch_size,
        name="tiny-gpt",
    )


JOBS.register("tiny-gpt")(lambda: tiny_gpt_job())
JOBS.register("tiny-gpt-32")(lambda: tiny_gpt_job(TinyGPTJobConfig(
    global_batch_size=32, micro_batch_size=8)))  # the batch `load_profile("tiny-gpt")` measures
JOBS.register("tiny-gpt-small")(lambda: tiny_gpt_job(TinyGPTJobConfig(
    num_blocks=2, d_model=64, seq_len=32, global_batch_size=8, micro_batch_size=2,
    learning_rate=0.05, sgd=True, corpus_bytes=200_000)))


def resolve_job(spec: str, data: str | None = None) -> Job:
    """A built-in job by name or ``module:function`` returning a :class:`Job`; ``data``: the
    file a built-in job that takes one trains on."""
    if data is not None:
        takers = [name for name in JOBS.names()
                  if "data" in inspect.signature(JOBS.get(name)).parameters]
        if spec not in takers:
            raise LiveputError(f"job {spec!r} takes no --data; the built-in jobs that do: "
                               f"{', '.join(takers)}")
        return JOBS.get(spec)(data=data)
    if spec in JOBS:
        return JOBS.get(spec)()
    return call_spec(spec, Job, "job", JOBS.names())


# The built-in jobs of real models register themselves (their imports of transformers and the
# like wait until one is built).
import liveput.models.jobs  # noqa: E402,F401
