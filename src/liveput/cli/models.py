"""`liveput models`: the one list of built-in model names, and which commands take each.

Three kinds of name exist because three things differ: a *performance model* (a profile: layer
times and sizes, measured or derived from published figures) is what the estimators, the
optimizer and the advisors reason about; a *job* is a real PyTorch model with its data that the
runtime trains; a *profile target* is a real model the profiler measures into a profile.
"""

from __future__ import annotations

import typer
from rich.table import Table

from liveput.cli.output import console, print_json
from liveput.cli.params import FLAG

PERFORMANCE_COMMANDS = ("perf", "plan", "simulate", "advise slo", "advise pool")
JOB_COMMANDS = ("train", "coordinator", "profile", "perf", "launch", "resume")
"""The commands that take a job, by name or as ``module:function`` (``launch`` and ``resume``
through the job file's ``model:``)."""
PROFILE_COMMANDS = ("profile",)


def model_names() -> dict[str, dict[str, list[str]]]:
    """Built-in names by kind, with the commands that take them."""
    from liveput.models.jobs import JOBS
    from liveput.perf import builtin_model_names
    from liveput.perf.targets import TARGET_NAMES

    return {
        "performance models": {
            "names": builtin_model_names(),
            "commands": list(PERFORMANCE_COMMANDS),
            "or": ["a profile .json written by `liveput profile`"],
        },
        "jobs (trained for real)": {
            "names": sorted(JOBS.names()),
            "commands": list(JOB_COMMANDS),
            "or": ["module:function returning a liveput.Job"],
        },
        "profile targets": {
            "names": sorted(TARGET_NAMES),
            "commands": list(PROFILE_COMMANDS),
            "or": ["module:function returning a liveput.Job or a ProfileTarget"],
        },
    }


def register(app: typer.Typer) -> None:
    """Add the `models` command to the root app."""

    @app.command("models")
    def models(
        as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
    ) -> None:
        """List the built-in model names and the commands that take each kind."""
        names = model_names()
        if as_json:
            print_json(names)
            return
        view = Table(title="built-in models")
        for column in ("kind", "names", "commands", "or"):
            view.add_column(column)
        for kind, entry in names.items():
            view.add_row(
                kind,
                ", ".join(entry["names"]),
                ", ".join(entry["commands"]),
                "; ".join(entry["or"]),
            )
        console.print(view)
