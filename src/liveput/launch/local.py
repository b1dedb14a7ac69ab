"""``liveput train``: the coordinator, agents and an emulated cloud, all on this machine.

The coordinator hosts the store (a TCPStore on 127.0.0.1 unless ``store_url`` names another) and
runs its control loop in this process; the emulated provider replays the trace time-scaled,
starting one agent process per instance (``liveput agent``), noticing then SIGKILLing them as the
trace says (a deadline job instead rents from it, :class:`LocalCloud`). One decision interval is
one trace minute, i.e. ``60 / time_scale`` wall seconds.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from liveput.cloud.agent_forks import shared_fork_server
from liveput.cloud.loss_report import check_loss_signal_delay
from liveput.cloud.processes import Launcher, command_launcher
from liveput.errors import LiveputError
from liveput.files import check_writable_url
from liveput.launch.assemble import DEFAULTS, AssembledJob, JobRequest, assemble_job
from liveput.launch.cloud import LocalCloud, tell_gone
from liveput.launch.deadline import DeadlineJob
from liveput.launch.evaluations import attach_evaluations, gather_evaluations
from liveput.launch.job_store import StorePlace, open_job_store
from liveput.launch.job_token import keep_token, run_token
from liveput.launch.progress import Progress, read_progress
from liveput.launch.scratch import scratch_folder
from liveput.models.training import TrainingConfig
from liveput.perf.types import check_instance_memory_gb
from liveput.runtime import keys
from liveput.runtime.checkpoint import final_weights_written
from liveput.runtime.clock import MonotonicClock
from liveput.runtime.coordinator import Coordinator
from liveput.runtime.coordinator.objective import EarlierCoordinators
from liveput.runtime.device import (
    check_device_request,
    describe_device,
    idle_gpus_message,
    resolve_device,
)
from liveput.runtime.entry import agent_command
from liveput.runtime.launch import job_profile, publish_spec
from liveput.runtime.ledger import LedgerReport, verify_ledger
from liveput.runtime.model_files import export_final
from liveput.runtime.store import Store, readers
from liveput.traces import IntervalTrace, Trace

LOG = logging.getLogger(__name__)
MIGRATION_KINDS = ("intra-stage", "inter-stage", "pipeline", "checkpoint-restore")


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Settings of a local training run."""

    model: str = "tiny-gpt"
    """Built-in job or ``module:function``."""
    data: str | None = None
    """The file a built-in job that takes ``--data`` trains on."""
    workers: int = 8
    """Instances requested (the trace is generated or scaled for this many)."""
    steps: int = 300
    """Steps to train."""
    time_scale: float = 2.0
    """Trace seconds per wall second."""
    notice_lead_s: float = 120.0
    """Preemption notice lead in trace seconds (AWS 120, GCP 30)."""
    store_url: str | None = None
    """Store URL (default: a TCPStore hosted here on a free loopback port)."""
    checkpoint_dir: str | None = None
    """Checkpoint directory or fsspec URL (default: a temporary directory)."""
    checkpoint_every: int = DEFAULTS.checkpoint_every
    """K: checkpoint every K steps."""
    timeout_s: float = 900.0
    """Give up after this many wall seconds."""
    seed: int = 0
    """Seed of the emulated cloud's choice of victims."""
    log_dir: str = "liveput-logs"
    """Directory of the agents' logs (``i-<n>.log``), kept after the run."""
    keep_checkpoints: int = DEFAULTS.keep_checkpoints
    """K: only the newest K complete checkpoints stay on disk."""
    heartbeat_timeout_s: float | None = None
    """Wall seconds of silence before the coordinator takes an agent for dead, whatever the
    time scale (the failure detection time; None: two decision intervals, at least 3 s)."""
    notice_margin_s: float | None = DEFAULTS.notice_margin_s
    """A noticed instance trains until this many wall seconds before the end its notice
    announces, whatever the time scale; None (``auto``, the default): twice the move the job
    measured (:attr:`liveput.runtime.coordinator.CoordinatorConfig.notice_margin_s`)."""
    training: TrainingConfig | None = None
    """Precision, clipping, schedule, activation checkpointing (None: the job's own)."""
    policy: str = DEFAULTS.policy
    """Policy deciding the configuration (``liveput.policies``: ``reactive`` restarts)."""
    deadline: DeadlineJob | None = None
    """A deadline job: the deadline policy decides, and the emulated provider rents, the spot
    and on-demand instances (:mod:`liveput.launch.deadline`); None: the trace's instances."""
    token: str | None = None
    """The job token (None: :func:`liveput.launch.job_token.run_token`'s)."""
    device: str = DEFAULTS.device
    """What the agents train on: ``auto`` (CUDA where this machine has it), ``cpu``, ``cuda``
    or ``cuda:K``. They share this machine: on CUDA they spread over its GPUs and communicate
    over gloo through CPU memory (NCCL refuses two ranks on one GPU)."""
    model_path: str | None = None
    """Where the final model goes (``*.pt``: the unsplit model's state dict, plus ``*.hf/``
    for a transformers job), written before the checkpoints go; None: nowhere."""
    instance_memory_gb: float | None = None
    """Per-instance memory budget, GB, in place of this machine's memory (the profile's): only
    configurations whose every stage fits it are planned, and an agent refuses a stage over it
    (``JobRequest.instance_memory_gb``); None: none."""
    network_gbps: float | None = None
    """The instances' link rate the planner assumes, Gb/s (``JobRequest.network_gbps``; agents
    on hosts whose links are shaped); None: the profile's."""
    loss_signal_delay_s: float | None = 0.0
    """Trace seconds from an instance's end until the emulated provider's list reports it and
    the coordinator is told (None: never, heartbeats alone tell; 0: at once)."""
    fork_agents: bool = True
    """Fork the agents from one process that imported torch (:mod:`liveput.cloud.agent_forks`);
    False: each a new interpreter that imports it, as a booting instance does (a benchmark)."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.steps < 1:
            raise LiveputError("train: --workers and --steps must be >= 1")
        if self.keep_checkpoints < 1:
            raise LiveputError("train: --keep-checkpoints must be >= 1")
        if self.time_scale <= 0 or self.notice_lead_s < 0 or self.timeout_s <= 0:
            raise LiveputError("train: --time-scale must be positive and the notice lead >= 0")
        if self.notice_margin_s is not None and self.notice_margin_s < 0:
            raise LiveputError(f"train: --notice-margin must be >= 0, got {self.notice_margin_s:g}")
        if self.heartbeat_timeout_s is not None and self.heartbeat_timeout_s <= 0:
            raise LiveputError(
                f"train: --heartbeat-timeout must be positive, got {self.heartbeat_timeout_s:g}"
            )
        check_loss_signal_delay(self.loss_signal_delay_s, "train")
        check_device_request(self.device, "train")
        check_instance_memory_gb(self.instance_memory_gb, "train: --instance-memory-gb")


@dataclass
class TrainingResult:
    """What a local run did (the ``--json`` document)."""

    steps_completed: int
    samples: int
    initial_loss: float | None
    final_loss: float | None
    preemptions: int
    allocations: int
    migrations: dict[str, int]
    steps_rolled_back: int
    exactly_once: bool
    wall_s: float
    log_dir: str = ""
    """Where the agents' logs are."""
    steps: list[dict] = field(default_factory=list)
    """Per-step records (the JSONL log), not in the JSON summary."""
    events: list[dict] = field(default_factory=list)
    """The coordinator's plans (time, reason, kind, configuration)."""
    deadline: dict | None = None
    """A deadline job's figures (``deadline_met``, ``finished_hours``, dollars), else None."""
    devices: dict[str, str] = field(default_factory=dict)
    """The device each instance trained on (instance id -> ``cpu``, ``cuda:0 (NVIDIA ...)``)."""
    device: str = "cpu"
    """The device the job was profiled and planned on (this machine's, as asked)."""
    model: str | None = None
    """The final model's state-dict file (None: not written)."""
    checkpoints_failed: int = 0
    """Checkpoint writes that failed, on any instance (each is an event in the store)."""
    evaluations: list[dict] = field(default_factory=list)
    """The job's evaluations (``Job.evaluate``), by 0-based step: ``step``, ``metrics`` (or
    ``error``), the ``instance`` that ran it and its ``eval_s``; also in ``steps``' records."""

    def summary(self) -> dict:
        data = {k: v for k, v in self.__dict__.items() if k not in ("steps", "events", "deadline")}
        data.update(self.deadline or {})
        data["plans"] = self.events
        return data


DEFAULT_TRACE_HOURS = 5 / 60
"""``liveput train``'s trace when none is given: a generated 5-minute one."""


def default_trace(workers: int, seed: int) -> Trace:
    """The trace of a run given none: ``workers`` instances, :data:`DEFAULT_TRACE_HOURS`,
    generated from ``seed``."""
    from liveput.traces import generate_trace

    return generate_trace(workers, DEFAULT_TRACE_HOURS, seed)


def detection_times_s(config: LocalTrainingConfig) -> tuple[float, float]:
    """(heartbeat timeout, how long agents outlive a silent store), wall seconds: the user's
    detection time, or two decision intervals (at least 3 s); the store-outage limit is never
    shorter than that default, so a short detection time does not end agents at a store hiccup."""
    return job_request(config, config.checkpoint_dir or "").detection_times_s()


def job_request(config: LocalTrainingConfig, checkpoint_dir: str, initial: int = 1) -> JobRequest:
    """The job a local run asks for (:mod:`liveput.launch.assemble`): the agents share this
    machine, and one decision interval is one trace minute."""
    return JobRequest(
        config.model,
        config.steps,
        checkpoint_dir,
        data=config.data,
        checkpoint_every=config.checkpoint_every,
        keep_checkpoints=config.keep_checkpoints,
        training=config.training,
        device=config.device,
        policy=config.policy,
        capacity=config.workers,
        initial_workers=max(1, initial),
        time_scale=config.time_scale,
        heartbeat_timeout_s=config.heartbeat_timeout_s,
        notice_margin_s=config.notice_margin_s,
        local=True,
        deadline=config.deadline,
        on_demand_on_top=True,
        instance_memory_gb=config.instance_memory_gb,
        network_gbps=config.network_gbps,
    )


LauncherFactory = Callable[[list[str], Mapping[str, str], Path], Launcher]
"""Builds the agents' launcher from their command line, environment (the job token included)
and log directory."""


def run_local_training(
    config: LocalTrainingConfig,
    trace: Trace | IntervalTrace,
    on_progress: Callable[[Progress], None] | None = None,
    on_tick: Callable[[Coordinator, bool], None] | None = None,
    launcher_factory: LauncherFactory | None = None,
) -> TrainingResult:
    """Train ``config.model`` on the emulated cloud replaying ``trace``; blocks until done.

    ``on_tick(coordinator, done)`` is called after every tick of the coordinator (``done``: the
    last one), in its thread; a LiveputError it raises ends the run. ``launcher_factory``
    starts the agents instead of this machine's processes (a test bed's hosts; ``fork_agents``
    must then be off)."""
    if launcher_factory is not None and config.fork_agents:
        raise ValueError("run_local_training: a launcher_factory starts agents without forks")
    started = time.monotonic()
    token = run_token(config.token or os.environ.get("LIVEPUT_TOKEN"), config.checkpoint_dir)
    # A CUDA request on a machine without CUDA: one line, before anything starts.
    device = resolve_device(config.device, "train")
    log_dir = _log_dir(config)
    if config.checkpoint_dir is not None:  # every checkpoint would fail there: refuse now
        check_writable_url(config.checkpoint_dir, "train: --checkpoint-dir")
    agent_env = {**os.environ, "LIVEPUT_TOKEN": token}
    # The agents' fork server first: it imports torch while the job is assembled (a process's
    # later jobs find it ready).
    forks = shared_fork_server(agent_env) if config.fork_agents else None
    with scratch_folder() as scratch:
        checkpoint_dir = config.checkpoint_dir or str(Path(scratch) / "checkpoints")
        store, url = _open_store(config, token)
        cloud: LocalCloud | None = None
        finished = False
        try:
            request = job_request(config, checkpoint_dir, _initial_count(trace))
            assembled = _assemble(store, request, trace, device)
            keep_token(config.checkpoint_dir, token)
            launcher = (
                command_launcher(
                    agent_command(url), env=agent_env, log_dir=log_dir, fork_server=forks
                )
                if launcher_factory is None
                else launcher_factory(agent_command(url), agent_env, log_dir)
            )
            notice_dir = Path(scratch) / "notices"
            notice_dir.mkdir()
            cloud = LocalCloud(
                trace,
                launcher,
                MonotonicClock(),
                notice_dir,
                workers=config.workers,
                time_scale=config.time_scale,
                notice_lead_s=config.notice_lead_s,
                seed=config.seed,
                instance_type=None if config.deadline is None else config.deadline.instance_type,
                loss_signal_delay_s=config.loss_signal_delay_s,
            )
            run = _LocalRun(store, cloud, config, started, on_progress, on_tick)
            run.drive(assembled)
            report = verify_ledger(store, assembled.job.global_batch_size, config.steps)
            result = run.result(report, assembled.job.global_batch_size, log_dir, device)
            result.evaluations = gather_evaluations(
                store, assembled.job, config.steps, config.timeout_s, cloud, started
            )
            attach_evaluations(result.steps, result.evaluations)
            result.checkpoints_failed = final_weights_written(store, "train")
            if config.model_path is not None:
                export_final(checkpoint_dir, assembled.job.layers, Path(config.model_path))
                result.model = config.model_path
            finished = True
            return result
        except LiveputError as error:  # one line, saying where to look
            raise LiveputError(f"{error}; agents' logs in {log_dir}") from None
        finally:
            if cloud is not None:
                if finished:
                    _wait_agents(cloud)
                else:  # interrupted or failed: stop every agent now, not after a grace
                    cloud.close()
            store.close()


class _LocalRun:
    """The coordinator's loop over the emulated cloud, and what it saw."""

    def __init__(
        self,
        store: Store,
        cloud: LocalCloud,
        config: LocalTrainingConfig,
        started_s: float,
        on_progress: Callable[[Progress], None] | None,
        on_tick: Callable[[Coordinator, bool], None] | None,
    ) -> None:
        self.store, self.cloud, self.config, self.started_s = store, cloud, config, started_s
        self.on_progress, self.on_tick = on_progress, on_tick
        self.devices: dict[str, str] = {}
        self.earlier = EarlierCoordinators()
        """What the job's earlier coordinators spent (a resumed deadline job's)."""
        self.ended_seen: set[int] = set()
        """Instances whose end the cloud reported and this run has looked at (``tell_gone``)."""
        self.cloud_started_s = self.devices_read_s = 0.0

    def drive(self, assembled: AssembledJob) -> None:
        """Start the cloud and run the coordinator until the job is done."""
        cloud, interval_s = self.cloud, assembled.config.interval_s
        assert assembled.profile is not None  # a local job is profiled before it is assembled
        # A trace's instances start before the coordinator (it waits for them); a deadline
        # job's market is the coordinator's to drive, so its cloud starts once it exists.
        if cloud.market is None:
            cloud.start_background(interval_s)
        self.cloud_started_s = time.monotonic()
        coordinator = Coordinator(
            self.store,
            assembled.profile,
            assembled.config,
            deadline=assembled.deadline,
            market=cloud.market,
        )
        self.earlier = coordinator.objective.earlier
        if cloud.market is not None:
            cloud.start_background(interval_s)
            self.cloud_started_s = time.monotonic()
        coordinator.run(self._upkeep)
        if cloud.market is not None:
            cloud.finish()
        self._tick(coordinator, True)
        _record_devices(self.store, self.devices)

    def _upkeep(self, coordinator: Coordinator) -> None:
        """After each of the coordinator's ticks: what the cloud ended, the devices, progress,
        the time limit."""
        tell_gone(self.store, self.cloud.ended_instances(), self.ended_seen)
        if time.monotonic() - self.devices_read_s >= 1.0:
            _record_devices(self.store, self.devices)
            self.devices_read_s = time.monotonic()
        self._tick(coordinator, False)
        if time.monotonic() - self.started_s > self.config.timeout_s:
            raise LiveputError(
                f"train: not done after {self.config.timeout_s:g} s ({coordinator.status})"
            )

    def _tick(self, coordinator: Coordinator, done: bool) -> None:
        if self.on_progress is not None:
            self.on_progress(read_progress(self.store, coordinator, self.cloud_started_s))
        if self.on_tick is not None:
            self.on_tick(coordinator, done)

    def result(
        self, report: LedgerReport, global_batch_size: int, log_dir: Path, device: str
    ) -> TrainingResult:
        stats = readers.migrations(self.store)
        losses = [r["loss"] for r in report.records]
        deadline = self.config.deadline
        return TrainingResult(
            steps_completed=report.steps_applied,
            samples=report.steps_applied * global_batch_size,
            initial_loss=losses[0] if losses else None,
            final_loss=losses[-1] if losses else None,
            preemptions=self.cloud.preemptions,
            allocations=self.cloud.allocations,
            migrations={kind: stats.get(kind, 0) for kind in MIGRATION_KINDS},
            steps_rolled_back=report.steps_rolled_back,
            exactly_once=report.exactly_once,
            wall_s=round(time.monotonic() - self.started_s, 2),
            log_dir=str(log_dir),
            steps=report.records,
            events=readers.events(self.store),
            deadline=None if deadline is None else self.cloud.summary(deadline, self.earlier),
            devices=dict(sorted(self.devices.items(), key=lambda kv: int(kv[0]))),
            device=describe_device(device),
        )


def _log_dir(config: LocalTrainingConfig) -> Path:
    log_dir = Path(config.log_dir)
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LiveputError(
            f"train: cannot create the log directory {log_dir}: {error.strerror}"
        ) from None
    LOG.info("agents' logs: %s", log_dir)
    return log_dir


def _open_store(config: LocalTrainingConfig, token: str) -> tuple[Store, str]:
    """The job's store (a TCPStore hosted here unless ``store_url`` names another) and its URL."""
    url = config.store_url or "tcp://127.0.0.1:0"
    opened = open_job_store(StorePlace(url, host=url.startswith("tcp://")), token)
    return opened.store, opened.url


def _assemble(
    store: Store, request: JobRequest, trace: Trace | IntervalTrace, device: str
) -> AssembledJob:
    """The job assembled and its spec published, with its profile kept in the store (a resumed
    job plans with the profile it started with) measured on the device the agents train on;
    refused in one line when no configuration fits the instances' memory (or budget)."""
    from liveput.runtime.planning import require_a_fit_before_start

    precision = None if request.training is None else request.training.precision
    profile = job_profile(store, request.model, request.data, device, precision)
    assembled = assemble_job(request, trace=trace, profile=profile)
    if assembled.deadline is None:
        # A model (or memory budget) no configuration fits: one line before any agent starts
        # (the coordinator would refuse it as it starts, after the cloud).
        assert assembled.profile is not None
        require_a_fit_before_start(assembled.profile, assembled.config.capacity)
    publish_spec(store, assembled.spec)
    return assembled


def warn_idle_gpus(instance_type: str, device: str) -> None:
    """Warn (the emulated provider bills them) when the agents leave GPUs of
    ``instance_type`` idle, training on ``device`` here."""
    from liveput.catalog import load_catalog

    spec = load_catalog("aws").get(instance_type)
    message = idle_gpus_message(spec.name, spec.gpus, spec.gpu, device)
    if message is not None:
        LOG.warning("%s", message)


def _record_devices(store: Store, devices: dict[str, str]) -> None:
    """Add the device of every instance registered now (``members/<id>``) to ``devices``."""
    for instance, raw in readers.by_instance(store, keys.MEMBER).items():
        try:
            device = json.loads(raw).get("device")
        except (ValueError, AttributeError):
            continue
        if device:
            devices[str(instance)] = device


def _initial_count(trace: Trace | IntervalTrace) -> int:
    return int(trace.initial_count if isinstance(trace, Trace) else trace.count[0])


def _wait_agents(cloud: LocalCloud, grace_s: float = 15.0) -> None:
    """Let finished agents exit by themselves, then stop the cloud (which kills the rest)."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and cloud.agents_running:
        time.sleep(0.2)
    cloud.close()
