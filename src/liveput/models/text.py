"""A text dataset from a local file: plain text, or a column of an Arrow or Parquet table.

The text is tokenized once, when the dataset is made, by a byte-level tokenizer (token = byte,
256 tokens) or by a ``tokenizer.json`` given as a path (a Hugging Face ``tokenizers`` file:
nothing is fetched at run time). Samples are windows of the token stream indexed as
:class:`~liveput.models.corpus.ByteWindows` indexes them: sample ``i`` is always the same window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from liveput.errors import LiveputError
from liveput.models.corpus import ByteWindows
from liveput.models.extras import require

BYTE = "byte"
"""The byte-level tokenizer's name."""
ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
"""Suffixes read as Arrow IPC (file or stream format)."""
PARQUET_SUFFIXES = (".parquet", ".pq")
"""Suffixes read as Parquet."""


def read_texts(path: str | Path, column: str = "text") -> list[str]:
    """The texts of ``path``: the whole file for plain text, else each row of ``column``."""
    path = Path(path)
    if not path.is_file():
        raise LiveputError(f"text dataset {path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in ARROW_SUFFIXES + PARQUET_SUFFIXES:
        try:
            return [path.read_text(encoding="utf-8", errors="replace")]
        except OSError as error:
            raise LiveputError(f"text dataset {path}: {error.strerror}") from None
    table = _read_table(path, suffix)
    if column not in table.column_names:
        raise LiveputError(
            f"text dataset {path}: no column {column!r} (columns: "
            f"{', '.join(table.column_names) or 'none'})"
        )
    values = table.column(column).to_pylist()
    if any(value is not None and not isinstance(value, str) for value in values):
        raise LiveputError(f"text dataset {path}: column {column!r} is not text")
    return [value for value in values if value]


def _read_table(path: Path, suffix: str) -> Any:  # a pyarrow.Table
    pyarrow = require("pyarrow", f"reading {path}")
    try:
        if suffix in PARQUET_SUFFIXES:
            return require("pyarrow.parquet", f"reading {path}").read_table(path)
        ipc = require("pyarrow.ipc", f"reading {path}")
        try:
            return ipc.open_file(path).read_all()
        except pyarrow.ArrowInvalid:  # Hugging Face datasets write the stream format
            return ipc.open_stream(path).read_all()
    except (pyarrow.ArrowException, OSError) as error:
        raise LiveputError(
            f"text dataset {path}: not a readable {suffix.lstrip('.')} file ({error})"
        ) from None


class Tokenizer:
    """Byte-level, or a ``tokenizers`` JSON file."""

    def __init__(self, spec: str | Path = BYTE) -> None:
        self.spec = str(spec)
        self._inner = None
        if self.spec == BYTE:
            self.vocab_size = 256
            return
        path = Path(spec)
        if not path.is_file():
            raise LiveputError(f"tokenizer {path}: no such file (give 'byte' or a tokenizer.json)")
        tokenizers = require("tokenizers", f"the tokenizer {path}")
        try:
            self._inner = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # noqa: BLE001 - the library raises bare Exceptions
            raise LiveputError(f"tokenizer {path}: not a tokenizer.json ({error})") from None
        self.vocab_size = int(self._inner.get_vocab_size(with_added_tokens=True))

    def encode(self, texts: list[str]) -> np.ndarray:
        """The concatenated token ids of ``texts`` (int64)."""
        if self._inner is None:
            return np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8).astype(np.int64)
        encoded = self._inner.encode_batch(texts, add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)


class TextDataset(ByteWindows):
    """Windows of ``seq_len + 1`` tokens of the file at ``path`` (input = first ``seq_len``,
    target = last ``seq_len``)."""

    def __init__(
        self,
        path: str | Path,
        tokenizer: str | Path = BYTE,
        seq_len: int = 128,
        column: str = "text",
        seed: int = 0,
    ) -> None:
        if seq_len < 1:
            raise LiveputError(f"text dataset: seq_len must be >= 1, got {seq_len}")
        self.path = str(path)
        self.tokenizer = Tokenizer(tokenizer)
        tokens = self.tokenizer.encode(read_texts(path, column))
        if len(tokens) <= seq_len + 1:
            raise LiveputError(
                f"text dataset {path}: {len(tokens)} tokens, fewer than one sample of {seq_len + 1}"
            )
        super().__init__(tokens, seq_len, seed)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size
