"""``tiny-gpt``: a small decoder-only transformer given as a sequence of layers.

A model that liveput trains must be a sequence of layers so that it can be cut into pipeline
stages anywhere between two layers. Each layer maps one tensor to one tensor:
``tokens (B, T) int64 -> embeddings (B, T, C) -> ... -> logits (B, T, V)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from liveput.errors import LiveputError
from liveput.models.lazy import (
    InitLayer,
    building_empty,
    constructing,
    initialize_layers,
    reset_all,
    seeded,
)


@dataclass(frozen=True)
class TinyGPTConfig:
    """Shape of the model (defaults: about 3.3 M parameters)."""

    vocab_size: int = 256
    """Tokens are bytes."""
    seq_len: int = 64
    """Context length in tokens."""
    d_model: int = 256
    """Width of the residual stream."""
    num_heads: int = 4
    """Attention heads per block."""
    num_blocks: int = 4
    """Transformer blocks (each one layer of the sequence)."""
    dropout: float = 0.0
    """Dropout is off by default so that runs are reproducible whatever the configuration."""

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise LiveputError(
                f"tiny-gpt: d_model {self.d_model} is not divisible by num_heads {self.num_heads}"
            )
        if min(self.vocab_size, self.seq_len, self.d_model, self.num_blocks) < 1:
            raise LiveputError("tiny-gpt: sizes must be positive")


class Embedding(nn.Module):
    """Token and learned position embeddings."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token(tokens) + self.position(positions)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.norm1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        shape = (batch, length, self.num_heads, width // self.num_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Final norm and projection to the vocabulary."""

    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model)
        self.out = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build_tiny_gpt(config: TinyGPTConfig | None = None, seed: int = 0) -> list[nn.Module]:
    """The layers of tiny-gpt, each initialized by :func:`tiny_gpt_init` (without weights while a
    job is built empty: ``liveput.models.lazy``)."""
    config = config or TinyGPTConfig()
    with constructing():
        layers: list[nn.Module] = [Embedding(config)]
        layers += [Block(config) for _ in range(config.num_blocks)]
        layers.append(Head(config))
    if not building_empty():
        initialize_layers(layers, tiny_gpt_init(seed))
    return layers


def tiny_gpt_init(seed: int = 0) -> InitLayer:
    """tiny-gpt's ``init_layer``: PyTorch's defaults, then N(0, 0.02) for every matrix (over
    sqrt(2) for the residual projections), each layer under its own seed."""

    def init(layer: nn.Module) -> None:
        reset_all(layer)
        for name, parameter in layer.named_parameters():
            if parameter.dim() >= 2:
                nn.init.normal_(parameter, std=0.02 / math.sqrt(1 if "proj" not in name else 2))

    return seeded(seed, init)


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
