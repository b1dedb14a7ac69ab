"""Decoder-only transformers from ``transformers`` configs, cut into layers liveput can pipeline.

A causal LM becomes ``[embedding, block_0, ..., block_{n-1}, head]``: token ids ``(B, T)`` ->
hidden states ``(B, T, C)`` -> ... -> logits ``(B, T, V)``. Layers pass only tensors, so whatever
a block needs besides the hidden states (the causal mask, Llama's rotary position embeddings) is
computed inside the block from the hidden states' shape, as the whole model would compute it for
a batch without padding or cache. Weights are randomly initialized from the config (nothing is
downloaded). Families are registered by the config's ``model_type`` in :data:`FAMILIES`.

Tied input and output embeddings (GPT-2's default) are untied: the embedding and the head may
sit in different pipeline stages, and each layer owns its parameters. The head starts as a copy of
the embedding, as the tied model would, and :func:`to_hf_causal_lm` gives the weights back as the
``transformers`` model, under its own key names, tied again where they still are equal.
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

    tied_embeddings: bool = False
    """Whether the original config tied the projection to the token embedding (liveput trains
    them apart; :func:`to_hf_causal_lm` ties them again)."""

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
    """Cut an existing ``*ForCausalLM`` into layers (they share its modules). Its input and
    output embeddings must not be tied."""
    cut = _family(model.config)
    layers = cut(model)
    shared = {id(p) for p in layers[0].parameters()} & {id(p) for p in layers[-1].parameters()}
    if shared:
        raise LiveputError(
            "the model's input and output embeddings are tied: build it with "
            "tie_word_embeddings=False (each pipeline stage owns its weights)"
        )
    return layers


def from_hf_causal_lm(config: Any, seed: int = 0) -> list[nn.Module]:
    """A randomly initialized decoder-only transformer from a ``transformers`` config (GPT-2 or
    Llama family), as layers; initialization is deterministic in ``seed``."""
    transformers = require("transformers", "liveput.models.from_hf_causal_lm")
    if not isinstance(config, transformers.PretrainedConfig):
        raise LiveputError(
            f"from_hf_causal_lm: expected a transformers config, got {type(config).__name__}"
        )
    _family(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    config = copy.deepcopy(config)
    config.tie_word_embeddings = False
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.random.set_rng_state(generator_state)
    layers = hf_causal_lm_layers(model.train())
    if tied:
        # The tied model's head is its embedding: both start from the same weights.
        with torch.no_grad():
            model.get_output_embeddings().weight.copy_(model.get_input_embeddings().weight)
        head = layers[-1]
        if isinstance(head, LMHead):
            head.tied_embeddings = True
    return layers


def hf_config_of(layers: Sequence[nn.Module]) -> Any | None:
    """The ``transformers`` config the layers were cut from (None: not a transformers job)."""
    return next((layer.config for layer in layers if isinstance(layer, DecoderBlock)), None)


def to_hf_causal_lm(layers: Sequence[nn.Module], state: Mapping[str, torch.Tensor]) -> Any:
    """The ``*ForCausalLM`` the job's ``layers`` were cut from, holding ``state`` (the keys of
    ``nn.Sequential(*layers)``) under its own key names: ``save_pretrained`` writes what
    ``AutoModelForCausalLM.from_pretrained`` loads, with outputs equal to the layers'.

    Embeddings the original config tied are tied again when training left the token embedding
    and the head equal; liveput trains them apart, so once they differ tying them would change
    the model's outputs: they stay untied (``tie_word_embeddings`` false), with a warning."""
    transformers = require("transformers", "a transformers model's export")
    config = hf_config_of(layers)
    if config is None:
        raise LiveputError("to_hf_causal_lm: the layers are not cut from a transformers model")
    config = copy.deepcopy(config)
    config.tie_word_embeddings = False
    model = transformers.AutoModelForCausalLM.from_config(config)
    try:
        nn.Sequential(*_family(config)(model)).load_state_dict(dict(state))
    except RuntimeError as error:
        raise LiveputError(
            f"to_hf_causal_lm: the weights do not fit the model: {str(error).splitlines()[0]}"
        ) from None
    if getattr(layers[-1], "tied_embeddings", False):
        embedding = model.get_input_embeddings().weight
        if torch.equal(embedding, model.get_output_embeddings().weight):
            model.config.tie_word_embeddings = True
            model.tie_weights()
        else:
            LOG.warning(
                "the trained token embedding and LM head differ (liveput trains them apart): "
                "they stay untied, so that the model's outputs are the trained ones"
            )
    return model.eval()
