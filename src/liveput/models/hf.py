"""Decoder-only transformers from ``transformers`` configs, cut into layers liveput can pipeline.

A causal LM becomes ``[embedding, block_0, ..., block_{n-1}, head]``: token ids ``(B, T)`` ->
hidden states ``(B, T, C)`` -> ... -> logits ``(B, T, V)``. Layers pass only tensors, so whatever
a block needs besides the hidden states (the causal mask, Llama's rotary position embeddings) is
computed inside the block from the hidden states' shape, as the whole model would compute it for
a batch without padding or cache. Weights are randomly initialized from the config (nothing is
downloaded). Families are registered by the config's ``model_type`` in :data:`FAMILIES`.

Tied input and output embeddings (GPT-2's default) stay tied: the embedding layer and the head
share the model's one matrix, which makes them a tie of any :class:`liveput.Job` built from them
(``liveput.models.ties``). The engine gives each its own copy (they may sit in different pipeline
stages) and trains the two as the one matrix; :func:`to_hf_causal_lm` gives the weights back as
the ``transformers`` model, under its own key names, tied.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.extras import require
from liveput.models.lazy import (
    InitLayer,
    building_empty,
    constructing,
    initialize_layers,
    seeded,
)
from liveput.registry import Registry

LOG = logging.getLogger(__name__)
CutFn = Callable[[nn.Module], list[nn.Module]]
FAMILIES: Registry[CutFn] = Registry("causal LM family")
"""``model_type`` of a config -> how to cut a ``*ForCausalLM`` of that family into layers."""


def _causal_mask(config: Any, hidden: torch.Tensor, positions: torch.Tensor) -> Any:
    """The mask the whole model would give its blocks for an unpadded batch without cache (the
    attention implementation's own form: ``None`` lets SDPA use its causal kernel)."""
    masking = require("transformers.masking_utils", "a transformers model")
    return masking.create_causal_mask(
        config=config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=positions
    )


class TokenEmbedding(nn.Module):
    """Token embedding, plus learned positions and dropout where the family has them (GPT-2)."""

    def __init__(
        self, token: nn.Module, position: nn.Module | None = None, dropout: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.token = token
        self.position = position
        self.dropout = dropout if dropout is not None else nn.Identity()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.token(tokens)
        if self.position is not None:
            hidden = hidden + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        return self.dropout(hidden)


class DecoderBlock(nn.Module):
    """One decoder layer of a ``transformers`` model, called with what the model would pass it:
    the causal mask and, for rotary families, the position embeddings."""

    def __init__(self, block: nn.Module, config: Any, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.block = block
        self.rotary = rotary
        self.config = config

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        extra: dict[str, Any] = {}
        if self.rotary is not None:
            extra = {
                "position_ids": positions,
                "position_embeddings": self.rotary(hidden, positions),
            }
        out = self.block(
            hidden, attention_mask=_causal_mask(self.config, hidden, positions), **extra
        )
        return out[0] if isinstance(out, tuple) else out


class LMHead(nn.Module):
    """Final norm and projection to the vocabulary."""

    def __init__(self, norm: nn.Module, projection: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.projection = projection

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.projection(self.norm(hidden))


# A cut function takes a transformers model as Any: its submodules are attributes by name, which
# nn.Module types as Tensor | Module.
@FAMILIES.register("gpt2")
def _cut_gpt2(model: Any) -> list[nn.Module]:
    body = model.transformer
    return [
        TokenEmbedding(body.wte, body.wpe, body.drop),
        *(DecoderBlock(block, model.config) for block in body.h),
        LMHead(body.ln_f, model.lm_head),
    ]


@FAMILIES.register("llama")
def _cut_llama(model: Any) -> list[nn.Module]:
    body = model.model
    # Rotary embeddings hold no parameters (their buffer is not saved): each block has its own.
    return [
        TokenEmbedding(body.embed_tokens),
        *(
            DecoderBlock(block, model.config, copy.deepcopy(body.rotary_emb))
            for block in body.layers
        ),
        LMHead(body.norm, model.lm_head),
    ]


def _family(config: Any) -> CutFn:
    model_type = getattr(config, "model_type", None)
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise LiveputError(
            f"causal LM family {model_type!r} is not supported; "
            f"known: {', '.join(FAMILIES.names())}"
        )
    return FAMILIES.get(model_type)


def hf_causal_lm_layers(model: nn.Module) -> list[nn.Module]:
    """Cut an existing ``*ForCausalLM`` into layers (they share its modules: tied embeddings
    stay one matrix, which a job built from the layers trains as one)."""
    return _family(model.config)(model)


def from_hf_causal_lm(config: Any, seed: int = 0) -> list[nn.Module]:
    """A randomly initialized decoder-only transformer from a ``transformers`` config (GPT-2 or
    Llama family), as layers; initialization is deterministic in ``seed``."""
    return hf_causal_lm(config, seed)[0]


def hf_causal_lm(config: Any, seed: int = 0) -> tuple[list[nn.Module], InitLayer]:
    """:func:`from_hf_causal_lm`'s layers and their ``init_layer``: the family's own
    initialization (the model's ``_init_weights``, children first, as ``transformers`` applies
    it), each layer under its own seed. Without weights while a job is built empty."""
    transformers = require("transformers", "liveput.models.from_hf_causal_lm")
    if not isinstance(config, transformers.PretrainedConfig):
        raise LiveputError(
            f"from_hf_causal_lm: expected a transformers config, got {type(config).__name__}"
        )
    _family(config)
    config = copy.deepcopy(config)
    with constructing():
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = hf_causal_lm_layers(model.train())

    def init(layer: nn.Module) -> None:
        layer.apply(model._init_weights)  # children first, as transformers applies it

    init_layer = seeded(seed, init)
    if not building_empty():
        initialize_layers(layers, init_layer)
    return layers, init_layer


def hf_config_of(layers: Sequence[nn.Module]) -> Any | None:
    """The ``transformers`` config the layers were cut from (None: not a transformers job)."""
    return next((layer.config for layer in layers if isinstance(layer, DecoderBlock)), None)


def to_hf_causal_lm(layers: Sequence[nn.Module], state: Mapping[str, torch.Tensor]) -> Any:
    """The ``*ForCausalLM`` the job's ``layers`` were cut from, holding ``state`` (the keys of
    ``nn.Sequential(*layers)``) under its own key names: ``save_pretrained`` writes what
    ``AutoModelForCausalLM.from_pretrained`` loads, with outputs equal to the layers'.

    Embeddings the original config tied are tied again: a job trains them as one matrix, so
    the token embedding and the head are equal. Where they are not (weights from before liveput
    kept ties), tying them would change the model's outputs: they stay untied
    (``tie_word_embeddings`` false), with a warning."""
    transformers = require("transformers", "a transformers model's export")
    config = hf_config_of(layers)
    if config is None:
        raise LiveputError("to_hf_causal_lm: the layers are not cut from a transformers model")
    config = copy.deepcopy(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    config.tie_word_embeddings = False  # tied below, once the two are known to be equal
    model = transformers.AutoModelForCausalLM.from_config(config)
    try:
        nn.Sequential(*_family(config)(model)).load_state_dict(dict(state))
    except RuntimeError as error:
        raise LiveputError(
            f"to_hf_causal_lm: the weights do not fit the model: {str(error).splitlines()[0]}"
        ) from None
    if tied:
        embedding = model.get_input_embeddings().weight
        if torch.equal(embedding, model.get_output_embeddings().weight):
            model.config.tie_word_embeddings = True
            model.tie_weights()
        else:
            LOG.warning(
                "the trained token embedding and LM head differ (weights trained untied): "
                "they stay untied, so that the model's outputs are the trained ones"
            )
    return model.eval()
