"""`liveput trace ...`: statistics, generation and plots of availability traces."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, print_json
from liveput.cli.params import FLAG
from liveput.errors import LiveputError
from liveput.files import check_output_file
from liveput.traces import REGIMES, Trace, generate_trace, read_trace, trace_stats, write_trace
from liveput.traces.plot import plot_trace

app = typer.Typer(help="Availability traces: statistics, generation, plots.", no_args_is_help=True)

FORMAT_HELP = "Force the trace format (events, json, csv, text); detected from content by default."
START_HELP = "Keep the trace from this hour on."
END_HELP = "Keep the trace up to this hour."
GENERATED_INTERVAL_S = 60.0
"""The generator's interval: its rates are calibrated per minute, and no trace is shorter."""


def load_trace(
    path: Path,
    fmt: str | None = None,
    start_hour: float | None = None,
    end_hour: float | None = None,
    interval_s: float | None = None,
) -> Trace:
    """Read a trace and slice it to ``[start_hour, end_hour]`` (used by every command); with
    ``interval_s`` (the command's ``--interval``), one that spans less than an interval is
    refused (an empty one is left to the command)."""
    trace = read_trace(path, fmt)
    sliced = start_hour is not None or end_hour is not None
    if sliced:
        start_s = 0.0 if start_hour is None else start_hour * 3600.0
        end_s = None if end_hour is None else end_hour * 3600.0
        trace = trace.slice(start_s, end_s)
    if interval_s is not None and trace.end_s > 0:
        where = " between --start-hour and --end-hour" if sliced else ""
        check_span(trace.end_s, interval_s, f"trace {path}{where}")
    return trace


def check_span(span_s: float, interval_s: float, what: str) -> None:
    """Refuse ``what``, spanning ``span_s`` seconds, when that is less than one ``--interval``
    of ``interval_s``: not one interval of it would be whole."""
    if span_s < interval_s * (1 - 1e-9):
        span = f"{span_s:.4g} s" if span_s < 3600 else f"{span_s / 3600:.4g} h"
        raise LiveputError(
            f"{what} spans {span}, shorter than one --interval ({interval_s:g} s): give a "
            "shorter --interval or a longer span"
        )


@app.command("stats")
def stats(
    trace: Path = typer.Argument(..., help="Trace file (events CSV, count JSON, count CSV, text)."),
    interval: float = typer.Option(
        60.0, "--interval", parser=params.SECONDS, help="Interval length in seconds."
    ),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    start_hour: float | None = typer.Option(
        None, "--start-hour", parser=params.HOUR_OF_TRACE, help=START_HELP
    ),
    end_hour: float | None = typer.Option(
        None, "--end-hour", parser=params.HOUR_OF_TRACE, help=END_HELP
    ),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
) -> None:
    """Print the statistics of a trace (time-weighted mean, preemptions, allocations, ...)."""
    figures = trace_stats(load_trace(trace, fmt, start_hour, end_hour, interval), interval)
    if as_json:
        print_json(figures)
        return
    table = Table(title=f"trace {figures['name']}", show_header=False)
    for key, value in figures.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)


@app.command("generate")
def generate(
    output: Path = typer.Option(
        ..., "-o", "--output", help="File to write (.json: count JSON; otherwise events CSV)."
    ),
    nodes: int = typer.Option(
        32, "--nodes", parser=params.INSTANCES, help="Instances requested (the capacity)."
    ),
    hours: float = typer.Option(
        12.0, "--hours", parser=params.HOURS, help="Length of the trace in hours."
    ),
    seed: int = typer.Option(
        0, "--seed", parser=params.SEED, help="Random seed (same seed, same trace)."
    ),
    regime: str = typer.Option(
        "default", "--regime", help=f"Market regime: {', '.join(REGIMES.names())}."
    ),
) -> None:
    """Generate a synthetic trace calibrated to measured AWS spot traces."""
    if hours * 3600.0 < GENERATED_INTERVAL_S:
        raise LiveputError(
            f"trace generate: --hours {hours:g} is shorter than one interval of the generated "
            f"trace ({GENERATED_INTERVAL_S:g} s = {GENERATED_INTERVAL_S / 3600:.4g} h)"
        )
    check_output_file(output)
    trace = generate_trace(nodes, hours, seed, regime, GENERATED_INTERVAL_S)
    write_trace(trace, output)
    console.print(f"wrote {output} ({trace.hours:.1f} h, {int(trace.removed.sum())} preemptions)")


@app.command("plot")
def plot(
    trace: Path = typer.Argument(..., help="Trace file."),
    output: Path = typer.Option(..., "-o", "--output", help="PNG file to write."),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    start_hour: float | None = typer.Option(
        None, "--start-hour", parser=params.HOUR_OF_TRACE, help=START_HELP
    ),
    end_hour: float | None = typer.Option(
        None, "--end-hour", parser=params.HOUR_OF_TRACE, help=END_HELP
    ),
) -> None:
    """Plot available instances over time with preemption and allocation marks."""
    check_output_file(output, ".png")
    plot_trace(load_trace(trace, fmt, start_hour, end_hour), output)
    console.print(f"wrote {output}")
