"""The ``liveput`` command: one sub-app per command group, errors as one line and exit code 2."""

from __future__ import annotations

import logging
import sys

import typer

from liveput.cli import advise, perf, plan, predict, profile, simulate, trace, train
from liveput.errors import LiveputError

app = typer.Typer(
    name="liveput",
    help="Train DNNs cheaply and fast on spot instances: forecast availability, optimize liveput.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(trace.app, name="trace")
app.add_typer(predict.app, name="predict")
app.add_typer(advise.app, name="advise")
perf.register(app)
profile.register(app)
plan.register(app)
simulate.register(app)
train.register(app)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        # Not standalone, click returns a command's typer.Exit code instead of raising it.
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int):
            return code
    except LiveputError as error:
        typer.echo(f"error: {error}", err=True)
        return 2
    except FileNotFoundError as error:
        typer.echo(f"error: {error.filename}: no such file", err=True)
        return 2
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", getattr(done, "code", 0))
        return int(code or 0)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 1
    except Exception as error:
        # Usage errors of typer's (vendored) click carry their own message and exit code.
        if callable(getattr(error, "show", None)) and isinstance(getattr(error, "exit_code", None), int):
            error.show()
            return error.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
