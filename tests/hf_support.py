"""The small transformers models the tests build (transformers imported as one is first built:
most test processes never need it, and collecting it cost each xdist worker 0.5 s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import transformers


def tied_gpt2_config() -> transformers.GPT2Config:
    """A 2-block GPT-2 of width 32 over 64 tokens, without dropout, whose embeddings are tied
    (GPT-2's default)."""
    import transformers

    return transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=64,
        n_positions=16,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
