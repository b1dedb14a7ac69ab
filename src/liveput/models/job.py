"""The training job: a model given as a sequence of layers, a dataset, a loss and an optimizer.

The global batch of step ``s`` is the samples ``s * B .. s * B + B - 1``, cut into micro-batches
of ``micro_batch_size``; whatever (D, P) runs it, the same micro-batches are computed and their
gradients summed, so training is the same computation. Sample ``g`` is read from the dataset at
``g`` modulo its length ``N`` (epoch ``g // N`` reads it in order), or, with
``Job.shuffle_seed``, at position ``g % N`` of epoch ``g // N``'s seeded permutation: a pure
function of (seed, epoch, position), so that every agent reads the same samples.
The built-in jobs and the registry that names them are in :mod:`liveput.models.jobs`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.lazy import (
    InitLayer,
    building_empty,
    check_initialized,
    fill_empty,
    initialize_layers,
    is_empty,
)
from liveput.models.ties import Tie, members, resolve_ties
from liveput.models.training import TrainingConfig

OptimizerFactory = Callable[[list], torch.optim.Optimizer]
"""Builds a layer's optimizer from its parameters: a list of ``nn.Parameter``, or, when the
factory's first parameter is named ``named_parameters``, a list of ``(name, parameter)`` pairs
named as in the whole model (:func:`build_optimizer`)."""
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Evaluate = Callable[[nn.Sequential], Mapping[str, float] | float]
"""Evaluates the unsplit model (``nn.Sequential`` of the layers, holding a step's weights): its
metrics by name, or one number (named ``value``)."""


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
    """Builds an optimizer over a list of parameters, or, when its first parameter is named
    ``named_parameters``, over ``(name, parameter)`` pairs named as in the unsplit model
    (``"3.weight"``: layer 3's ``weight``), so that parameter groups can be chosen by name.
    Called once per layer: the optimizer must be element-wise over parameters (SGD, Adam,
    AdamW...), so per-layer optimizers equal one global optimizer and a layer's state can move
    between instances."""
    global_batch_size: int
    """B: samples per training step, fixed whatever the configuration."""
    micro_batch_size: int = 4
    """Samples per micro-batch; ``global_batch_size`` must be a multiple of it."""
    name: str = "job"
    """Name used in logs and profiles."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Precision, gradient clipping, learning-rate schedule, activation checkpointing
    (:mod:`liveput.models.training`)."""
    shuffle_seed: int | None = None
    """None: the dataset is read in order, epoch after epoch; a seed: each epoch reads it in
    its own permutation, drawn from (seed, epoch) alone, the same on every agent."""
    evaluate: Evaluate | None = None
    """None: no evaluation. Else called after every ``evaluate_every_steps``-th committed step,
    on one instance, with the unsplit model assembled from that step's checkpoint (a copy of
    ``nn.Sequential(*layers)`` on the CPU, under ``torch.no_grad()``); returns its metrics by
    name (``{"accuracy": 0.91}``) or one number (named ``value``). The results go to the
    job's store, ``liveput status``, ``train -o`` and TensorBoard (``eval/<name>``)."""
    evaluate_every_steps: int = 100
    """N: evaluate after steps N, 2N, ... (counted from 1; the ledger's 0-based steps N-1,
    2N-1, ...). Each of them is also a checkpoint step: the model is read from it."""
    tied_weights: Sequence[Tie] = ()
    """Parameters of two layers that are one matrix of the model (tied input and output
    embeddings), as pairs of names in the unsplit model: ``[("0.weight", "2.weight")]``. Both
    copies start equal (the later is set to the earlier's values) and every step both get the
    sum of their gradients, so they stay equal. Layers that share one ``nn.Parameter`` object
    are tied without being named (a ``transformers`` model built tied). Once the job is built,
    this lists every tie, the earlier layer first."""
    init_layer: InitLayer | None = None
    """None: the layers hold the job's initial weights. Else ``init_layer(k, layer)`` sets layer
    ``k``'s parameters from ``k`` and a seed alone (``liveput.seeded_init(seed)``: each layer's
    ``reset_parameters()`` under its own seed), so that an agent builds only the layers it holds
    (``liveput.models.lazy``). The layers may then be built without weights, inside
    ``liveput.empty_parameters()``: the job initializes them with it. Layers built with weights
    must already hold what it gives (every agent uses its values)."""

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
        if self.shuffle_seed is not None and (
            not isinstance(self.shuffle_seed, int) or self.shuffle_seed < 0
        ):
            raise LiveputError(
                f"Job.shuffle_seed must be None or an int >= 0, not {self.shuffle_seed!r}"
            )
        if not isinstance(self.training, TrainingConfig):
            raise LiveputError("Job.training must be a liveput.TrainingConfig")
        if self.evaluate is not None and not callable(self.evaluate):
            raise LiveputError(f"Job.evaluate must be None or a callable, not {self.evaluate!r}")
        every = self.evaluate_every_steps
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise LiveputError(f"Job.evaluate_every_steps must be an int >= 1, not {every!r}")
        if self.init_layer is not None and not callable(self.init_layer):
            raise LiveputError(
                f"Job.init_layer must be None or a callable, not {self.init_layer!r}"
            )
        self.layers = list(self.layers)
        if not building_empty() and any(is_empty(layer) for layer in self.layers):
            if self.init_layer is None:
                first = next(i for i, layer in enumerate(self.layers) if is_empty(layer))
                raise LiveputError(
                    f"Job {self.name}: layer {first} was built without weights (meta device) "
                    "and the job gives no init_layer to initialize it"
                )
            initialize_layers(self.layers, self.init_layer)
        self.tied_weights = resolve_ties(self.layers, self.tied_weights)

    def own_layer(self, index: int, device: torch.device, initialize: bool = True) -> nn.Module:
        """This instance's own copy of layer ``index`` on ``device``: as the job initializes
        it, or, with ``initialize`` false, its memory only (for state loaded next). A layer
        built without weights is materialized and initialized alone (``liveput.models.lazy``)."""
        source = self.layers[index]
        if not is_empty(source):
            return copy.deepcopy(source).to(device)
        module = copy.deepcopy(source)
        filled = fill_empty(module)
        if initialize and self.init_layer is not None:
            # On the CPU: a CUDA generator would draw other numbers than the eager build's.
            self.init_layer(index, module)
            self._take_tied(index, module)
            check_initialized(index, filled)
        return module.to(device)

    def _take_tied(self, index: int, module: nn.Module) -> None:
        """Layer ``index``'s later parameters of ties take their earlier layer's initial
        values."""
        parameters = dict(module.named_parameters(remove_duplicate=False))
        for tie in self.tied_weights:
            (first_layer, first_name), (second_layer, second_name) = members(tie)
            if second_layer == index and first_layer != index:
                earlier = dict(self.own_layer(first_layer, torch.device("cpu")).named_parameters())
                with torch.no_grad():
                    parameters[second_name].copy_(earlier[first_name])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def evaluation_due(self, step: int) -> bool:
        """Whether the job evaluates the model after 0-based step ``step``."""
        return self.evaluate is not None and (step + 1) % self.evaluate_every_steps == 0

    @property
    def num_micro_batches(self) -> int:
        """M: micro-batches per step."""
        return self.global_batch_size // self.micro_batch_size

    def sample_ids(self, step: int, micro_batch: int) -> range:
        """Global sample indices of micro-batch ``micro_batch`` of step ``step``."""
        first = step * self.global_batch_size + micro_batch * self.micro_batch_size
        return range(first, first + self.micro_batch_size)

    def dataset_index(self, sample: int, size: int) -> int:
        """The dataset index global sample ``sample`` reads (``size``: the dataset's length)."""
        epoch, position = divmod(sample, size)
        if self.shuffle_seed is None:
            return position
        return int(epoch_order(self.shuffle_seed, epoch, size)[position])

    def micro_batch(self, step: int, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stacked (inputs, targets) of one micro-batch."""
        size = len(self.dataset)  # type: ignore[arg-type]
        pairs = [
            self.dataset[self.dataset_index(i, size)] for i in self.sample_ids(step, micro_batch)
        ]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


@lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, size: int) -> np.ndarray:
    """The dataset indices epoch ``epoch`` reads, in order: a permutation of ``range(size)``
    drawn from (seed, epoch) alone (NumPy's seed sequence, so the same on every machine)."""
    order = np.random.default_rng([seed, epoch]).permutation(size)
    order.setflags(write=False)
    return order


def build_optimizer(
    factory: OptimizerFactory, layer_index: int, module: nn.Module
) -> torch.optim.Optimizer | None:
    """Layer ``layer_index``'s optimizer from the job's factory (None: no parameters to train).

    A factory whose first parameter is named ``named_parameters`` gets ``(name, parameter)``
    pairs named as in the unsplit model (``f"{layer_index}.{name}"``, as ``nn.Sequential``
    names them); any other gets the parameters."""
    named = [(f"{layer_index}.{name}", p) for name, p in module.named_parameters()]
    if not named:
        return None
    if _wants_names(factory):
        return factory(named)
    return factory([p for _, p in named])


def _wants_names(factory: OptimizerFactory) -> bool:
    try:
        first = next(iter(inspect.signature(factory).parameters), None)
    except (TypeError, ValueError):  # a builtin without a signature: the plain form
        return False
    return first == "named_parameters"


def replica_micro_batches(num_micro_batches: int, data_parallel: int, pipeline: int) -> range:
    """Micro-batches of the step that pipeline ``pipeline`` of ``data_parallel`` computes."""
    if data_parallel > num_micro_batches:
        raise LiveputError(
            f"{data_parallel} pipelines for {num_micro_batches} micro-batches: some would idle"
        )
    start = pipeline * num_micro_batches // data_parallel
    return range(start, (pipeline + 1) * num_micro_batches // data_parallel)
