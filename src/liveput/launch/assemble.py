"""The one assembly of a job: what ``liveput train``, ``liveput launch`` and ``liveput coordinator``
hand the runtime.

Each entry point turns its options (or job file) into a :class:`JobRequest`;
:func:`assemble_job` resolves the job and builds, from one set of defaults (:data:`DEFAULTS`),
the :class:`~liveput.runtime.launch.JobSpec` the coordinator publishes for the agents, the
coordinator's :class:`~liveput.runtime.coordinator.CoordinatorConfig` and, for a deadline job,
the deadline policy's context. Where the entry points legitimately differ, the request says how
(its ``time_scale``: an emulated cloud replays trace time faster than the wall clock), never a
second default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from liveput.errors import LiveputError

if TYPE_CHECKING:
    from liveput.launch.deadline import DeadlineJob
    from liveput.models.job import Job
    from liveput.models.training import TrainingConfig
    from liveput.perf.types import ModelProfile
    from liveput.policies.deadline import DeadlineContext
    from liveput.runtime.coordinator import CoordinatorConfig
    from liveput.runtime.launch import JobSpec
    from liveput.traces import IntervalTrace, Trace

__all__ = ["DEFAULTS", "AssembledJob", "JobDefaults", "JobRequest", "assemble_job"]


@dataclass(frozen=True)
class JobDefaults:
    """The defaults every entry point of a job shares (wall seconds unless said)."""

    start_grace_s: float = 30.0
    """Longest wait for the instances asked for before the first plan. An agent registers only
    once Python and PyTorch are imported and its store answers: a few seconds on an idle
    machine, tens of seconds when several start at once on a small one (``liveput train``'s
    agents share its cores; a cloud's instances boot at their own pace). Waiting longer costs
    only when an instance never comes, once per job; starting short of instances costs a
    reconfiguration as soon as they come, so the longest of the three values that had drifted
    apart (10, 20 and 30 s) is the one kept."""
    heartbeat_timeout_s: float = 3.0
    """Silence after which an agent is taken for dead in real time (``liveput coordinator``),
    and the least it is anywhere."""
    detection_intervals: float = 2.0
    """Under an emulated time scale the heartbeat timeout is this many decision intervals (at
    least :attr:`heartbeat_timeout_s`): the agents share this machine's cores with the
    coordinator and the store, and a short timeout would take a busy one for dead."""
    notice_margin_s: float | None = None
    """A noticed instance trains until this long before the end its notice announces (it must
    cover the move off it); None (``auto``): from the moves the job measures
    (:attr:`liveput.runtime.coordinator.CoordinatorConfig.notice_margin_s`)."""
    store_outage_s: float = 120.0
    """How long an agent rides out a store it cannot reach (an etcd restarting)."""
    interval_s: float = 60.0
    """Seconds of (trace) time between two decisions."""
    checkpoint_every: int = 10
    """K: checkpoint every K steps."""
    keep_checkpoints: int = 2
    """Complete checkpoints kept on disk (the newest)."""
    device: str = "auto"
    """What the agents train on."""
    policy: str = "liveput"
    """The policy deciding the configuration."""


DEFAULTS = JobDefaults()
"""The one set of defaults of a job (:func:`assemble_job`, the CLI's options, the job file)."""


@dataclass(frozen=True)
class JobRequest:
    """What an entry point asks for (its options or job file, checked)."""

    model: str
    """Built-in job or ``module:function``."""
    steps: int
    """Steps to train."""
    checkpoint_dir: str
    """Checkpoint directory or fsspec URL every agent reaches."""
    data: str | None = None
    """The file a built-in job that takes ``--data`` trains on."""
    checkpoint_every: int = DEFAULTS.checkpoint_every
    """K: checkpoint every K steps (0: none)."""
    keep_checkpoints: int = DEFAULTS.keep_checkpoints
    """Complete checkpoints kept on disk."""
    training: TrainingConfig | None = None
    """Precision, clipping, schedule, ... (None: the job's own)."""
    device: str = DEFAULTS.device
    """``auto``, ``cpu``, ``cuda`` or ``cuda:K``."""
    policy: str = DEFAULTS.policy
    """Policy deciding the configuration (a deadline job's is its deadline policy)."""
    capacity: int = 8
    """Most instances available (spot and on-demand)."""
    initial_workers: int = 1
    """Instances to wait for before the first plan (at most ``start_grace_s``)."""
    time_scale: float = 1.0
    """Trace seconds per wall second: 1 on a real cloud; ``liveput train`` replays a trace
    faster. Decisions come every ``interval_s / time_scale`` wall seconds."""
    interval_s: float = DEFAULTS.interval_s
    """Trace seconds between two decisions."""
    start_grace_s: float = DEFAULTS.start_grace_s
    """Longest wait for ``initial_workers``, wall seconds."""
    heartbeat_timeout_s: float | None = None
    """Wall seconds of silence before an agent is dead (None: :data:`DEFAULTS`, which scales
    with the decision interval under a time scale other than 1)."""
    notice_margin_s: float | None = DEFAULTS.notice_margin_s
    """Wall seconds before a noticed instance's announced end at which the job moves off it
    (None: ``auto``)."""
    local: bool = False
    """The agents, the store and the coordinator share this machine (``liveput train``,
    ``liveput launch``): the agents spread over its GPUs, the heartbeat timeout defaults to
    decision intervals (a busy agent is not taken for dead), the store dies with this process,
    and every step's ledger record is kept (the run's per-step log is written from them)."""
    deadline: DeadlineJob | None = None
    """A deadline job: its deadline policy decides and rents on-demand instances."""
    on_demand_on_top: bool = False
    """A deadline job's on-demand instances come on top of ``capacity`` (``liveput train``:
    its capacity is the trace's spot workers); else ``capacity`` counts them already."""
    instance_memory_gb: float | None = None
    """Per-instance memory budget, GB (``--instance-memory-gb``, the job file's
    ``instance_memory_gb``): the planner takes it for the instances' memory, so only
    configurations whose every stage fits it run, and an agent refuses a stage over it; None:
    the memory of the instances the profile was measured on."""
    network_gbps: float | None = None
    """The instances' link rate, Gb/s each way, that the planner assumes (an emulated cluster
    whose links are shaped: ``bench peers --regime pipeline``); None: the rate of the
    instances the profile was measured on."""

    def __post_init__(self) -> None:
        if self.steps < 1 or self.capacity < 1 or self.initial_workers < 1:
            raise LiveputError("job: steps, capacity and initial workers must be >= 1")
        if not self.time_scale > 0 or not self.interval_s > 0:
            raise LiveputError("job: the time scale and the decision interval must be positive")
        if (self.notice_margin_s is not None and self.notice_margin_s < 0) or (
            self.start_grace_s < 0
        ):
            raise LiveputError(
                f"job: --notice-margin and --start-grace must be >= 0, got "
                f"{self.notice_margin_s} and {self.start_grace_s:g}"
            )
        if self.heartbeat_timeout_s is not None and not self.heartbeat_timeout_s > 0:
            raise LiveputError(
                f"job: --heartbeat-timeout must be positive, got {self.heartbeat_timeout_s:g}"
            )
        if self.instance_memory_gb is not None and not (
            math.isfinite(self.instance_memory_gb) and self.instance_memory_gb > 0
        ):
            raise LiveputError(
                f"job: --instance-memory-gb must be a finite number > 0, "
                f"got {self.instance_memory_gb:g}"
            )
        if self.network_gbps is not None and not (
            math.isfinite(self.network_gbps) and self.network_gbps > 0
        ):
            raise LiveputError(
                f"job: the network rate must be a finite number of Gb/s > 0, "
                f"got {self.network_gbps:g}"
            )

    @property
    def wall_interval_s(self) -> float:
        """Wall seconds between two decisions."""
        return self.interval_s / self.time_scale

    def detection_times_s(self) -> tuple[float, float]:
        """(heartbeat timeout, how long agents outlive a silent store), wall seconds.

        Apart: the request's or :data:`DEFAULTS`' timeout, and the default outage. On one
        machine: two decision intervals (at least the default), and the store dies with this
        process, so agents outlive it that long (never shorter, so that a short detection time
        does not end agents at a store hiccup)."""
        if not self.local:
            return self.heartbeat_timeout_s or DEFAULTS.heartbeat_timeout_s, DEFAULTS.store_outage_s
        scaled_s = max(
            DEFAULTS.heartbeat_timeout_s, DEFAULTS.detection_intervals * self.wall_interval_s
        )
        heartbeat_s = self.heartbeat_timeout_s or scaled_s
        return heartbeat_s, max(scaled_s, heartbeat_s)


@dataclass(frozen=True)
class AssembledJob:
    """A job ready to run: what the coordinator publishes and runs with."""

    job: Job
    """The resolved job (with the request's training options)."""
    spec: JobSpec
    """What every agent must agree on (published in the store)."""
    config: CoordinatorConfig
    """The coordinator's settings."""
    profile: ModelProfile | None = None
    """The profile the coordinator plans with (the one given, with the job's activation
    checkpointing, the layers being measured without recomputation, and the job's memory budget
    for the instances' memory); None: none was given, the coordinator measures or reads one
    (:func:`~liveput.runtime.launch.run_coordinator`)."""
    deadline: DeadlineContext | None = None
    """A deadline job's policy context, else None."""


def assemble_job(
    request: JobRequest,
    *,
    profile: ModelProfile | None = None,
    trace: Trace | IntervalTrace | None = None,
    prices_usd_per_hour: tuple[float, float] | None = None,
) -> AssembledJob:
    """The job of ``request``, ready to run.

    ``profile``: the job's measured one (the coordinator's, kept in the store). A deadline job
    needs it (its policy plans with it) and the spot ``trace`` it expects; its
    ``prices_usd_per_hour`` (spot, on-demand) are a provider's quote, else the catalog's."""
    # Imported here: the CLI imports this module for its defaults, and these import PyTorch.
    from liveput.launch.deadline import deadline_context
    from liveput.models.jobs import resolve_job
    from liveput.perf.costs import MigrationCostModel
    from liveput.perf.types import with_network
    from liveput.runtime.coordinator import CoordinatorConfig
    from liveput.runtime.launch import JobSpec, comm_timeout_s
    from liveput.runtime.planning import planning_profile
    from liveput.runtime.prune import PruneConfig

    job = resolve_job(request.model, request.data)
    if request.training is not None:
        job = dataclasses.replace(job, training=request.training)
    if profile is not None:
        profile = with_network(
            planning_profile(profile, job, request.instance_memory_gb), request.network_gbps
        )
    heartbeat_timeout_s, outage_s = request.detection_times_s()
    spec = JobSpec(
        request.model,
        request.checkpoint_dir,
        request.checkpoint_every,
        device=request.device,
        shared_gpu=request.local,
        store_outage_s=outage_s,
        keep_checkpoints=request.keep_checkpoints,
        training=None if request.training is None else request.training.to_dict(),
        data=request.data,
        notice_margin_s=request.notice_margin_s,
        instance_memory_gb=request.instance_memory_gb,
        comm_timeout_s=comm_timeout_s(_model_state_bytes(job), request.network_gbps),
    )
    config = CoordinatorConfig(
        num_steps=request.steps,
        num_micro_batches=job.num_micro_batches,
        interval_s=request.wall_interval_s,
        policy_interval_s=request.interval_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        capacity=request.capacity,
        notice_margin_s=request.notice_margin_s,
        initial_workers=request.initial_workers,
        start_grace_s=request.start_grace_s,
        policy=request.policy if request.deadline is None else request.deadline.policy,
        prune=PruneConfig(fold_ledger=not request.local),
        instance_memory_gb=request.instance_memory_gb,
    )
    if request.network_gbps is not None:
        # The policy weighs a move at the links' rate, as the simulator's policies do (their
        # costs read the profile's instance type): at the default 10 Gb/s a gpt2-small stage
        # over 100 Mbit/s looked 0.2 s away where it took 21.
        # A checkpoint is written and read through the same links (an object store is reached
        # through the instance's network card): no faster than they carry it.
        costs = MigrationCostModel(
            network_gbps=request.network_gbps,
            checkpoint_bandwidth_bytes_per_s=min(
                MigrationCostModel.checkpoint_bandwidth_bytes_per_s,
                request.network_gbps * 1e9 / 8,
            ),
        )
        config = dataclasses.replace(config, costs=costs)
    deadline = None
    if request.deadline is not None:
        if profile is None or trace is None:
            raise LiveputError("a deadline job needs the job's profile and a spot trace")
        deadline = deadline_context(
            trace,
            profile,
            request.deadline,
            request.steps,
            request.time_scale,
            interval_s=request.interval_s,
            prices_usd_per_hour=prices_usd_per_hour,
        )
        if request.on_demand_on_top:
            config = dataclasses.replace(config, capacity=request.capacity + deadline.on_demand_max)
    return AssembledJob(job, spec, config, profile, deadline)


OPTIMIZER_STATE_FACTOR = 3
"""The state that moves with a layer, in multiples of its weights: the weights and Adam's two
moments (an upper bound for other optimizers: SGD with momentum holds less)."""


def _model_state_bytes(job: Job) -> float:
    weights = sum(p.numel() * p.element_size() for layer in job.layers for p in layer.parameters())
    return float(OPTIMIZER_STATE_FACTOR * weights)
