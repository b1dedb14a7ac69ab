"""`liveput simulate`: replay a trace with every policy: a table (or ``--json``), a JSON file, a
report; with a job (``--deadline-hours H --steps S``), the deadline policies on it; ``--sweep``
over models and traces, or over a job's deadlines and seeds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, err_console, print_json, progress, to_json
from liveput.cli.params import FLAG
from liveput.cli.trace import load_trace
from liveput.errors import LiveputError
from liveput.files import check_output_file, check_output_folder, write_text_atomic
from liveput.perf import ModelProfile, estimate_configs, load_profile
from liveput.policies import POLICIES
from liveput.policies.deadline import DEADLINE_POLICIES, DEADLINE_POLICY_NAMES
from liveput.policies.objective import JobObjective
from liveput.sim import (
    DEFAULT_POLICIES,
    SimulationConfig,
    SimulationResult,
    default_trace,
    simulate,
    simulate_deadline,
)
from liveput.sim.engine import DEFAULT_MODEL, check_size
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

TRACE_HELP = (
    "Trace file (events CSV, count JSON, count CSV, text); repeat with --sweep. "
    "Default: the project's own generated 12-hour, 32-instance trace."
)


SWEEP_SEEDS = 3
"""Seeds of a deadline sweep: ``--seed`` and the next ones."""

# The options of a deadline job and of --sweep (defined here: the command's signature stays
# readable).
DEADLINE_HOURS = typer.Option(
    None,
    "--deadline-hours",
    parser=params.OPTIONAL_HOURS,
    help="Finish the work (--steps or --target-samples) by this many hours: compares "
    "the deadline policies (spot and on-demand, dollars, deadlines met).",
)
STEPS = typer.Option(
    None,
    "--steps",
    parser=params.OPTIONAL_STEPS,
    help="Work of a deadline job: iterations of the model's global batch.",
)
TARGET_SAMPLES = typer.Option(
    None,
    "--target-samples",
    parser=params.OPTIONAL_SAMPLES,
    help="Work of a deadline job, in samples (instead of --steps).",
)
BUDGET_USD = typer.Option(
    None,
    "--budget-usd",
    parser=params.OPTIONAL_PRICE_POSITIVE,
    help="Most dollars a deadline job may cost in all.",
)
BUDGET_USD_PER_HOUR = typer.Option(
    None,
    "--budget-usd-per-hour",
    parser=params.OPTIONAL_PRICE_POSITIVE,
    help="Most dollars per hour a deadline job may spend.",
)
ON_DEMAND_MAX = typer.Option(
    None,
    "--on-demand-max",
    parser=params.OPTIONAL_SOME_INSTANCES,
    help="Most on-demand instances a deadline job holds at once (default: the trace's peak count).",
)
SWEEP = typer.Option(
    False,
    "--sweep",
    metavar=FLAG,
    help="Run the models x traces x policies matrix (default models: "
    + ",".join(SWEEP_MODELS)
    + "; default traces: one generated per "
    "market regime; with a job: deadlines of 1.1x to 2x the "
    "all-on-demand time and three seeds).",
)


def _names(text: str, what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise LiveputError(f"--{what} is empty; give comma-separated names")
    return names


def _load(
    path: Path, interval_s: float, start_hour: float | None, end_hour: float | None
) -> IntervalTrace:
    trace = load_trace(path, None, start_hour, end_hour)
    if trace.end_s <= 0:
        raise LiveputError(f"trace {path} is empty: it spans no time")
    intervals = trace.resample(interval_s)
    check_size(intervals)  # before any work or note
    return intervals


def _fraction(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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
    _emit(result.to_json(), output, as_json)


def _emit(summary: dict, output: Path | None, as_json: bool) -> None:
    """The results as JSON: into ``--output`` (atomically), on stdout with ``--json``, or both."""
    if output is not None:
        write_text_atomic(output, to_json(summary) + "\n")
        err_console.print(f"wrote {output}")
    if as_json:
        print_json(summary)


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
    _emit(
        {"interval_s": config.interval_s, "rows": [row.__dict__ for row in rows]}, output, as_json
    )


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


def _job(
    deadline_hours: float | None,
    steps: int | None,
    target_samples: float | None,
    budget_usd: float | None,
    budget_usd_per_hour: float | None,
    on_demand_max: int | None,
    run_sweep: bool,
) -> bool:
    """Whether the options describe a deadline job (checking that they describe one whole)."""
    if all(
        value is None
        for value in (
            deadline_hours,
            steps,
            target_samples,
            budget_usd,
            budget_usd_per_hour,
            on_demand_max,
        )
    ):
        return False
    if steps is None and target_samples is None:
        raise LiveputError("a deadline job needs its work: --steps or --target-samples")
    if steps is not None and target_samples is not None:
        raise LiveputError("give --steps or --target-samples, not both")
    if deadline_hours is None and not run_sweep:
        raise LiveputError("a deadline job needs --deadline-hours (or --sweep over deadlines)")
    return True


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
    _emit(
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


def _one_trace(
    traces: list[Path] | None, interval_s: float, start_hour: float | None, end_hour: float | None
) -> IntervalTrace:
    """The trace of one simulation: the one ``--trace`` or the project's own default."""
    if traces and len(traces) > 1:
        raise LiveputError("several --trace files need --sweep")
    if traces:
        return _load(traces[0], interval_s, start_hour, end_hour)
    if start_hour is not None or end_hour is not None:
        raise LiveputError("--start-hour and --end-hour need a --trace")
    return default_trace(interval_s)


def _sweep(
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
            [_load(path, interval_s, start_hour, end_hour) for path in traces]
            if traces
            else [default_trace(interval_s)]
        )
        _run_deadline_sweep(loaded, model, job, names, config, output, as_json)
        return
    loaded = (
        [_load(path, interval_s, start_hour, end_hour) for path in traces]
        if traces
        else default_sweep_traces(interval_s)
    )
    models = _names(model, "model") if model != DEFAULT_MODEL else list(SWEEP_MODELS)
    _run_sweep(loaded, models, names, config, output, as_json)


def register(app: typer.Typer) -> None:
    """Add the `simulate` command to the root app."""

    @app.command("simulate")
    def simulate_command(
        traces: list[Path] = typer.Option(None, "--trace", help=TRACE_HELP),
        model: str = typer.Option(
            DEFAULT_MODEL,
            "--model",
            help="Built-in model or profile .json (comma-separated with --sweep).",
        ),
        policies: str | None = typer.Option(
            None,
            "--policies",
            help="Comma-separated policies to compare (default: "
            + ",".join(DEFAULT_POLICIES)
            + "; with a deadline: "
            + ",".join(DEADLINE_POLICY_NAMES)
            + ").",
        ),
        objective: str = typer.Option(
            "throughput", "--objective", help="What liveput optimizes: throughput or cost."
        ),
        interval: float = typer.Option(
            60.0, "--interval", parser=params.SECONDS, help="Interval length, seconds."
        ),
        horizon: int = typer.Option(
            12, "--horizon", parser=params.HORIZON, help="Intervals looked ahead."
        ),
        on_demand: int = typer.Option(
            0,
            "--on-demand",
            parser=params.SOME_INSTANCES,
            help="On-demand instances held besides the spot ones.",
        ),
        seed: int = typer.Option(
            0, "--seed", parser=params.SEED, help="Seed of when losses fall and which go."
        ),
        spot_price: float | None = typer.Option(
            None,
            "--spot-price",
            parser=params.OPTIONAL_PRICE,
            help="$ per spot instance-hour (default: the trace's, else the model's instance type).",
        ),
        on_demand_price: float | None = typer.Option(
            None,
            "--on-demand-price",
            parser=params.OPTIONAL_PRICE,
            help="$ per on-demand instance-hour (default: the model's instance type).",
        ),
        notice: float = typer.Option(
            120.0,
            "--preemption-notice",
            parser=params.NON_NEGATIVE_SECONDS,
            help="Seconds of warning before a preemption (AWS 120, GCP 30, 0: none).",
        ),
        start_hour: float | None = typer.Option(
            None,
            "--start-hour",
            parser=params.HOUR_OF_TRACE,
            help="Replay the trace from this hour on.",
        ),
        end_hour: float | None = typer.Option(
            None,
            "--end-hour",
            parser=params.HOUR_OF_TRACE,
            help="Replay the trace up to this hour.",
        ),
        as_json: bool = typer.Option(
            False,
            "--json",
            metavar=FLAG,
            help="Print one JSON object (the results) instead of the table.",
        ),
        output: Path | None = typer.Option(
            None, "-o", "--output", help="Write the results as JSON to this file."
        ),
        report: Path | None = typer.Option(
            None, "--report", help="Write an HTML report and its PNGs here."
        ),
        deadline_hours: float | None = DEADLINE_HOURS,
        steps: int | None = STEPS,
        target_samples: float | None = TARGET_SAMPLES,
        budget_usd: float | None = BUDGET_USD,
        budget_usd_per_hour: float | None = BUDGET_USD_PER_HOUR,
        on_demand_max: int | None = ON_DEMAND_MAX,
        run_sweep: bool = SWEEP,
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
        deadline = _job(
            deadline_hours,
            steps,
            target_samples,
            budget_usd,
            budget_usd_per_hour,
            on_demand_max,
            run_sweep,
        )
        names = _names(
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
            _sweep(traces, model, names, config, start_hour, end_hour, output, as_json, job)
            return
        trace = _one_trace(traces, interval, start_hour, end_hour)
        _run_one(trace, model, names, config, output, report, as_json, job)
