"""A job that holds one instance inside a step on cue, so a fault lands mid-step for sure.

:func:`pausing_job` is :func:`~liveput.testbed.cluster.chaos_job` whose sample loader, once the
directory named by ``LIVEPUT_PAUSE_DIR`` holds ``arm``, makes the first instance that loads a
sample claim ``paused`` (its pid and the Unix time, as JSON) and wait there, inside its step's
forward pass, until ``go`` appears. Its peers meanwhile go on into the step's collectives and
block on it: the state a frozen or cut-off instance leaves a real job in. The fault itself (a
SIGSTOP, a link taken down) is the test's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from liveput.models.job import Job

__all__ = ["PAUSE_DIR_ENV", "PAUSING_JOB", "pausing_job", "read_paused"]

PAUSE_DIR_ENV = "LIVEPUT_PAUSE_DIR"
"""Environment variable naming the pause directory (``arm``, ``paused``, ``go``)."""
PAUSING_JOB = "liveput.testbed.pause:pausing_job"
"""The job, as agents resolve it (``module:function``)."""
_LONGEST_PAUSE_S = 120.0
"""A pause ends by itself after this long, so a test that fails before ``go`` hangs nobody."""


def _hold_if_cued(directory: Path) -> None:
    if not (directory / "arm").exists():
        return
    try:
        descriptor = os.open(directory / "paused", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # another instance holds (or held) the pause: one per run
    with os.fdopen(descriptor, "w") as claim:
        claim.write(json.dumps({"pid": os.getpid(), "unix_s": time.time()}))
    deadline = time.monotonic() + _LONGEST_PAUSE_S
    while not (directory / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def pausing_job() -> Job:
    """:func:`~liveput.testbed.cluster.chaos_job` with the cued pause in its sample loader."""
    import torch

    from liveput.testbed.cluster import chaos_job

    job = chaos_job()
    inner = job.dataset
    assert isinstance(inner, Sized)  # tiny-gpt-small's windows
    num_windows = len(inner)
    directory = Path(os.environ.get(PAUSE_DIR_ENV, ""))

    class PausingWindows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return num_windows

        def __getitem__(self, index: int) -> Any:
            if directory.name:
                _hold_if_cued(directory)
            return inner[index]

    job.dataset = PausingWindows()
    return job


def read_paused(directory: Path) -> dict | None:
    """The claim of the paused instance (``pid``, ``unix_s``), None before one paused."""
    try:
        text = (directory / "paused").read_text()
    except FileNotFoundError:
        return None
    return json.loads(text) if text else None
