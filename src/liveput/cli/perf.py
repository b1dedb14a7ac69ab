"""`liveput perf` command."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `perf` command to the root app (filled in by its issue)."""
