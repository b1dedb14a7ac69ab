"""`liveput simulate --deadline-hours H --steps S`: the deadline policies on one job (a table or
``--json``, a JSON file, a report), or ``--sweep`` over deadlines and seeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.table import Table

from liveput.cli.output import console, err_console, print_json, progress, to_json
from liveput.errors import LiveputError
from liveput.files import write_text_atomic
from liveput.perf import load_profile
from liveput.policies.objective import JobObjective
from liveput.sim import SimulationConfig
from liveput.sim.deadline import simulate_deadline
from liveput.sim.deadline_sweep import SWEEP_FACTORS, DeadlineSweepRow, deadline_sweep
from liveput.traces import IntervalTrace

SWEEP_SEEDS = 3
"""Seeds of a deadline sweep: ``--seed`` and the next ones."""


def _emit(summary: dict, output: Path | None, as_json: bool) -> None:
    if output is not None:
        write_text_atomic(output, to_json(summary) + "\n")
        err_console.print(f"wrote {output}")
    if as_json:
        print_json(summary)


def run_deadline(trace: IntervalTrace, model: str, objective: JobObjective, policies: list[str],
                 config: SimulationConfig, output: Path | None, report: Path | None,
                 as_json: bool) -> None:
    """One job on one trace with every deadline policy."""
    from liveput.report.deadline import DEADLINE_HEADER, deadline_rows, write_deadline_report

    profile = load_profile(model)
    with progress() as bar:
        task = bar.add_task("simulating", total=None)
        result = simulate_deadline(
            trace, profile, objective, policies, config,
            on_step=lambda name, t: bar.update(task, description=f"simulating {name}"))
    if not as_json:
        view = Table(title=f"{model} on {trace.name}: {result.target_samples:,.0f} samples by "
                           f"{result.deadline_hours:.2f} h (all on-demand: "
                           f"{result.fastest_hours:.2f} h on {result.on_demand_max})")
        for column in DEADLINE_HEADER:
            view.add_column(column, justify="left" if column == "policy" else "right",
                            no_wrap=True)
        for row in deadline_rows(result):
            view.add_row(*row)
        console.print(view)
    if report is not None:
        with progress() as bar:
            bar.add_task("cost against the deadline", total=None)
            curve = deadline_sweep([trace], profile, objective, SWEEP_FACTORS, (config.seed,),
                                   policies, config)
            curve += [DeadlineSweepRow(trace.name, result.deadline_hours / result.fastest_hours,
                                       result.deadline_hours, config.seed, name, run.deadline_met,
                                       run.hours_late, run.usd, run.usd_on_demand)
                      for name, run in result.runs.items()]
        page = write_deadline_report(result, curve, report)
        err_console.print(f"wrote {page} and its PNGs")
    _emit(result.to_json(), output, as_json)


def run_deadline_sweep(traces: list[IntervalTrace], model: str, objective: JobObjective,
                       policies: list[str], config: SimulationConfig, output: Path | None,
                       as_json: bool) -> None:
    """Deadlines of 1.1x to 2x the all-on-demand time, three seeds, every trace."""
    profile = load_profile(model)
    seeds = tuple(range(config.seed, config.seed + SWEEP_SEEDS))
    with progress() as bar:
        task = bar.add_task("sweep", total=len(traces) * len(SWEEP_FACTORS) * len(seeds))
        rows = deadline_sweep(
            traces, profile, objective, SWEEP_FACTORS, seeds, policies, config,
            on_cell=lambda trace, factor, seed: bar.update(
                task, advance=1, description=f"{trace} x{factor:g} seed {seed}"))
    if not as_json:
        print_deadline_sweep(rows, policies)
    _emit({"interval_s": config.interval_s, "rows": [dataclasses.asdict(r) for r in rows]},
          output, as_json)


def sweep_cells(rows: list[DeadlineSweepRow], policies: list[str],
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


def print_deadline_sweep(rows: list[DeadlineSweepRow], policies: list[str]) -> None:
    view = Table(title="mean dollars (deadlines met / seeds) by deadline, as a multiple of the "
                       "all-on-demand time")
    for column in ("trace", "deadline", *policies):
        view.add_column(column, justify="left" if column == "trace" else "right",
                        no_wrap=column != "trace")
    for trace, factor, hours, line in sweep_cells(rows, policies):
        view.add_row(trace.removeprefix("generated-"), f"{factor:g}x ({hours:.1f} h)", *line)
    console.print(view)
