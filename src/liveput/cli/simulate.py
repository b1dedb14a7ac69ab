"""`liveput simulate`: replay a trace with every policy: a table (or ``--json``), a JSON file, a
report; with a job (``--deadline-hours H --steps S``), the deadline policies on it; ``--sweep``
over models and traces, or over a job's deadlines and seeds (:mod:`liveput.cli.simulate_sweep`).
The options are declared in :mod:`liveput.cli.simulate_options`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from liveput.cli import simulate_options as options
from liveput.cli.output import console, err_console, progress
from liveput.cli.simulate_io import emit, is_deadline_job, one_trace, parse_names
from liveput.cli.simulate_options import TRACE_HELP as TRACE_HELP
from liveput.cli.simulate_sweep import SWEEP_SEEDS as SWEEP_SEEDS
from liveput.cli.simulate_sweep import simulate_sweeps
from liveput.cli.simulate_sweep import sweep_cells as sweep_cells
from liveput.cli.trace import check_span
from liveput.errors import LiveputError
from liveput.files import check_output_file, check_output_folder
from liveput.perf import ModelProfile, estimate_configs, load_profile
from liveput.policies import POLICIES
from liveput.policies.deadline import DEADLINE_POLICIES, DEADLINE_POLICY_NAMES
from liveput.policies.objective import JobObjective
from liveput.sim import (
    DEFAULT_POLICIES,
    SimulationConfig,
    SimulationResult,
    simulate,
    simulate_deadline,
)
from liveput.sim.engine import DEFAULT_TRACE_HOURS
from liveput.sim.sweep import SWEEP_FACTORS, DeadlineSweepRow, deadline_sweep
from liveput.traces import IntervalTrace


def _warn_if_too_small(trace: IntervalTrace, profile: ModelProfile, num_on_demand: int) -> None:
    """Say so when the trace has fewer instances than the model's smallest configuration."""
    # Look beyond the trace's count, so the message can say how many instances it would take.
    table = estimate_configs(profile, max(trace.max_count + num_on_demand, 64))
    sizes = (table.data_parallel * table.pipeline_stages)[table.feasible]
    smallest = int(sizes.min()) if len(sizes) else None
    counts = trace.count + num_on_demand
    if smallest is None or counts.max() < smallest:
        need = "more than 64 instances" if smallest is None else (f"{smallest} instances at least")
        err_console.print(
            f"warning: {profile.model} needs {need} (the trace has at most "
            f"{int(counts.max())}): nothing trains; simulating anyway",
            soft_wrap=True,
        )
    elif (counts < smallest).any():
        short = int(np.sum(counts < smallest))
        err_console.print(
            f"note: {short} of {len(counts)} intervals have fewer than the "
            f"{smallest} instances {profile.model} needs: nothing trains in them",
            soft_wrap=True,
        )


def _simulate_throughput(
    trace: IntervalTrace, profile: ModelProfile, policies: list[str], config: SimulationConfig
) -> tuple[SimulationResult, str]:
    """Every policy for throughput; the result and the title of its table."""
    _warn_if_too_small(trace, profile, config.num_on_demand)
    total = len(trace) * (len(policies) + ("ideal" not in policies))
    with progress() as bar:
        task = bar.add_task("simulating", total=total)

        def step(policy: str, interval: int) -> None:
            bar.update(task, advance=1, description=f"simulating {policy}")

        result = simulate(trace, profile, policies, config, on_step=step)
    return result, (
        f"{profile.model} on {trace.name}: {trace.hours:.2f} h, {config.interval_s:g}-s intervals"
    )


def _simulate_deadline(
    trace: IntervalTrace,
    profile: ModelProfile,
    policies: list[str],
    config: SimulationConfig,
    job: JobObjective,
) -> tuple[SimulationResult, str]:
    """Every deadline policy on one job; the result and the title of its table."""
    with progress() as bar:
        task = bar.add_task("simulating", total=None)
        result = simulate_deadline(
            trace,
            profile,
            job,
            policies,
            config,
            on_step=lambda name, t: bar.update(task, description=f"simulating {name}"),
        )
    return result, (
        f"{profile.model} on {trace.name}: {result.target_samples:,.0f} samples by "
        f"{result.deadline_hours:.2f} h (all on-demand: "
        f"{result.fastest_hours:.2f} h on {result.on_demand_max})"
    )


def _deadline_curve(
    trace: IntervalTrace,
    profile: ModelProfile,
    policies: list[str],
    config: SimulationConfig,
    job: JobObjective,
    result: SimulationResult,
) -> list[DeadlineSweepRow]:
    """The same job at several deadlines (the report's cost-against-deadline figure)."""
    with progress() as bar:
        bar.add_task("cost against the deadline", total=None)
        curve = deadline_sweep(
            [trace], profile, job, SWEEP_FACTORS, (config.seed,), policies, config
        )
    if result.fastest_hours is None:
        raise ValueError("the curve needs a deadline job's result")
    return curve + [
        DeadlineSweepRow.of(
            trace.name,
            job.deadline_hours / result.fastest_hours,
            job.deadline_hours,
            config.seed,
            run,
        )
        for run in result.runs.values()
    ]


def _run_one(
    trace: IntervalTrace,
    model: str,
    policies: list[str],
    config: SimulationConfig,
    output: Path | None,
    report: Path | None,
    as_json: bool,
    job: JobObjective | None,
) -> None:
    """One trace: every policy for throughput, or every deadline policy on ``job``."""
    from liveput.report import summary_table, write_report

    profile = load_profile(model)
    if job is None:
        result, title = _simulate_throughput(trace, profile, policies, config)
    else:
        result, title = _simulate_deadline(trace, profile, policies, config, job)
    if not as_json:
        header, rows = summary_table(result)
        view = Table(title=title)
        for column in header:
            view.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)
        for row in rows:
            view.add_row(*row)
        console.print(view)
    # The report first: if it fails, no JSON claims a finished run.
    if report is not None:
        curve = (
            () if job is None else _deadline_curve(trace, profile, policies, config, job, result)
        )
        page = write_report(result, report, curve)
        err_console.print(f"wrote {page} and its PNGs")
    emit(result.to_json(), output, as_json)


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to the root app."""

    @app.command("simulate")
    def simulate_command(
        traces: list[Path] = options.TRACES,
        model: str = options.MODEL,
        policies: str | None = options.POLICIES,
        objective: str = options.OBJECTIVE,
        interval: float = options.INTERVAL,
        horizon: int = options.HORIZON,
        on_demand: int = options.ON_DEMAND,
        seed: int = options.SEED,
        spot_price: float | None = options.SPOT_PRICE,
        on_demand_price: float | None = options.ON_DEMAND_PRICE,
        notice: float = options.NOTICE,
        start_hour: float | None = options.START_HOUR,
        end_hour: float | None = options.END_HOUR,
        as_json: bool = options.AS_JSON,
        output: Path | None = options.OUTPUT,
        report: Path | None = options.REPORT,
        deadline_hours: float | None = options.DEADLINE_HOURS,
        steps: int | None = options.STEPS,
        target_samples: float | None = options.TARGET_SAMPLES,
        budget_usd: float | None = options.BUDGET_USD,
        budget_usd_per_hour: float | None = options.BUDGET_USD_PER_HOUR,
        on_demand_max: int | None = options.ON_DEMAND_MAX,
        run_sweep: bool = options.SWEEP,
    ) -> None:
        """Replay an availability trace with each policy: samples, dollars, and why."""
        # Outputs are checked before any work: a bad path costs nothing and writes nothing.
        if output is not None:
            check_output_file(output)
        if report is not None:
            check_output_folder(report)
        config = SimulationConfig(
            interval_s=interval,
            horizon=horizon,
            objective=objective,
            spot_price_usd_per_hour=spot_price,
            on_demand_price_usd_per_hour=on_demand_price,
            num_on_demand=on_demand,
            seed=seed,
            preemption_notice_s=notice,
        )
        if not traces:  # the project's own traces, 12 hours each
            check_span(DEFAULT_TRACE_HOURS * 3600.0, interval, "the default trace")
        deadline = is_deadline_job(
            deadline_hours,
            steps,
            target_samples,
            budget_usd,
            budget_usd_per_hour,
            on_demand_max,
            run_sweep,
        )
        names = parse_names(
            policies or ",".join(DEADLINE_POLICY_NAMES if deadline else DEFAULT_POLICIES),
            "policies",
        )
        for name in names:  # an unknown name is refused before any work
            (DEADLINE_POLICIES if deadline else POLICIES).get(name)
        job = (
            JobObjective(
                deadline_hours=deadline_hours or 1.0,
                steps=steps,
                target_samples=target_samples,
                budget_usd=budget_usd,
                budget_usd_per_hour=budget_usd_per_hour,
                on_demand_max=on_demand_max,
            )
            if deadline
            else None
        )
        if run_sweep:
            if report is not None:
                raise LiveputError("--report shows one simulation; drop it with --sweep")
            simulate_sweeps(
                traces, model, names, config, start_hour, end_hour, output, as_json, job
            )
            return
        trace = one_trace(traces, interval, start_hour, end_hour)
        _run_one(trace, model, names, config, output, report, as_json, job)
