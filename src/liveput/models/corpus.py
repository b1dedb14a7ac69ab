"""A text corpus present on every machine: the Python standard library's own source, as bytes.

Samples are indexed deterministically (sample ``i`` is always the same window), so the global batch
of a step is the same whatever configuration trains it.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch

from liveput.errors import LiveputError


def load_stdlib_corpus(max_bytes: int = 4_000_000) -> np.ndarray:
    """Bytes of the standard library's ``.py`` files, in a fixed order, up to ``max_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total == 0:
        raise LiveputError(f"no Python sources found under {root} for the corpus")
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


class ByteWindows(torch.utils.data.Dataset):
    """Sample ``i``: ``seq_len + 1`` consecutive bytes at a position fixed by ``i`` and ``seed``
    (input = first ``seq_len``, target = last ``seq_len``)."""

    def __init__(self, corpus: np.ndarray, seq_len: int, seed: int = 0) -> None:
        if len(corpus) <= seq_len + 1:
            raise LiveputError(f"corpus of {len(corpus)} bytes is shorter than one sample")
        self.corpus = torch.from_numpy(corpus.astype(np.int64))
        self.seq_len = seq_len
        self.num_positions = len(corpus) - seq_len - 1
        self.seed = seed

    def __len__(self) -> int:
        return self.num_positions

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # A multiplicative hash spreads consecutive indices over the corpus.
        start = (index * 2_654_435_761 + self.seed * 97) % self.num_positions
        window = self.corpus[start : start + self.seq_len + 1]
        return window[:-1], window[1:]
