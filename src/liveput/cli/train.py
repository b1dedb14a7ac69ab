"""`liveput train`: coordinator, agents and an emulated cloud on this machine."""

from __future__ import annotations

import typer

from liveput.cli import agent as agent_commands


def register(app: typer.Typer) -> None:
    """Add `train`, `agent` and `coordinator` to the root app."""
    agent_commands.register(app)
