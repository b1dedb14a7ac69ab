"""`liveput predict ...`: walk-forward backtests and plots of the availability predictors."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, print_json, progress
from liveput.cli.params import FLAG
from liveput.cli.trace import END_HELP, FORMAT_HELP, START_HELP, load_trace
from liveput.files import check_output_file
from liveput.forecast import DEFAULT_PREDICTOR, PREDICTORS
from liveput.forecast.backtest import (
    BASELINE,
    backtest,
    backtest_summary,
    check_backtest,
    walk_forward,
)
from liveput.forecast.plot import plot_forecasts

app = typer.Typer(help="Availability forecasts: backtests and plots.", no_args_is_help=True)

METHODS_HELP = "Comma-separated predictors to score (default: all registered)."


def _methods(text: str | None) -> list[str]:
    names = PREDICTORS.names() if not text else [m.strip() for m in text.split(",") if m.strip()]
    for name in names:
        PREDICTORS.get(name)  # one-line error for an unknown name
    # The ratio to persistence needs persistence scored in the same walk.
    return [BASELINE, *[n for n in names if n != BASELINE]]


@app.command("backtest")
def backtest_command(
    trace: Path = typer.Argument(..., help="Trace file (events CSV, count JSON, count CSV, text)."),
    horizon: int = typer.Option(
        12, "--horizon", parser=params.HORIZON, help="Steps forecast ahead (H)."
    ),
    interval: float = typer.Option(
        60.0, "--interval", parser=params.SECONDS, help="Interval length in seconds."
    ),
    methods: str | None = typer.Option(None, "--methods", parser=params.NAMES, help=METHODS_HELP),
    warmup: int = typer.Option(
        60, "--warmup", parser=params.WARMUP, help="Intervals of history before the first forecast."
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
    """Walk forward over a trace, forecasting at every interval; score each predictor."""
    names = _methods(methods)
    series = load_trace(trace, fmt, start_hour, end_hour, interval).resample(interval)
    check_backtest(series, horizon, warmup)
    steps = len(series) - 1 - warmup
    with progress() as bar:
        task = bar.add_task("backtest", total=steps * len(names))
        scores = backtest(series, names, horizon, warmup, on_step=lambda: bar.advance(task))
    summary = backtest_summary(scores, interval, horizon, DEFAULT_PREDICTOR)
    if as_json:
        print_json(summary)
        return
    table = Table(
        title=f"walk-forward backtest of {series.name} ({len(series)} intervals of "
        f"{interval:g} s, horizon {horizon})"
    )
    for column in (
        "method",
        "MAE mean",
        "vs persistence",
        "CRPS mean",
        "vs persistence",
        "MAE h=1",
        f"MAE h={horizon}",
        "ms/forecast",
    ):
        table.add_column(column, justify="left" if column == "method" else "right")
    for name, entry in summary["methods"].items():
        table.add_row(
            name + (" (default)" if name == DEFAULT_PREDICTOR else ""),
            f"{entry['mae_mean']:.4f}",
            f"{entry['mae_ratio_to_persistence']:.3f}",
            f"{entry['crps_mean']:.4f}",
            f"{entry['crps_ratio_to_persistence']:.3f}",
            f"{entry['mae'][0]:.3f}",
            f"{entry['mae'][-1]:.3f}",
            f"{entry['ms_per_forecast']:.2f}",
        )
    console.print(table)


@app.command("plot")
def plot_command(
    trace: Path = typer.Argument(..., help="Trace file."),
    output: Path = typer.Option(..., "-o", "--output", help="PNG file to write."),
    method: str = typer.Option(DEFAULT_PREDICTOR, "--method", help="Predictor to plot."),
    horizon: int = typer.Option(
        12, "--horizon", parser=params.HORIZON, help="Steps forecast ahead (H)."
    ),
    interval: float = typer.Option(
        60.0, "--interval", parser=params.SECONDS, help="Interval length in seconds."
    ),
    warmup: int = typer.Option(
        60, "--warmup", parser=params.WARMUP, help="Intervals of history before the first forecast."
    ),
    fmt: str | None = typer.Option(None, "--format", help=FORMAT_HELP),
    start_hour: float | None = typer.Option(
        None, "--start-hour", parser=params.HOUR_OF_TRACE, help=START_HELP
    ),
    end_hour: float | None = typer.Option(
        None, "--end-hour", parser=params.HOUR_OF_TRACE, help=END_HELP
    ),
) -> None:
    """Plot the h-step forecasts with their 10-90% interval against the true count."""
    check_output_file(output, ".png")
    PREDICTORS.get(method)
    series = load_trace(trace, fmt, start_hour, end_hour, interval).resample(interval)
    check_backtest(series, horizon, warmup)
    steps = len(series) - 1 - warmup
    with progress() as bar:
        task = bar.add_task(f"forecast ({method})", total=steps)
        walk = walk_forward(series, method, horizon, warmup, on_step=lambda: bar.advance(task))
    plot_forecasts(series, walk, output)
    console.print(f"wrote {output}")
