"""``liveput train``'s scratch folder (its notices, and its checkpoints unless it is given a
folder for them), and what killed runs left of theirs.

A run removes its folder as it ends, however it ends but one: a SIGKILLed ``train`` left it in
the temporary folder, checkpoints and all. Each folder's name carries its creator's pid
(``liveput-train-<pid>-<random>``), and a run starting removes those whose creator no longer runs
(a pid of another PID namespace sharing the temporary folder would look dead: not a set-up this
supports). Folders of the older name, without a pid, are left alone: nothing tells whose they are.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from liveput.runtime.store.etcd_server import pid_alive

LOG = logging.getLogger(__name__)

PREFIX = "liveput-train-"
_NAME = re.compile(rf"^{re.escape(PREFIX)}(\d+)-")


def remove_stale_scratch(folder: Path | None = None) -> list[Path]:
    """Delete the scratch folders in ``folder`` (None: the temporary folder) whose creator no
    longer runs; the ones deleted."""
    parent = Path(folder or tempfile.gettempdir())
    removed = []
    for path in sorted(parent.glob(f"{PREFIX}*")):
        match = _NAME.match(path.name)
        if match is None or not path.is_dir() or pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    if removed:
        LOG.info("removed %d scratch folder(s) of killed runs in %s", len(removed), parent)
    return removed


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    """This run's scratch folder (removed as it ends), once killed runs' are gone."""
    remove_stale_scratch()
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-")
