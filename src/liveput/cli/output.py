"""Shared rendering helpers of the CLI: JSON to stdout, rich tables and progress to the terminal."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console()
err_console = Console(stderr=True)


class _Display:
    """Whether progress is shown: ``liveput --quiet`` turns it off for every command."""

    quiet = False


def set_quiet(quiet: bool) -> None:
    """Hide (or show) progress displays on stderr; errors and results are unaffected."""
    _Display.quiet = quiet


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(obj: Any) -> str:
    """JSON text of ``obj`` with NumPy values made plain and non-finite floats as null."""
    return json.dumps(_plain(obj), indent=2)


def print_json(obj: Any) -> None:
    """Print one JSON object on stdout (nothing else goes to stdout with ``--json``)."""
    print(to_json(obj))  # noqa: T201 - the CLI's own stdout


def progress(transient: bool = True) -> Progress:
    """A progress bar on stderr, so stdout stays clean for JSON; off with ``--quiet`` and when
    stderr is not a terminal (a log file or a pipe gets no bar frames)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=transient,
        disable=_Display.quiet or not err_console.is_terminal,
    )


def device_counts(devices: dict[str, str]) -> str:
    """``cuda:0 (NVIDIA H100 ...) x 3, cpu x 1`` from instance id -> device (``-``: none)."""
    counts: dict[str, int] = {}
    for device in devices.values():
        counts[device] = counts.get(device, 0) + 1
    return ", ".join(f"{device} x {n}" for device, n in sorted(counts.items())) or "-"
