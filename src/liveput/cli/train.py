"""`liveput train`: coordinator, agents and an emulated cloud on this machine."""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from liveput.cli import agent as agent_commands
from liveput.cli import coordinator as coordinator_commands
from liveput.cli import params
from liveput.cli.output import console, device_counts, err_console, print_json, progress, to_json
from liveput.cli.train_options import (
    ActivationCheckpointing,
    AsJson,
    BudgetUsd,
    BudgetUsdPerHour,
    CheckpointDir,
    CheckpointEvery,
    ClipGradNorm,
    DataFile,
    DeadlineHours,
    Device,
    HeartbeatTimeout,
    InstanceType,
    JobFileOption,
    KeepCheckpoints,
    LogDir,
    LrSchedule,
    NoticeLead,
    OnDemandMax,
    OnNonfiniteLoss,
    Output,
    Precision,
    Seed,
    Steps,
    StoreUrl,
    TimeScale,
    TraceFile,
    Workers,
)
from liveput.errors import LiveputError
from liveput.files import check_output_file, write_text_atomic
from liveput.launch.assemble import DEFAULTS
from liveput.models.training import TrainingConfig

if TYPE_CHECKING:
    from liveput.launch.local import LocalTrainingConfig
    from liveput.runtime.coordinator import Coordinator
    from liveput.traces import IntervalTrace, Trace


def train(
    model: params.Model = "tiny-gpt",
    data: DataFile = None,
    workers: Workers = 8,
    trace_path: TraceFile = None,
    time_scale: TimeScale = 2.0,
    steps: Steps = 300,
    store: StoreUrl = None,
    checkpoint_dir: CheckpointDir = None,
    checkpoint_every: CheckpointEvery = DEFAULTS.checkpoint_every,
    notice_lead_s: NoticeLead = 120.0,
    notice_margin_s: params.NoticeMargin = DEFAULTS.notice_margin_s,
    seed: Seed = 20,
    heartbeat_timeout_s: HeartbeatTimeout = None,
    as_json: AsJson = False,
    output: Output = None,
    log_dir: LogDir = None,
    keep_checkpoints: KeepCheckpoints = DEFAULTS.keep_checkpoints,
    deadline_hours: DeadlineHours = None,
    on_demand_max: OnDemandMax = None,
    instance_type: InstanceType = "p3.2xlarge",
    deadline_policy: params.DeadlinePolicy = DEFAULTS.policy,
    budget_usd: BudgetUsd = None,
    budget_usd_per_hour: BudgetUsdPerHour = None,
    precision: Precision = None,
    clip_grad_norm: ClipGradNorm = None,
    lr_schedule: LrSchedule = None,
    activation_checkpointing: ActivationCheckpointing = False,
    on_nonfinite_loss: OnNonfiniteLoss = None,
    device: Device = DEFAULTS.device,
    instance_memory_gb: params.InstanceMemory = None,
    job_file: JobFileOption = None,
) -> None:
    """Train a model through emulated preemptions: coordinator, agents and cloud on this machine."""
    from liveput.launch.deadline import deadline_job
    from liveput.launch.local import LocalTrainingConfig, default_trace, warn_idle_gpus
    from liveput.models.jobs import resolve_job
    from liveput.models.validate import check_job
    from liveput.runtime.device import check_device_request, resolve_device
    from liveput.traces import read_trace

    if job_file is None:
        config = LocalTrainingConfig(
            model=model,
            workers=workers,
            steps=steps,
            time_scale=time_scale,
            notice_lead_s=notice_lead_s,
            notice_margin_s=notice_margin_s,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
            seed=seed,
            device=device,
            instance_memory_gb=instance_memory_gb,
            # A bad deadline or budget: one line, before any work.
            deadline=deadline_job(
                deadline_hours,
                on_demand_max,
                instance_type,
                deadline_policy,
                budget_usd,
                budget_usd_per_hour,
            ),
        )
        trace: Trace | IntervalTrace = (
            read_trace(trace_path) if trace_path else default_trace(workers, seed)
        )
    else:  # the job file's settings, as `liveput launch` reads them
        config, trace, instance_type = _from_job_file(job_file)
    # A CUDA request on a machine without CUDA: one line, before anything starts.
    resolved = resolve_device(check_device_request(config.device, "train"), "train")
    if config.deadline is not None or job_file is not None:
        warn_idle_gpus(instance_type, resolved)  # the instances the job is billed for
    data_path = None if data is None else str(data.resolve())
    # An unknown model is refused before anything starts or is printed.
    job = resolve_job(config.model, data_path)
    check_job(job)  # a model mistake: one line naming the layer, before anything starts
    flags = (precision, clip_grad_norm, lr_schedule, activation_checkpointing, on_nonfinite_loss)
    if log_dir is None:
        log_dir = output.parent / "logs" if output is not None else Path("liveput-logs")
    config = dataclasses.replace(
        config,
        data=data_path,
        store_url=store,
        log_dir=str(log_dir),
        heartbeat_timeout_s=heartbeat_timeout_s,
        training=training_options(job.training, config.steps, *flags),
    )
    if output is not None:
        # Fail now, not after the training, if the summary cannot be written there.
        check_output_file(output)
    config = dataclasses.replace(config, model_path=str(model_output(output)))
    summary = _train_with_progress(config, trace, log_dir, output)
    if as_json:
        print_json(summary)
    else:
        console.print(_summary_table(summary))


def _from_job_file(path: Path) -> tuple[LocalTrainingConfig, Trace | IntervalTrace, str]:
    """A job file's local training (:mod:`liveput.operate.job_training`, ``liveput launch``'s
    mapping), its trace, and the instance type it is billed for."""
    from liveput.models.jobs import resolve_job
    from liveput.operate.job_training import job_trace, training_config
    from liveput.operate.jobfile import load_job_file

    spec = load_job_file(path)
    steps = spec.num_steps(resolve_job(spec.model).global_batch_size)
    return training_config(spec, steps), job_trace(spec), spec.provider.instance_type


def _train_with_progress(
    config: LocalTrainingConfig, trace: Trace | IntervalTrace, log_dir: Path, output: Path | None
) -> dict:
    """Run ``config`` with a progress bar (SIGTERM ends it as Ctrl-C does); write ``output``
    and its per-step log (as steps commit); the summary."""
    from liveput.launch.local import run_local_training
    from liveput.launch.progress import Progress
    from liveput.launch.steplog import StepLog

    step_log = None if output is None else StepLog(output.with_suffix(".jsonl"))

    model_path = Path(config.model_path or "")
    err_console.print(f"agents' logs: {log_dir}; model: {model_path}", soft_wrap=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with progress(transient=False) as bar:
            task = bar.add_task("starting", total=config.steps)

            def show(update: Progress) -> None:
                loss = "-" if update.loss is None else f"{update.loss:.3f}"
                bar.update(
                    task,
                    completed=update.step,
                    description=(
                        f"step {update.step} loss {loss} {update.configuration} "
                        f"instances {update.instances} plans {update.events}: {update.state}"
                        + (
                            f" [checkpoints failed: {update.checkpoints_failed}]"
                            if update.checkpoints_failed
                            else ""
                        )
                    ),
                )

            def log_steps(coordinator: Coordinator, done: bool) -> None:
                if step_log is not None:
                    step_log.advance(coordinator)

            result = run_local_training(config, trace, show, log_steps)
    except KeyboardInterrupt:
        err_console.print(f"train: interrupted; agents stopped; logs in {log_dir}", soft_wrap=True)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        if output is None:  # the run's own folders, left empty by a failed run, go
            for folder in (model_path.parent, model_path.parent.parent):
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
    summary = result.summary()
    if output is not None and step_log is not None:
        # The step log first: the summary that names it is written once it is whole.
        step_log.finish(result.steps)
        write_text_atomic(output, to_json(summary) + "\n")
        err_console.print(f"wrote {output} and {step_log.path}")
    return summary


def model_output(output: Path | None, root: Path = Path("liveput-out")) -> Path:
    """Where the run's final model goes: beside ``--output`` (``run.json`` ->
    ``run.model.pt``), else ``model.pt`` in a new folder ``<root>/train-<time>/``, made now
    (a bad place is refused before the training starts)."""
    from liveput.runtime.model_files import check_model_output

    if output is not None:
        path = output.with_suffix(".model.pt")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = root / f"train-{stamp}"
        for attempt in range(2, 1000):
            if not folder.exists():
                break
            folder = root / f"train-{stamp}-{attempt}"
        try:
            folder.mkdir(parents=True)
        except OSError as error:
            raise LiveputError(
                f"train: cannot create the output folder {folder}: {error.strerror}"
            ) from None
        path = folder / "model.pt"
    check_model_output(path)
    return path


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
        ("model", summary.get("model") or "-"),
        ("checkpoints failed", str(summary.get("checkpoints_failed", 0))),
        *_evaluation_rows(summary.get("evaluations", [])),
    ):
        view.add_row(what, value)
    return view


def _evaluation_rows(evaluations: list[dict]) -> list[tuple[str, str]]:
    """How many evaluations ran, and the newest (after how many steps, its metrics)."""
    from liveput.operate.recorder import format_metrics

    if not evaluations:
        return []
    last = evaluations[-1]
    what = f"failed: {last['error']}" if "error" in last else format_metrics(last["metrics"])
    return [("evaluations", f"{len(evaluations)}; after {last['step'] + 1:,} steps: {what}")]


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
        *_budget_rows(summary),
    ]


def _budget_rows(summary: dict) -> list[tuple[str, str]]:
    """What was spent against the budget, if the job had one."""
    within = "within" if summary.get("within_budget") else "OVER"
    if summary.get("budget_usd") is not None:
        return [("budget", f"{within}: ${summary['usd']:.2f} of ${summary['budget_usd']:g}")]
    if summary.get("budget_usd_per_hour") is not None:
        return [
            (
                "budget per hour",
                f"{within}: at most ${summary['usd_per_hour_peak']:.2f}/h of "
                f"${summary['budget_usd_per_hour']:g}/h (on-demand at once: "
                f"{summary['on_demand_peak']})",
            )
        ]
    return []


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a run as Ctrl-C does: agents and the emulated cloud stop with it."""
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    """Add `train`, `agent` and `coordinator` to the root app."""
    app.command("train")(train)
    agent_commands.register(app)
    coordinator_commands.register(app)
