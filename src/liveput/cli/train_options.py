"""The options of ``liveput train``, one typed alias each (the command reads as its signature)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from liveput.cli import params

DataFile = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Text, Arrow or Parquet file the job trains on (gpt2-small, llama-tiny; default: "
        "the job's own data).",
    ),
]
Workers = Annotated[
    int, typer.Option("--workers", parser=params.INSTANCES, help="Instances requested.")
]
TraceFile = Annotated[
    Path | None,
    typer.Option(
        "--trace", help="Trace file to replay (default: a generated 5-minute trace for --workers)."
    ),
]
TimeScale = Annotated[
    float,
    typer.Option(
        "--time-scale",
        parser=params.TIME_SCALE,
        help="Trace seconds per wall second (the default spreads a 5-minute trace over the run).",
    ),
]
Steps = Annotated[
    int,
    typer.Option(
        "--steps",
        parser=params.STEPS,
        help="Steps to train (the default lasts about as long as the default trace at the "
        "default time scale).",
    ),
]
StoreUrl = Annotated[
    str | None,
    typer.Option("--store", parser=params.store_url, help="Store URL (default: a TCPStore here)."),
]
CheckpointDir = Annotated[
    str | None, typer.Option("--checkpoint-dir", help="Checkpoint directory or fsspec URL.")
]
CheckpointEvery = Annotated[
    int,
    typer.Option(
        "--checkpoint-every",
        parser=params.CHECKPOINT_EVERY,
        help="Steps between checkpoints (0: none).",
    ),
]
NoticeLead = Annotated[
    float,
    typer.Option("--notice-lead", parser=params.NON_NEGATIVE_SECONDS, help="Notice lead, trace s."),
]
Seed = Annotated[
    int,
    typer.Option(
        "--seed",
        parser=params.SEED,
        help="Seed of the generated trace and the victims (20: its 5-minute trace for 6 workers "
        "has 7 preemptions and 5 allocations; most 5-minute traces have one or two).",
    ),
]
HeartbeatTimeout = Annotated[
    float | None,
    typer.Option(
        "--heartbeat-timeout",
        parser=params.optional(params.SECONDS),
        help="Wall seconds of silence before an agent is taken for dead, whatever the time "
        "scale: the failure detection time (default: two decision intervals, at least 3 s).",
    ),
]
AsJson = Annotated[
    bool,
    typer.Option(
        "--json",
        metavar=params.FLAG,
        help="Print one JSON object (the summary) instead of the table.",
    ),
]
Output = Annotated[
    Path | None,
    typer.Option(
        "-o",
        "--output",
        help="Write the summary here as JSON, the per-step log beside it (.jsonl) and the "
        "final model (.model.pt; default: liveput-out/<run>/model.pt).",
    ),
]
LogDir = Annotated[
    Path | None,
    typer.Option(
        "--log-dir",
        help="Where the agents' logs go, kept after the run (default: logs/ beside --output, "
        "else ./liveput-logs).",
    ),
]
KeepCheckpoints = Annotated[
    int,
    typer.Option(
        "--keep-checkpoints",
        parser=params.KEEP,
        help="Complete checkpoints kept on disk (the newest).",
    ),
]
DeadlineHours = Annotated[
    float | None,
    typer.Option(
        "--deadline-hours",
        parser=params.OPTIONAL_HOURS,
        help="Finish the --steps by this many trace hours at the least cost: the deadline "
        "policy rents spot and on-demand instances from the emulated provider.",
    ),
]
OnDemandMax = Annotated[
    int | None,
    typer.Option(
        "--on-demand-max",
        parser=params.OPTIONAL_SOME_INSTANCES,
        help="Most on-demand instances held at once (with --deadline-hours; default: the "
        "trace's peak count).",
    ),
]
InstanceType = Annotated[
    str,
    typer.Option(
        "--instance-type",
        help="Catalog instance type rented and priced (with --deadline-hours).",
    ),
]
BudgetUsd = Annotated[
    float | None,
    typer.Option(
        "--budget-usd",
        parser=params.OPTIONAL_PRICE_POSITIVE,
        help="Most dollars the job may cost in all (with --deadline-hours): the deadline policy "
        "rents on-demand instances only within what is left, spread over the hours to the "
        "deadline, as liveput simulate's do.",
    ),
]
BudgetUsdPerHour = Annotated[
    float | None,
    typer.Option(
        "--budget-usd-per-hour",
        parser=params.OPTIONAL_PRICE_POSITIVE,
        help="Most dollars per hour the job may spend (with --deadline-hours): the deadline "
        "policy rents on-demand instances only within what the spot ones leave of it.",
    ),
]
Precision = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="fp32, bf16 (autocast) or fp16 (autocast and a loss scaler); weights and optimizer "
        "state stay fp32 (default: the job's own).",
    ),
]
ClipGradNorm = Annotated[
    float | None,
    typer.Option(
        "--clip-grad-norm",
        parser=params.optional(params.POSITIVE),
        help="Clip gradients to this global L2 norm, over all stages.",
    ),
]
LrSchedule = Annotated[
    str | None,
    typer.Option(
        "--lr-schedule",
        help="Learning rate by global step: constant|linear|cosine[:warmup=N][,min=F][,steps=N] "
        "(steps default: --steps).",
    ),
]
ActivationCheckpointing = Annotated[
    bool,
    typer.Option(
        "--activation-checkpointing",
        metavar=params.FLAG,
        help="Recompute each layer's forward in the backward pass (less memory, more compute).",
    ),
]
OnNonfiniteLoss = Annotated[
    str | None,
    typer.Option(
        "--on-nonfinite-loss",
        help="A NaN or infinite loss: stop the job (the step is not committed) or skip that "
        "step's update on every stage (default: the job's own, stop).",
    ),
]
Device = Annotated[
    str,
    typer.Option(
        "--device",
        help="What the agents train on: auto (CUDA where this machine has it), cpu, cuda or "
        "cuda:K. They share this machine: on CUDA they spread over its GPUs and talk over gloo "
        "through CPU memory (NCCL refuses two ranks on one GPU).",
    ),
]
JobFileOption = Annotated[
    Path | None,
    typer.Option(
        "--job",
        help="Take the model, steps, checkpoints, provider, objective and notices from this job "
        "file (the options above are then ignored; see liveput launch).",
    ),
]
