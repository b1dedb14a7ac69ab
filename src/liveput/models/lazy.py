"""A job built without its weights, and the layers an agent holds built alone.

An agent of a pipeline holds a few of the model's layers, yet building the job built and
initialized all of them: 3.3 s for gpt2-small on an idle core here, about 15 s each when eight
agents shared two cores, before any of them trained. A job that gives ``Job.init_layer`` (every
built-in job does) is built by an agent with its parameters on PyTorch's ``meta`` device (shapes,
no memory, no initialization: :func:`resolve_empty_job`), and each layer it holds is then
materialized alone (:func:`materialize_layer`), initialized by ``init_layer(k, layer)`` from the
layer's index and the job's seed alone, so that it equals the layer of the whole model built
eagerly: the way torchtitan builds on ``meta`` and calls ``init_weights``.

Buffers stay real while the job is built empty (as ``accelerate``'s ``init_empty_weights`` with
``include_buffers=False``): a rotary embedding's frequencies and BatchNorm's statistics are
computed at construction, from the shapes alone, and are copied with the layer.

Ties (``liveput.models.ties``): the later parameter of a tie starts as the earlier one's values,
so a layer holding the later one takes it from the earlier layer's initialization; the eager
build initializes layers from the last to the first, so that a matrix two layers share ends as
the earlier layer's, the same.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

import torch
from torch import nn

from liveput.errors import LiveputError

InitLayer = Callable[[int, nn.Module], None]
"""``init_layer(k, layer)``: set layer ``k``'s parameters (in place, under ``torch.no_grad``)
from ``k`` and the job's own seed alone."""

_BUILDING_EMPTY: ContextVar[bool] = ContextVar("liveput_building_empty", default=False)
_META = torch.device("meta")


@contextlib.contextmanager
def empty_parameters() -> Iterator[None]:
    """Modules constructed inside have their parameters on the ``meta`` device (their
    initializers then cost nothing) and real buffers. Module construction is patched for the
    duration (``nn.Module.register_parameter``): other threads must not build modules meanwhile."""
    register = nn.Module.register_parameter

    def register_empty(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        register(module, name, parameter)
        if parameter is not None and parameter.device != _META:
            module._parameters[name] = nn.Parameter(
                parameter.to(_META), requires_grad=parameter.requires_grad
            )

    nn.Module.register_parameter = register_empty  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def building_empty() -> bool:
    """Whether a job is being built empty (:func:`resolve_empty_job`): builders leave their
    layers on ``meta``, and ``Job`` does not materialize them."""
    return _BUILDING_EMPTY.get()


@contextlib.contextmanager
def constructing() -> Iterator[None]:
    """Where a builder constructs its modules: without weights while a job is built empty,
    else with them, to be initialized by its ``init_layer`` (:func:`initialize_layers`); the
    caller's random state is left as it was either way. Constructing without weights outside
    costs more than it saves: PyTorch's ``normal_`` of a ``meta`` tensor imports
    ``torch._dynamo`` (about 1 CPU-s), which a coordinator's profiling does not otherwise need."""
    with torch.random.fork_rng(devices=[]):
        if building_empty():
            with empty_parameters():
                yield
        else:
            yield


def is_empty(module: nn.Module) -> bool:
    """Whether any of ``module``'s parameters is on the ``meta`` device."""
    return any(parameter.device == _META for parameter in module.parameters())


def seeded(seed: int, init: Callable[[nn.Module], None]) -> InitLayer:
    """An ``init_layer`` that runs ``init(layer)`` under layer ``k``'s own seed, drawn from
    (``seed``, ``k``); the caller's random state is left as it was."""

    def init_layer(index: int, layer: nn.Module) -> None:
        digest = hashlib.sha256(f"liveput-layer:{seed}:{index}".encode()).digest()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
            init(layer)

    return init_layer


def reset_all(layer: nn.Module) -> None:
    """Every submodule's own ``reset_parameters()`` (PyTorch's default initialization)."""
    for module in layer.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


def seeded_init(seed: int = 0, init: Callable[[nn.Module], None] = reset_all) -> InitLayer:
    """The ``Job.init_layer`` of a model whose layers PyTorch's default initialization suits:
    each layer's ``reset_parameters()`` under its own seed (or ``init(layer)`` instead)."""
    return seeded(seed, init)


Made = dict[int, tuple[nn.Parameter, nn.Parameter]]
"""A ``meta`` parameter's id -> (it, kept alive so that its id is not reused; its replacement)."""


def fill_empty(module: nn.Module, made: Made | None = None) -> list[tuple[str, nn.Parameter]]:
    """Give ``module``'s ``meta`` parameters CPU memory, NaN until initialized; the filled
    ones, by name. ``made`` keeps a parameter that several modules share one."""
    made = {} if made is None else made
    before = set(made)
    for owner in module.modules():
        for name, parameter in list(owner._parameters.items()):
            if parameter is None or parameter.device != _META:
                continue
            if id(parameter) not in made:
                empty = torch.empty_like(parameter, device="cpu")
                if empty.is_floating_point() or empty.is_complex():
                    empty.fill_(float("nan"))
                made[id(parameter)] = (
                    parameter,
                    nn.Parameter(empty, requires_grad=parameter.requires_grad),
                )
            owner._parameters[name] = made[id(parameter)][1]
    filled = {id(new) for key, (_, new) in made.items() if key not in before}
    return [(n, p) for n, p in module.named_parameters() if id(p) in filled]


def check_initialized(index: int, filled: list[tuple[str, nn.Parameter]]) -> None:
    """Refuse a parameter its ``init_layer`` left out (still NaN): every agent would start
    from other values."""
    for name, parameter in filled:
        if parameter.is_floating_point() and bool(torch.isnan(parameter).any()):
            raise LiveputError(
                f"Job.init_layer left parameter {index}.{name} uninitialized (the layers were "
                "built without weights): it must set every parameter of the layer"
            )


def initialize_layers(layers: Sequence[nn.Module], init_layer: InitLayer) -> None:
    """Materialize and initialize every layer in place, the last first (module docstring)."""
    made: Made = {}
    filled = [fill_empty(layer, made) for layer in layers]
    for index in reversed(range(len(layers))):
        init_layer(index, layers[index])
    for index, named in enumerate(filled):
        check_initialized(index, named)


@contextlib.contextmanager
def empty_job() -> Iterator[None]:
    """A job built inside keeps its layers without weights (:func:`building_empty`), its
    modules' parameters on ``meta`` (:func:`empty_parameters`)."""
    token = _BUILDING_EMPTY.set(True)
    try:
        with empty_parameters():
            yield
    finally:
        _BUILDING_EMPTY.reset(token)
