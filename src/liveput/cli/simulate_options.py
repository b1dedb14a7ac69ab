"""The options of `liveput simulate`, declared once here so that the command's signature reads as
a list of names: the trace and model, the simulation's settings, the outputs, a deadline job and
``--sweep``."""

from __future__ import annotations

import typer

from liveput.cli import params
from liveput.cli.params import FLAG
from liveput.policies.deadline import DEADLINE_POLICY_NAMES
from liveput.sim import DEFAULT_POLICIES
from liveput.sim.engine import DEFAULT_MODEL
from liveput.sim.sweep import SWEEP_MODELS

TRACE_HELP = (
    "Trace file (events CSV, count JSON, count CSV, text); repeat with --sweep. "
    "Default: the project's own generated 12-hour, 32-instance trace."
)

# What is simulated.
TRACES = typer.Option(None, "--trace", help=TRACE_HELP)
MODEL = typer.Option(
    DEFAULT_MODEL,
    "--model",
    help="Built-in model or profile .json (comma-separated with --sweep).",
)
POLICIES = typer.Option(
    None,
    "--policies",
    parser=params.NAMES,
    help="Comma-separated policies to compare (default: "
    + ",".join(DEFAULT_POLICIES)
    + "; with a deadline: "
    + ",".join(DEADLINE_POLICY_NAMES)
    + ").",
)

# The simulation's settings.
OBJECTIVE = typer.Option(
    "throughput", "--objective", help="What liveput optimizes: throughput or cost."
)
INTERVAL = typer.Option(60.0, "--interval", parser=params.SECONDS, help="Interval length, seconds.")
HORIZON = typer.Option(12, "--horizon", parser=params.HORIZON, help="Intervals looked ahead.")
ON_DEMAND = typer.Option(
    0,
    "--on-demand",
    parser=params.SOME_INSTANCES,
    help="On-demand instances held besides the spot ones.",
)
SEED = typer.Option(0, "--seed", parser=params.SEED, help="Seed of when losses fall and which go.")
SPOT_PRICE = typer.Option(
    None,
    "--spot-price",
    parser=params.OPTIONAL_PRICE,
    help="$ per spot instance-hour (default: the trace's, else the model's instance type).",
)
ON_DEMAND_PRICE = typer.Option(
    None,
    "--on-demand-price",
    parser=params.OPTIONAL_PRICE,
    help="$ per on-demand instance-hour (default: the model's instance type).",
)
NOTICE = typer.Option(
    120.0,
    "--preemption-notice",
    parser=params.NON_NEGATIVE_SECONDS,
    help="Seconds of warning before a preemption (AWS 120, GCP 30, 0: none).",
)
START_HOUR = typer.Option(
    None,
    "--start-hour",
    parser=params.HOUR_OF_TRACE,
    help="Replay the trace from this hour on.",
)
END_HOUR = typer.Option(
    None,
    "--end-hour",
    parser=params.HOUR_OF_TRACE,
    help="Replay the trace up to this hour.",
)

# The outputs.
AS_JSON = typer.Option(
    False,
    "--json",
    metavar=FLAG,
    help="Print one JSON object (the results) instead of the table.",
)
OUTPUT = typer.Option(None, "-o", "--output", help="Write the results as JSON to this file.")
REPORT = typer.Option(None, "--report", help="Write an HTML report and its PNGs here.")

# A deadline job and --sweep.
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
