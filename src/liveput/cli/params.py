"""Command-line values checked when they are parsed: the one validation layer of every command.

Each checker is a typer ``parser``: it turns the text of an option into a number or refuses it
with :class:`typer.BadParameter`, which :func:`liveput.cli.main.main` prints as one line with the
option's name (exit code 2). Numbers must be finite (``nan`` and ``inf`` are refused everywhere)
and within the range the option documents; a value that is already a number (an option's
default) passes through the same check. A comma-separated list must name one item or more.

Ranges are about plausibility, not hardware: a trace longer than :data:`MAX_HOURS` or a cluster
larger than :data:`MAX_INSTANCES` is refused in one line instead of running for hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

import typer

from liveput.errors import LiveputError

MAX_HOURS = 24.0 * 366
"""Longest span of time any command models (a year), hours."""
MAX_INSTANCES = 100_000
"""Most instances any command models."""
MAX_SEED = 2**32 - 1
"""Largest seed (NumPy seeds are 32-bit words)."""

Parser = Callable[[object], float]


def _figure(value: float) -> str:
    return f"{int(value)}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:g}"


def _bounds(low: float | None, high: float | None, low_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{_figure(low)}, {_figure(high)}]"
    if low is not None:
        return f"{'>' if low_open else '>='} {_figure(low)}"
    assert high is not None  # a bounded parameter has a low or a high bound
    return f"<= {_figure(high)}"


def number(
    low: float | None = None, high: float | None = None, *, low_open: bool = False
) -> Parser:
    """A finite float within ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(value: object) -> float:
        try:
            number_ = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(number_):
            raise typer.BadParameter(f"must be a finite number, got {value}")
        below = low is not None and (number_ <= low if low_open else number_ < low)
        if below or (high is not None and number_ > high):
            raise typer.BadParameter(f"must be {_bounds(low, high, low_open)}, got {value}")
        return number_

    return parse


def integer(low: int | None = None, high: int | None = None) -> Callable[[object], int]:
    """A whole number within ``[low, high]`` (``3.0`` is 3; ``3.5`` is refused)."""

    def parse(value: object) -> int:
        text = str(value).strip()
        try:
            whole = int(text)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                raise typer.BadParameter(f"{value!r} is not a whole number") from None
            if not math.isfinite(as_float) or as_float != int(as_float):
                raise typer.BadParameter(f"{value!r} is not a whole number") from None
            whole = int(as_float)
        if (low is not None and whole < low) or (high is not None and whole > high):
            raise typer.BadParameter(f"must be {_bounds(low, high, False)}, got {value}")
        return whole

    return parse


def optional(parse: Parser) -> Parser:
    """``parse``, letting an absent option (None) through."""
    return lambda value: None if value is None else parse(value)  # type: ignore[return-value]


def comma_list(what: str) -> Callable[[object], str | None]:
    """A comma-separated list of one ``what`` or more (blanks around the items and empty items
    dropped); an option that names none (``""``, ``","``) is refused; None (not given) passes."""

    def parse(value: object) -> str | None:
        if value is None:
            return None
        items = [item.strip() for item in str(value).split(",") if item.strip()]
        if not items:
            raise typer.BadParameter(f"empty; give one or more comma-separated {what}")
        return ",".join(items)

    return parse


POSITIVE = number(0.0, low_open=True)
"""A finite number > 0."""
NON_NEGATIVE = number(0.0)
"""A finite number >= 0."""
SECONDS = number(1e-3, 86_400.0 * 366)
"""An interval or timeout, seconds: at least a millisecond, at most a year."""
HOURS = number(0.0, MAX_HOURS, low_open=True)
"""A span of time, hours."""
HOUR_OF_TRACE = optional(number(0.0, MAX_HOURS))
"""A point in a trace (``--start-hour``, ``--end-hour``), hours from its start."""
PRICE = number(0.0, 1e4)
"""A price, $ per instance-hour."""
OPTIONAL_PRICE = optional(PRICE)
SEED = integer(0, MAX_SEED)
"""A random seed."""
INSTANCES = integer(1, MAX_INSTANCES)
"""A number of instances (at least one)."""
SOME_INSTANCES = integer(0, MAX_INSTANCES)
"""A number of instances that may be zero (on-demand ones held besides spot ones)."""
HORIZON = integer(1, 10_000)
"""Intervals looked ahead."""
STEPS = integer(1, 100_000_000)
"""Training steps."""
NON_NEGATIVE_SECONDS = number(0.0, 86_400.0 * 366)
"""A lead or a grace, seconds (0: none)."""


def notice_margin(value: object) -> float | None:
    """``--notice-margin``: seconds, or ``auto`` (None: from the moves the job measures)."""
    if str(value).strip().lower() == "auto":
        return None
    return NON_NEGATIVE_SECONDS(value)


PRICE_POSITIVE = number(0.0, 1e6, low_open=True)
"""A budget, $ per hour."""
WARMUP = integer(0, 10_000_000)
"""Intervals of history before the first forecast."""
SPREAD = integer(0, MAX_INSTANCES)
"""Uncertainty around a forecast, +- instances."""
MICRO_BATCH = integer(1, 1_000_000)
"""Samples per micro-batch."""
REPEATS = integer(1, 10_000)
"""Timed passes."""
CHECKPOINT_EVERY = integer(0, 100_000_000)
"""Steps between checkpoints (0: none)."""
KEEP = integer(1, 1_000)
"""Checkpoints kept."""
TIME_SCALE = number(0.0, 1e4, low_open=True)
"""Trace seconds per wall second."""
SAMPLES = number(0.0, 1e15, low_open=True)
"""A number of training samples."""
LOSS = number(0.0, 1e6, low_open=True)
"""A training loss to reach."""
GIGABYTES = number(0.0, 1e5)
"""A size, GB."""
OPTIONAL_HOURS = optional(HOURS)
"""Hours > 0, or unset."""
OPTIONAL_STEPS = optional(STEPS)
"""Training steps >= 1, or unset."""
OPTIONAL_SAMPLES = optional(SAMPLES)
"""Samples > 0, or unset."""
OPTIONAL_PRICE_POSITIVE = optional(PRICE_POSITIVE)
"""Dollars > 0, or unset."""
OPTIONAL_SOME_INSTANCES = optional(SOME_INSTANCES)
"""Instances >= 0, or unset."""
OPTIONAL_MEMORY_GB = optional(number(0.0, 1e5, low_open=True))
"""Memory per instance, GB > 0, or unset."""
NAMES = comma_list("names")
"""Names (policies, predictors, models), comma-separated."""
INSTANCE_TYPES = comma_list("instance types")
"""Catalog instance types, comma-separated."""
NUMBERS = comma_list("numbers")
"""Numbers, comma-separated (each is checked where it is read)."""
FLAG = ""
"""Metavar of an on/off flag: it takes no value, so help shows none (not ``<bool>``)."""

# Options that several commands share, as ``Annotated`` aliases: a command's parameter is then
# one line (``model: params.Model = "tiny-gpt"``); the default stays in the signature.
Model = Annotated[str, typer.Option("--model", help="Built-in job or module:function.")]
Token = Annotated[str | None, typer.Option("--token", help="Job token (or LIVEPUT_TOKEN).")]
NoticeMargin = Annotated[
    float | None,
    typer.Option(
        "--notice-margin",
        parser=notice_margin,
        metavar="S|auto",
        help="Wall seconds before a noticed instance's announced end at which the job moves "
        "off it (it trains until then); must cover the move. auto (the default): twice the "
        "move as this run measured it (until then, as predicted from the links), at least 2 s.",
    ),
]
DeadlinePolicy = Annotated[
    str,
    typer.Option(
        "--deadline-policy",
        help="Deadline policy (with --deadline-hours): liveput, uniform-progress, greedy, "
        "on-demand or spot-only.",
    ),
]
InstanceMemory = Annotated[
    float | None,
    typer.Option(
        "--instance-memory-gb",
        parser=OPTIONAL_MEMORY_GB,
        help="Memory budget per instance, GB, in place of the profiled device's: only "
        "configurations whose every stage (weights, gradients, optimizer state, activations "
        "in flight) fits it are planned, and an agent refuses a stage over it (default: the "
        "device's memory).",
    ),
]


def store_url(value: object) -> str | None:
    """``--store``: a URL a store opens at (checked before anything starts), or None."""
    if value is None:
        return None
    from liveput.runtime.store.opening import check_store_url

    try:
        return check_store_url(str(value))
    except LiveputError as error:
        raise typer.BadParameter(str(error)) from None


def required_token(token: str | None) -> str:
    """``--token``, else ``LIVEPUT_TOKEN``; a one-line error when neither is given."""
    import os

    token = token or os.environ.get("LIVEPUT_TOKEN")
    if not token:
        raise LiveputError("a job token is required: --token or LIVEPUT_TOKEN")
    return token
