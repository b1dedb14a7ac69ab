"""`liveput simulate --sweep`: the models x traces x policies matrix, or one deadline job's
deadlines x seeds x traces, each with its table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.table import Table

from liveput.cli.output import console, progress
from liveput.cli.simulate_io import emit, load_intervals, parse_names
from liveput.errors import LiveputError
from liveput.perf import load_profile
from liveput.policies.objective import JobObjective
from liveput.sim import SimulationConfig, default_trace
from liveput.sim.engine import DEFAULT_MODEL
from liveput.sim.sweep import (
    SWEEP_FACTORS,
    SWEEP_MODELS,
    DeadlineSweepRow,
    SweepRow,
    deadline_sweep,
    default_sweep_traces,
    sweep,
)
from liveput.traces import IntervalTrace

SWEEP_SEEDS = 3
"""Seeds of a deadline sweep: ``--seed`` and the next ones."""


def _fraction(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _run_sweep(
    traces: list[IntervalTrace],
    models: list[str],
    policies: list[str],
    config: SimulationConfig,
    output: Path | None,
    as_json: bool,
) -> None:
    with progress() as bar:
        task = bar.add_task("sweep", total=len(models) * len(traces))
        rows = sweep(
            models,
            traces,
            policies,
            config,
            on_cell=lambda model, trace: bar.update(
                task, advance=1, description=f"{model} on {trace}"
            ),
        )
    if not as_json:
        _print_sweep(rows)
    emit({"interval_s": config.interval_s, "rows": [row.__dict__ for row in rows]}, output, as_json)


def _print_sweep(rows: list[SweepRow]) -> None:
    view = Table(title="samples relative to reactive and to ideal")
    for column in ("model", "trace", "policy", "samples", "x reactive", "of ideal", "$ / 1k"):
        view.add_column(
            column,
            justify="left" if column in ("model", "trace", "policy") else "right",
            no_wrap=column != "trace",
        )
    for index, row in enumerate(rows):
        last = index + 1 == len(rows) or (rows[index + 1].model, rows[index + 1].trace) != (
            row.model,
            row.trace,
        )
        view.add_row(
            row.model,
            row.trace.removeprefix("generated-"),
            row.policy,
            f"{row.samples:,.0f}",
            _fraction(row.vs_reactive, 2),
            _fraction(row.vs_ideal),
            "-" if row.samples <= 0 else f"{row.cost_usd / row.samples * 1000:.3f}",
            end_section=last,
        )
    console.print(view)


def _run_deadline_sweep(
    traces: list[IntervalTrace],
    model: str,
    objective: JobObjective,
    policies: list[str],
    config: SimulationConfig,
    output: Path | None,
    as_json: bool,
) -> None:
    """Deadlines of 1.1x to 2x the all-on-demand time, three seeds, every trace."""
    profile = load_profile(model)
    seeds = tuple(range(config.seed, config.seed + SWEEP_SEEDS))
    with progress() as bar:
        task = bar.add_task("sweep", total=len(traces) * len(SWEEP_FACTORS) * len(seeds))
        rows = deadline_sweep(
            traces,
            profile,
            objective,
            SWEEP_FACTORS,
            seeds,
            policies,
            config,
            on_cell=lambda trace, factor, seed: bar.update(
                task, advance=1, description=f"{trace} x{factor:g} seed {seed}"
            ),
        )
    if not as_json:
        _print_deadline_sweep(rows, policies)
    emit(
        {"interval_s": config.interval_s, "rows": [dataclasses.asdict(r) for r in rows]},
        output,
        as_json,
    )


def sweep_cells(
    rows: list[DeadlineSweepRow],
    policies: list[str],
) -> list[tuple[str, float, float, list[str]]]:
    """(trace, factor, deadline hours, one cell per policy: mean dollars and deadlines met)."""
    cells = []
    for trace, factor in dict.fromkeys((row.trace, row.factor) for row in rows):
        mine = [row for row in rows if row.trace == trace and row.factor == factor]
        line = []
        for name in policies:
            runs = [row for row in mine if row.policy == name]
            if not runs:
                raise LiveputError(f"sweep has no run of {name}")
            usd = sum(row.usd for row in runs) / len(runs)
            met = sum(row.deadline_met for row in runs)
            line.append(f"{usd:,.0f} ({met}/{len(runs)})")
        cells.append((trace, factor, mine[0].deadline_hours, line))
    return cells


def _print_deadline_sweep(rows: list[DeadlineSweepRow], policies: list[str]) -> None:
    view = Table(
        title="mean dollars (deadlines met / seeds) by deadline, as a multiple of the "
        "all-on-demand time"
    )
    for column in ("trace", "deadline", *policies):
        view.add_column(
            column, justify="left" if column == "trace" else "right", no_wrap=column != "trace"
        )
    for trace, factor, hours, line in sweep_cells(rows, policies):
        view.add_row(trace.removeprefix("generated-"), f"{factor:g}x ({hours:.1f} h)", *line)
    console.print(view)


def simulate_sweeps(
    traces: list[Path] | None,
    model: str,
    names: list[str],
    config: SimulationConfig,
    start_hour: float | None,
    end_hour: float | None,
    output: Path | None,
    as_json: bool,
    job: JobObjective | None,
) -> None:
    """``--sweep``: models x traces x policies, or a job's deadlines x seeds x traces."""
    interval_s = config.interval_s
    if job is not None:
        if model != DEFAULT_MODEL and "," in model:
            raise LiveputError("a deadline sweep takes one --model")
        loaded = (
            [load_intervals(path, interval_s, start_hour, end_hour) for path in traces]
            if traces
            else [default_trace(interval_s)]
        )
        _run_deadline_sweep(loaded, model, job, names, config, output, as_json)
        return
    loaded = (
        [load_intervals(path, interval_s, start_hour, end_hour) for path in traces]
        if traces
        else default_sweep_traces(interval_s)
    )
    models = parse_names(model, "model") if model != DEFAULT_MODEL else list(SWEEP_MODELS)
    _run_sweep(loaded, models, names, config, output, as_json)
