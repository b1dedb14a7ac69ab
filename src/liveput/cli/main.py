"""The ``liveput`` command: one sub-app per command group, errors as one line and exit code 2."""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer

from liveput.cli import (
    advise,
    export,
    models,
    operate,
    perf,
    plan,
    predict,
    profile,
    simulate,
    trace,
    train,
)
from liveput.cli.output import set_quiet
from liveput.cli.params import FLAG
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
models.register(app)
perf.register(app)
profile.register(app)
plan.register(app)
simulate.register(app)
train.register(app)
operate.register(app)
export.register(app)


@app.callback()
def _root(
    verbose: bool = typer.Option(
        False, "--verbose", "-v", metavar=FLAG, help="Log progress details to stderr."
    ),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        metavar=FLAG,
        help="No progress bars on stderr (they are off anyway when stderr is not a terminal).",
    ),
) -> None:
    set_quiet(quiet)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        # Not standalone, click returns a command's typer.Exit code instead of raising it.
        code = _command()(args=argv, prog_name="liveput", standalone_mode=False)
        if isinstance(code, int):
            return code
    except LiveputError as error:
        return _refuse(str(error))
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", getattr(done, "code", 0))
        return int(code or 0)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 1
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        return 130
    except MemoryError:
        return _refuse(
            "out of memory: the input asks for more than this machine has (a smaller "
            "trace span, instance count or horizon needs less)"
        )
    except UnicodeDecodeError:
        return _refuse("an input file is not a text file")
    except OSError as error:
        # A path that is a directory, not writable, or missing, found while the work ran.
        where = f"{error.filename}: " if error.filename else ""
        return _refuse(f"{where}{(error.strerror or str(error)).lower()}")
    except Exception as error:
        # Usage errors of typer's (vendored) click: one line with the option and the command.
        exit_code = getattr(error, "exit_code", None)
        if callable(getattr(error, "format_message", None)) and isinstance(exit_code, int):
            return _refuse(_usage_line(error), exit_code)
        raise
    return 0


def _command() -> Any:
    """The click command of ``app``, with every ``--help`` shown as the flag it is (typer shows
    a ``<bool>`` value for it); click caches each command's help option, so setting it once
    holds."""
    root = typer.main.get_command(app)
    pending = [root]
    while pending:
        command = pending.pop()
        option = command.get_help_option(typer.Context(command))
        if option is not None:
            option.metavar = FLAG
        pending.extend(getattr(command, "commands", {}).values())
    return root


def _usage_line(error: Exception) -> str:
    """``train: --time-scale: must be ... (see liveput train --help)``."""
    context = getattr(error, "ctx", None)
    path = context.command_path if context is not None else "liveput"
    command = path.removeprefix("liveput").strip()
    param = getattr(error, "param", None)
    opts = getattr(param, "opts", None)
    detail = str(getattr(error, "message", "") or "")
    if opts and detail:  # a bad value: the option and what is wrong with it
        message = f"{max(opts, key=len)}: {detail}"
    else:
        message = error.format_message()  # type: ignore[attr-defined]
    message = message[:1].lower() + message[1:]
    return f"{command + ': ' if command else ''}{message} (see {path} --help)"


def _refuse(message: str, code: int = 2) -> int:
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
