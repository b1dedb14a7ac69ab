"""`liveput train` command."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the `train` command to the root app (filled in by its issue)."""
