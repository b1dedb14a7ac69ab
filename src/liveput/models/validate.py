"""One check of a user's model, on the CPU, before any process starts: the common mistakes as
one line naming the layer (or the dataset index), not a traceback from deep inside a run.

It runs the first samples of the first micro-batch (:data:`PROBE_SAMPLES`: the check costs a
fraction of a step) through copies of the layers, in their own mode (the engine never changes
it), and a second time from another random state where a layer drew from torch's generator
(whose state differs between replicas; randomness from elsewhere, NumPy's, is not seen). A
layer that returns something other than one tensor, a layer that does not accept its
predecessor's output, a layer whose output depends on the random state (dropout left on: the
replicas would compute different models), a dataset item that is not an ``(input, target)``
pair of tensors, and a loss that is not a scalar tensor are each refused with a
:class:`~liveput.errors.LiveputError`. The layers themselves are not touched (a forward in
training mode moves BatchNorm's running statistics: the copies take that).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.job import Job

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

PROBE_SAMPLES = 2
"""Samples the layers are checked on: two, not one, so that BatchNorm in training mode has a
batch to normalize over; ResNet-50's check took 32 s on a whole micro-batch of 8 on this busy
2-core machine."""


def describe(value: object) -> str:
    """A short description of ``value``: a tensor's shape and dtype, a container's items."""
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, tuple | list):
        inner = ", ".join(describe(item) for item in value[:4])
        more = ", ..." if len(value) > 4 else ""
        return f"{type(value).__name__} ({inner}{more})"
    if isinstance(value, dict):
        return f"dict with keys {sorted(map(str, value))[:4]}"
    return type(value).__name__


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def check_dataset(job: Job) -> tuple[torch.Tensor, torch.Tensor]:
    """The job's first micro-batch, each item checked to be an ``(input, target)`` pair of
    tensors that stack."""
    size = len(job.dataset)  # type: ignore[arg-type]
    indices = [job.dataset_index(i, size) for i in job.sample_ids(0, 0)]
    pairs = []
    for index in indices:
        item = job.dataset[index]
        if not (
            isinstance(item, tuple | list)
            and len(item) == 2
            and all(isinstance(part, torch.Tensor) for part in item)
        ):
            raise LiveputError(
                f"job {job.name}: dataset[{index}] is a {describe(item)}; expected an "
                "(input, target) pair of tensors"
            )
        pairs.append(item)
    try:
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    except RuntimeError as error:
        shapes = ", ".join(f"{describe(p[0])} / {describe(p[1])}" for p in pairs)
        raise LiveputError(
            f"job {job.name}: dataset items {indices} do not stack into a micro-batch "
            f"({shapes}): every sample's input, and every target, must have one shape"
        ) from error


def _forward(layer: nn.Module, source: torch.Tensor, seed: int) -> tuple[object, bool]:
    """``layer``'s output for ``source`` from random state ``seed``, and whether it drew from
    torch's random generator (the randomness that differs between replicas)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        output = layer(source)
        return output, not torch.equal(before, torch.get_rng_state())


def _check_layer(
    index: int, layer: nn.Module, source: torch.Tensor, came_from: str, name: str
) -> torch.Tensor:
    """``layer``'s output for ``source``, checked; ``came_from`` says what produced ``source``."""
    kind = f"model {name}: layer {index} ({type(layer).__name__})"
    # In the layer's own mode (the engine never changes it): a layer the user put in eval mode
    # keeps its dropout off.
    probe = copy.deepcopy(layer)
    try:
        first, random = _forward(probe, source, 1)
    except Exception as error:  # the user's code: anything it raises is reported in one line
        raise LiveputError(
            f"{kind} does not accept {came_from} ({describe(source)}): {_first_line(error)}"
        ) from error
    if not isinstance(first, torch.Tensor):
        raise LiveputError(
            f"{kind} returned a {describe(first)}, not a tensor: each layer maps one tensor to "
            "one tensor (wrap it in a module that keeps the part the next layer needs)"
        )
    if not random:  # nothing drawn: a second pass would compute the same (half the check's cost)
        return first
    second, _ = _forward(probe, source, 2)
    if not (
        isinstance(second, torch.Tensor)
        and second.shape == first.shape
        and torch.equal(torch.nan_to_num(first), torch.nan_to_num(second))
    ):
        raise LiveputError(
            f"{kind} is not deterministic: two forward passes of the same input from two random "
            "states differ (dropout in training mode?); every replica must compute the same "
            "model: turn its randomness off"
        )
    return first


def check_layers(
    layers: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    name: str = "job",
) -> None:
    """One micro-batch (``inputs``, ``targets``) through copies of ``layers`` and ``loss_fn``,
    on the CPU, without gradients; a one-line LiveputError for the first mistake."""
    activation = inputs.cpu()
    came_from = "the dataset's input"
    with torch.no_grad():
        for index, layer in enumerate(layers):
            activation = _check_layer(index, layer, activation, came_from, name)
            came_from = f"layer {index}'s ({type(layer).__name__}) output"
        try:
            loss = loss_fn(activation, targets.cpu())
        except Exception as error:  # the user's loss: reported in one line
            raise LiveputError(
                f"model {name}: the loss of the last layer's output ({describe(activation)}) "
                f"against the targets ({describe(targets)}) fails: {_first_line(error)}"
            ) from error
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point()):
        raise LiveputError(
            f"model {name}: the loss is a {describe(loss)}, expected a scalar floating-point "
            "tensor (the micro-batch's mean loss)"
        )


def check_job(job: Job) -> None:
    """The job's dataset, layers and loss checked on its first micro-batch, on the CPU (one
    line naming the layer or the dataset index for the first mistake)."""
    inputs, targets = check_dataset(job)
    check_layers(job.layers, inputs[:PROBE_SAMPLES], targets[:PROBE_SAMPLES], job.loss_fn, job.name)
