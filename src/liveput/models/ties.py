"""Tied weights: one matrix of the model held by two layers (tied input and output embeddings).

Each layer owns its parameters, since the two layers of a tie may sit in different pipeline
stages; a tie makes their two copies train as the one matrix would, the way Megatron-LM trains a
tied embedding across a pipeline: both start equal, and each step both get the sum of the two
copies' gradients (the tied matrix's gradient), so that the same element-wise optimizer keeps
them equal (``liveput.runtime.tied_gradients`` sums them).

A tie is named by the two parameters' names in the unsplit model (``nn.Sequential(*layers)``'s
names, ``"0.token.weight"``: layer 0's ``token.weight``). A job's ties are those it names
(``Job.tied_weights``) and those its layers show by sharing one ``nn.Parameter`` object (a model
built tied, as a ``transformers`` causal LM with ``tie_word_embeddings``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from liveput.errors import LiveputError

Tie = tuple[str, str]
"""Two parameter names of the unsplit model, the earlier layer's first."""
Member = tuple[int, str]
"""A tied parameter: its layer's index and its name in that layer."""


def split_name(name: str) -> Member:
    """``"13.projection.weight"`` -> ``(13, "projection.weight")``."""
    head, _, rest = name.partition(".")
    if not head.isdigit() or not rest:
        raise LiveputError(
            f"Job.tied_weights: {name!r} is not a parameter name of the unsplit model "
            "(layer index, dot, the parameter's name in that layer: '0.token.weight')"
        )
    return int(head), rest


def members(tie: Tie) -> tuple[Member, Member]:
    """The two tied parameters of ``tie`` as (layer, name) pairs."""
    return split_name(tie[0]), split_name(tie[1])


def shared_parameters(layers: Sequence[nn.Module]) -> list[Tie]:
    """Pairs of names under which two layers hold one ``nn.Parameter`` object."""
    first_seen: dict[int, str] = {}
    ties: list[Tie] = []
    for index, layer in enumerate(layers):
        for name, parameter in layer.named_parameters():
            full = f"{index}.{name}"
            if id(parameter) in first_seen:
                ties.append((first_seen[id(parameter)], full))
            else:
                first_seen[id(parameter)] = full
    return ties


def resolve_ties(layers: Sequence[nn.Module], named: Iterable[Sequence[str]]) -> tuple[Tie, ...]:
    """The job's ties: ``named`` and the parameters its layers share, each once, earlier layer
    first, in the model's order. Refuses a name that is no parameter, two parameters of one
    layer or of different shapes, and a parameter in two ties. The later parameter of a tie
    named but not shared is set to the earlier one's values: both copies start as the one
    matrix."""
    found: dict[Tie, None] = {}
    for pair in [*named, *shared_parameters(layers)]:
        if isinstance(pair, str) or len(pair) != 2:
            raise LiveputError(f"Job.tied_weights: expected pairs of parameter names, got {pair!r}")
        ordered = sorted((split_name(pair[0]), split_name(pair[1])))
        found[(f"{ordered[0][0]}.{ordered[0][1]}", f"{ordered[1][0]}.{ordered[1][1]}")] = None
    ties = sorted(found, key=lambda tie: members(tie))
    seen: set[str] = set()
    for tie in ties:
        first, second = (_parameter(layers, name) for name in tie)
        if split_name(tie[0])[0] == split_name(tie[1])[0]:
            raise LiveputError(f"Job.tied_weights: {tie[0]} and {tie[1]} are of one layer")
        if seen & set(tie):
            raise LiveputError(
                f"Job.tied_weights: {sorted(seen & set(tie))[0]} is in two ties "
                "(a parameter may be tied to one other)"
            )
        if first.shape != second.shape or first.dtype != second.dtype:
            raise LiveputError(
                f"Job.tied_weights: {tie[0]} {tuple(first.shape)} {first.dtype} and "
                f"{tie[1]} {tuple(second.shape)} {second.dtype} cannot be one matrix"
            )
        seen.update(tie)
        if second is not first:
            with torch.no_grad():
                second.copy_(first)
    return tuple(ties)


def _parameter(layers: Sequence[nn.Module], name: str) -> nn.Parameter:
    index, rest = split_name(name)
    parameters = dict(layers[index].named_parameters()) if index < len(layers) else {}
    if rest not in parameters:
        raise LiveputError(f"Job.tied_weights: the model has no parameter {name}")
    return parameters[rest]
