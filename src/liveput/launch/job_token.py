"""The job token of a ``liveput train`` run, and where it is kept.

The token signs the run's store and its checkpoints' layer files. It is the one given
(``LIVEPUT_TOKEN``), else the one a local checkpoint folder keeps (a folder trained into again
keeps one token for all its steps), else a fresh one. A local ``--checkpoint-dir`` keeps it in
its ``token`` file (mode 0600, written once the run is assembled: a refused command leaves no
folder behind), where ``liveput export`` finds it for every ``step-<s>`` of the folder. A URL
(an object store) keeps no token beside the files it signs: the run says to give one.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from liveput.objectstore import local_folder
from liveput.runtime.weights import TOKEN_FILE

LOG = logging.getLogger(__name__)


def _local_folder(checkpoint_dir: str | None) -> Path | None:
    return None if checkpoint_dir is None else local_folder(checkpoint_dir)


def run_token(given: str | None, checkpoint_dir: str | None) -> str:
    """The run's job token (module docstring)."""
    if given:
        return given
    folder = _local_folder(checkpoint_dir)
    if folder is not None and (folder / TOKEN_FILE).is_file():
        kept = (folder / TOKEN_FILE).read_text().strip()
        if kept:
            return kept
    if checkpoint_dir is not None and folder is None:
        LOG.warning(
            "train: the checkpoints in %s are signed with a token made for this run; set "
            "LIVEPUT_TOKEN to one you keep to export them later",
            checkpoint_dir,
        )
    return secrets.token_hex(16)


def keep_token(checkpoint_dir: str | None, token: str) -> None:
    """Keep ``token`` in a local checkpoint folder's ``token`` file (mode 0600), unless it holds
    one already."""
    folder = _local_folder(checkpoint_dir)
    if folder is None or (folder / TOKEN_FILE).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(folder / TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
