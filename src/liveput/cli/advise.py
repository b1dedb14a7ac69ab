"""`liveput advise ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="advise commands.", no_args_is_help=True)
