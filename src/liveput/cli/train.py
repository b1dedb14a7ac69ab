"""`liveput train`: coordinator, agents and an emulated cloud on this machine."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

import typer
from rich.table import Table

from liveput.cli import agent as agent_commands
from liveput.cli import params
from liveput.cli.output import console, device_counts, err_console, print_json, progress, to_json
from liveput.errors import LiveputError
from liveput.files import check_output_file, write_text_atomic
from liveput.models.training import TrainingConfig


def train(
    model: str = typer.Option("tiny-gpt", "--model", help="Built-in job or module:function."),
    data: Path = typer.Option(
        None,
        "--data",
        help="Text, Arrow or Parquet file the job trains "
        "on (gpt2-small, llama-tiny; default: the job's own data).",
    ),
    workers: int = typer.Option(
        8, "--workers", parser=params.INSTANCES, help="Instances requested."
    ),
    trace_path: Path = typer.Option(
        None,
        "--trace",
        help="Trace file to replay (default: a generated 5-minute trace for --workers).",
    ),
    time_scale: float = typer.Option(
        2.0,
        "--time-scale",
        parser=params.TIME_SCALE,
        help="Trace seconds per wall second (the default spreads a 5-minute trace over the run).",
    ),
    steps: int = typer.Option(
        300,
        "--steps",
        parser=params.STEPS,
        help="Steps to train (the default lasts about "
        "as long as the default trace at the default time scale).",
    ),
    store: str = typer.Option(None, "--store", help="Store URL (default: a TCPStore here)."),
    checkpoint_dir: str = typer.Option(
        None, "--checkpoint-dir", help="Checkpoint directory or fsspec URL."
    ),
    checkpoint_every: int = typer.Option(
        10,
        "--checkpoint-every",
        parser=params.CHECKPOINT_EVERY,
        help="Steps between checkpoints (0: none).",
    ),
    notice_lead_s: float = typer.Option(
        120.0, "--notice-lead", parser=params.NON_NEGATIVE_SECONDS, help="Notice lead, trace s."
    ),
    notice_margin_s: float = typer.Option(
        20.0,
        "--notice-margin",
        parser=params.NON_NEGATIVE_SECONDS,
        help="Wall seconds before a noticed instance's announced end at which the job moves "
        "off it (it trains until then); must cover the move.",
    ),
    seed: int = typer.Option(
        20,
        "--seed",
        parser=params.SEED,
        help="Seed of the generated trace and the victims "
        "(20: its 5-minute trace for 6 workers has 7 preemptions and 5 "
        "allocations; most 5-minute traces have one or two).",
    ),
    heartbeat_timeout_s: float = typer.Option(
        None,
        "--heartbeat-timeout",
        parser=params.optional(params.SECONDS),
        help="Wall seconds of silence before an agent is taken for dead, whatever the time "
        "scale: the failure detection time (default: two decision intervals, at least 3 s).",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        metavar=params.FLAG,
        help="Print one JSON object (the summary) instead of the table.",
    ),
    output: Path = typer.Option(
        None,
        "-o",
        "--output",
        help="Write the summary here as JSON and the per-step log beside it (.jsonl).",
    ),
    log_dir: Path = typer.Option(
        None,
        "--log-dir",
        help="Where the agents' logs go, kept after "
        "the run (default: logs/ beside --output, else ./liveput-logs).",
    ),
    keep_checkpoints: int = typer.Option(
        2,
        "--keep-checkpoints",
        parser=params.KEEP,
        help="Complete checkpoints kept on disk (the newest).",
    ),
    deadline_hours: float = typer.Option(
        None,
        "--deadline-hours",
        parser=params.OPTIONAL_HOURS,
        help="Finish the --steps by this many trace hours at the least cost: the deadline "
        "policy rents spot and on-demand instances from the emulated provider.",
    ),
    on_demand_max: int = typer.Option(
        None,
        "--on-demand-max",
        parser=params.OPTIONAL_SOME_INSTANCES,
        help="Most on-demand instances held at once (with --deadline-hours; default: the "
        "trace's peak count).",
    ),
    instance_type: str = typer.Option(
        "p3.2xlarge",
        "--instance-type",
        help="Catalog instance type rented and priced (with --deadline-hours).",
    ),
    deadline_policy: str = typer.Option(
        "liveput",
        "--deadline-policy",
        help="Deadline policy (with --deadline-hours): liveput, uniform-progress, greedy, "
        "on-demand or spot-only.",
    ),
    precision: str = typer.Option(
        None,
        "--precision",
        help="fp32, bf16 (autocast) or fp16 (autocast and a loss scaler); "
        "weights and optimizer state stay fp32 (default: the job's own).",
    ),
    clip_grad_norm: float = typer.Option(
        None,
        "--clip-grad-norm",
        parser=params.optional(params.POSITIVE),
        help="Clip gradients to this global L2 norm, over all stages.",
    ),
    lr_schedule: str = typer.Option(
        None,
        "--lr-schedule",
        help="Learning rate by global step: "
        "constant|linear|cosine[:warmup=N][,min=F][,steps=N] (steps default: --steps).",
    ),
    activation_checkpointing: bool = typer.Option(
        False,
        "--activation-checkpointing",
        metavar=params.FLAG,
        help="Recompute each layer's forward in the backward pass (less memory, more compute).",
    ),
    on_nonfinite_loss: str = typer.Option(
        None,
        "--on-nonfinite-loss",
        help="A NaN or infinite loss: stop the job (the step is not "
        "committed) or skip that step's update on every stage (default: the job's own, stop).",
    ),
    device: str = typer.Option(
        "auto",
        "--device",
        help="What the agents train on: auto (CUDA where this machine has "
        "it), cpu, cuda or cuda:K. They share this machine: on CUDA they spread over its GPUs "
        "and talk over gloo through CPU memory (NCCL refuses two ranks on one GPU).",
    ),
    job_file: Path = typer.Option(
        None,
        "--job",
        help="Take the model, steps, checkpoints, "
        "provider, objective and notices from this job file (the "
        "options above are then ignored; see liveput launch).",
    ),
) -> None:
    """Train a model through emulated preemptions: coordinator, agents and cloud on this machine."""
    if job_file is not None:
        (
            model,
            workers,
            trace_path,
            time_scale,
            steps,
            checkpoint_dir,
            checkpoint_every,
            notice_lead_s,
            seed,
            keep_checkpoints,
            deadline_hours,
            on_demand_max,
            instance_type,
            deadline_policy,
            device,
        ) = _from_job_file(job_file)
    from liveput.launch.deadline import DeadlineJob
    from liveput.launch.local import (
        LocalTrainingConfig,
        Progress,
        run_local_training,
        warn_idle_gpus,
    )
    from liveput.models.jobs import resolve_job
    from liveput.models.validate import check_job
    from liveput.runtime.device import check_device_request, resolve_device
    from liveput.traces import generate_trace, read_trace

    # A CUDA request on a machine without CUDA: one line, before anything starts.
    resolved = resolve_device(check_device_request(device, "train"), "train")
    if deadline_hours is not None or job_file is not None:
        warn_idle_gpus(instance_type, resolved)  # the instances the job is billed for

    data_path = None if data is None else str(data.resolve())
    # An unknown model is refused before anything starts or is printed.
    job = resolve_job(model, data_path)
    check_job(job)  # a model mistake: one line naming the layer, before anything starts
    training = training_options(
        job.training,
        steps,
        precision,
        clip_grad_norm,
        lr_schedule,
        activation_checkpointing,
        on_nonfinite_loss,
    )

    if log_dir is None:
        log_dir = output.parent / "logs" if output is not None else Path("liveput-logs")
    config = LocalTrainingConfig(
        model=model,
        data=data_path,
        workers=workers,
        steps=steps,
        time_scale=time_scale,
        notice_lead_s=notice_lead_s,
        store_url=store,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        seed=seed,
        log_dir=str(log_dir),
        keep_checkpoints=keep_checkpoints,
        heartbeat_timeout_s=heartbeat_timeout_s,
        notice_margin_s=notice_margin_s,
        training=training,
        device=device,
        deadline=None
        if deadline_hours is None
        else DeadlineJob(deadline_hours, on_demand_max, instance_type, deadline_policy),
    )
    trace = read_trace(trace_path) if trace_path else generate_trace(workers, 5 / 60, seed)
    if output is not None:
        # Fail now, not after the training, if the summary cannot be written there.
        check_output_file(output)
    err_console.print(f"agents' logs: {log_dir}", soft_wrap=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with progress(transient=False) as bar:
            task = bar.add_task("starting", total=steps)

            def show(update: Progress) -> None:
                loss = "-" if update.loss is None else f"{update.loss:.3f}"
                bar.update(
                    task,
                    completed=update.step,
                    description=(
                        f"step {update.step} loss {loss} {update.configuration} "
                        f"instances {update.instances} plans {update.events}: {update.state}"
                    ),
                )

            result = run_local_training(config, trace, show)
    except KeyboardInterrupt:
        err_console.print(f"train: interrupted; agents stopped; logs in {log_dir}", soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = result.summary()
    if output is not None:
        # The step log first: the summary that names it is written once it exists.
        log_path = output.with_suffix(".jsonl")
        write_text_atomic(log_path, "".join(json.dumps(r) + "\n" for r in result.steps))
        write_text_atomic(output, to_json(summary) + "\n")
        err_console.print(f"wrote {output} and {log_path}")
    if as_json:
        print_json(summary)
    else:
        console.print(_summary_table(summary))


def training_options(
    base: TrainingConfig,
    steps: int,
    precision: str | None,
    clip_grad_norm: float | None,
    lr_schedule: str | None,
    activation_checkpointing: bool,
    on_nonfinite_loss: str | None = None,
) -> TrainingConfig | None:
    """The job's training options with the flags given applied (None: no flag, the job's own;
    a bad value is a one-line LiveputError)."""
    from liveput.models.training import LRSchedule

    changes: dict = {}
    try:
        if precision is not None:
            changes["precision"] = precision
        if clip_grad_norm is not None:
            changes["clip_grad_norm"] = clip_grad_norm
        if lr_schedule is not None:
            changes["lr_schedule"] = LRSchedule.parse(lr_schedule, total_steps=steps)
        if activation_checkpointing:
            changes["activation_checkpointing"] = True
        if on_nonfinite_loss is not None:
            changes["on_nonfinite_loss"] = on_nonfinite_loss
        return dataclasses.replace(base, **changes) if changes else None
    except LiveputError as error:
        raise LiveputError(f"train: {error}") from None


def _from_job_file(path: Path) -> tuple:
    """``liveput train``'s settings from a job file (its store, dashboard and metrics are
    ``liveput launch``'s)."""
    from liveput.models.jobs import resolve_job
    from liveput.operate.jobfile import load_job_file

    job = load_job_file(path)
    provider, objective = job.provider, job.objective
    return (
        job.model,
        provider.workers,
        Path(provider.trace) if provider.trace else None,
        provider.time_scale,
        job.num_steps(resolve_job(job.model).global_batch_size),
        job.checkpoint.url,
        job.checkpoint.every,
        job.notices.lead_s,
        provider.trace_seed,
        job.checkpoint.keep,
        objective.deadline_hours,
        provider.on_demand_max,
        provider.instance_type,
        objective.policy,
        job.device,
    )


def _summary_table(summary: dict) -> Table:
    """The run at a glance; ``--json`` and ``--output`` carry every field and the plans."""
    view = Table(title="training run", show_header=False)
    view.add_column("what")
    view.add_column("value", justify="right")
    loss = (
        "-"
        if summary["initial_loss"] is None or summary["final_loss"] is None
        else f"{summary['initial_loss']:.3f} -> {summary['final_loss']:.3f}"
    )
    moves = ", ".join(f"{kind} {n}" for kind, n in sorted(summary["migrations"].items())) or "-"
    for what, value in (
        ("steps", f"{summary['steps_completed']:,} ({summary['samples']:,} samples)"),
        ("loss", loss),
        ("preemptions / allocations", f"{summary['preemptions']} / {summary['allocations']}"),
        ("plans", f"{len(summary['plans'])} ({moves})"),
        ("steps rolled back and redone", str(summary["steps_rolled_back"])),
        ("exactly once", "yes" if summary["exactly_once"] else "NO"),
        (
            "devices",
            device_counts(summary.get("devices", {}))
            if summary.get("devices")
            else summary.get("device", "-"),
        ),
        *_deadline_rows(summary),
        ("wall time", f"{summary['wall_s']:.1f} s"),
        ("agents' logs", summary["log_dir"]),
    ):
        view.add_row(what, value)
    return view


def _deadline_rows(summary: dict) -> list[tuple[str, str]]:
    if "deadline_met" not in summary:
        return []
    met = "met" if summary["deadline_met"] else "MISSED"
    return [
        (
            "deadline",
            f"{met}: finished at {summary['finished_hours']:.3f} h of "
            f"{summary['deadline_hours']:g} h",
        ),
        (
            "dollars (spot / on-demand)",
            f"${summary['usd']:.2f} (${summary['usd_spot']:.2f} / ${summary['usd_on_demand']:.2f})",
        ),
        ("on-demand hours", f"{summary['on_demand_hours']:.3f}"),
    ]


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does: agents and the emulated cloud stop with it."""
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    """Add `train`, `agent` and `coordinator` to the root app."""
    app.command("train")(train)
    agent_commands.register(app)
