"""`liveput plan`: one decision of the liveput optimizer, with the alternatives it weighed."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, err_console, print_json, progress
from liveput.cli.params import FLAG
from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.perf import MigrationCostModel, ModelProfile, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.perf.types import ConfigTable

if TYPE_CHECKING:
    from liveput.plan import OptimizerConfig, PlanDecision


def forecast_from_counts(counts: list[int], capacity: int, spread: int) -> Forecast:
    """A distribution around a point forecast: the count, or within +-``spread`` of it
    (triangular weights), with one expected preemption per lost instance."""
    pmf = np.zeros((len(counts), capacity + 1))
    offsets = np.arange(-spread, spread + 1)
    weights = (spread + 1 - np.abs(offsets)).astype(float)
    for step, count in enumerate(counts):
        values = np.clip(count + offsets, 0, capacity)
        np.add.at(pmf[step], values, weights)
    pmf /= pmf.sum(axis=1, keepdims=True)
    points = np.array(counts, dtype=float)
    previous = np.concatenate(([points[0]], points[:-1]))
    drops = np.maximum(previous - points, 0.0)
    return Forecast(points, pmf, drops, np.maximum(points - previous, 0.0), "given")


def _parse_counts(text: str) -> list[int]:
    try:
        counts = [int(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise LiveputError(f"--forecast {text!r} must be comma-separated instance counts") from None
    if any(count < 0 for count in counts):
        raise LiveputError("--forecast counts must be >= 0")
    return counts


def _check_runs(table: ConfigTable, running: Configuration) -> None:
    """Refuse a ``--current`` configuration the model cannot run (memory, layers, batch)."""
    match = (table.data_parallel == running.data_parallel) & (
        table.pipeline_stages == running.pipeline_stages
    )
    if not match.any():
        raise LiveputError(f"--current {running}: not a configuration of {table.model}")
    index = int(np.flatnonzero(match)[0])
    if not table.feasible[index]:
        raise LiveputError(f"--current {running} cannot run {table.model}: {table.reason[index]}")


# The options of `liveput plan` (declared here: the command's signature stays readable).
MODEL = typer.Option("gpt-1.5b", "--model", help="Built-in model or profile .json.")
NODES = typer.Option(..., "--nodes", parser=params.INSTANCES, help="Spot instances available now.")
CURRENT = typer.Option(
    None, "--current", help="Running configuration DxP (omit when nothing runs)."
)
FORECAST = typer.Option(
    ...,
    "--forecast",
    help="Forecast counts of the intervals "
    "after this one (whose count is --nodes), comma-separated: "
    "horizon - 1 values or more (the rest are ignored, and said "
    "so).",
)
HORIZON = typer.Option(12, "--horizon", parser=params.HORIZON, help="Intervals looked ahead.")
INTERVAL = typer.Option(60.0, "--interval", parser=params.SECONDS, help="Interval length, seconds.")
OBJECTIVE = typer.Option("throughput", "--objective", help="throughput or cost.")
ON_DEMAND = typer.Option(
    0, "--on-demand", parser=params.SOME_INSTANCES, help="On-demand instances held."
)
SPREAD = typer.Option(
    1,
    "--spread",
    parser=params.SPREAD,
    help="Uncertainty (+- instances) put around each forecast count.",
)
AS_JSON = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object.")


def _forecast_counts(forecast: str, horizon: int) -> list[int]:
    """The ``--forecast`` counts the horizon uses (too few refused, too many noted and cut)."""
    counts = _parse_counts(forecast)
    if len(counts) < horizon - 1:
        raise LiveputError(
            f"--forecast has {len(counts)} values; horizon {horizon} needs "
            f"{horizon - 1} (the intervals after this one) or more"
        )
    if len(counts) > horizon - 1:
        err_console.print(
            f"note: --forecast has {len(counts)} values; horizon {horizon} "
            f"uses the first {horizon - 1} (the intervals after this one, "
            f"whose count is --nodes) and ignores {len(counts) - horizon + 1}",
            soft_wrap=True,
        )
        counts = counts[: horizon - 1]
    return counts


def _decide(
    profile: ModelProfile,
    running: Configuration | None,
    nodes: int,
    counts: list[int],
    on_demand: int,
    spread: int,
    config: OptimizerConfig,
) -> tuple[ConfigTable, PlanDecision, float]:
    """The table of every configuration, the decision and the milliseconds its solve took."""
    capacity = max([nodes, *counts])
    from liveput.plan import LiveputOptimizer

    with progress() as bar:  # large clusters take seconds per phase
        task = bar.add_task("estimating every configuration", total=3)
        table = estimate_configs(profile, capacity + on_demand)
        if running is not None:
            _check_runs(table, running)
        optimizer = LiveputOptimizer(
            profile, table, MigrationCostModel.from_profile(profile), config
        )
        predicted = forecast_from_counts(counts or [nodes], capacity, spread)
        bar.update(task, advance=1, description="building the optimizer's tables")
        optimizer.decide(running, nodes, predicted, on_demand)  # warm its per-rate cache
        bar.update(task, advance=1, description="deciding")
        start = time.perf_counter()
        decision = optimizer.decide(running, nodes, predicted, on_demand)
        solve_ms = (time.perf_counter() - start) * 1e3
        bar.update(task, advance=1)
    return table, decision, solve_ms


def _as_json(
    decision: PlanDecision, solve_ms: float, runs_now: bool, best_now: tuple[int, int, float] | None
) -> dict[str, object]:
    """The ``--json`` object of a decision."""
    chosen = decision.configuration
    return {
        "decision": None
        if chosen is None
        else {"data_parallel": chosen.data_parallel, "pipeline_stages": chosen.pipeline_stages},
        "migration": decision.migration,
        "migration_s": decision.migration_s,
        "expected_samples": decision.expected_samples,
        "alternatives": [
            {
                "configuration": None if a.configuration is None else str(a.configuration),
                "expected_samples": a.expected_samples,
                "migration": a.migration,
            }
            for a in decision.alternatives
        ],
        "solve_ms": solve_ms,
        "runnable_now": runs_now,
        "best_now": None
        if best_now is None
        else {"data_parallel": best_now[0], "pipeline_stages": best_now[1]},
    }


def _print_decision(
    decision: PlanDecision,
    horizon: int,
    solve_ms: float,
    available: int,
    runs_now: bool,
    best_now: tuple[int, int, float] | None,
) -> None:
    """The decision, its alternatives as a table, and a note when it cannot run yet."""
    chosen = decision.configuration
    console.print(
        f"decision: [bold]{chosen or 'run nothing'}[/] via {decision.migration} "
        f"({decision.migration_s:.1f} s), expected {decision.expected_samples:,.0f} "
        f"samples over {horizon} intervals, solved in {solve_ms:.1f} ms"
    )
    view = Table(title="alternatives for this interval")
    for column in ("configuration", "expected samples", "migration"):
        view.add_column(column)
    for alternative in decision.alternatives:
        view.add_row(
            str(alternative.configuration or "nothing"),
            f"{alternative.expected_samples:,.0f}",
            alternative.migration,
        )
    console.print(view)
    if not runs_now and chosen is not None:
        now = "nothing" if best_now is None else f"{best_now[0]}x{best_now[1]}"
        console.print(
            f"[yellow]note:[/] {chosen} needs {chosen.num_instances} instances and "
            f"{available} are available now; until the forecast ones arrive, "
            f"the best that runs is {now}"
        )


def register(app: typer.Typer) -> None:
    """Add the `plan` command to the root app."""

    @app.command("plan")
    def plan(
        model: str = MODEL,
        nodes: int = NODES,
        current: str | None = CURRENT,
        forecast: str = FORECAST,
        horizon: int = HORIZON,
        interval: float = INTERVAL,
        objective: str = OBJECTIVE,
        on_demand: int = ON_DEMAND,
        spread: int = SPREAD,
        as_json: bool = AS_JSON,
    ) -> None:
        """Decide the configuration for the interval that starts now."""
        counts = _forecast_counts(forecast, horizon)
        running = Configuration.parse(current) if current else None
        if running is not None and running.num_instances > nodes + on_demand:
            raise LiveputError(
                f"--current {running} uses {running.num_instances} instances but "
                f"only {nodes + on_demand} are available"
            )
        profile = load_profile(model)
        # liveput.plan imports scipy: imported on use, so that the CLI starts fast.
        from liveput.plan import OptimizerConfig

        table, decision, solve_ms = _decide(
            profile,
            running,
            nodes,
            counts,
            on_demand,
            spread,
            OptimizerConfig(horizon=horizon, interval_s=interval, objective=objective),
        )
        # The decision is for the interval that starts now: say so when it needs instances the
        # forecast expects but that are not here yet, and what runs on those that are.
        chosen = decision.configuration
        available = nodes + on_demand
        runs_now = chosen is None or chosen.num_instances <= available
        best_now = table.best_for(available)
        if as_json:
            print_json(_as_json(decision, solve_ms, runs_now, best_now))
            return
        _print_decision(decision, horizon, solve_ms, available, runs_now, best_now)
