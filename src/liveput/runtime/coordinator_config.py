"""Settings of the coordinator's control loop (the rules they tune are in ``runtime.decide``,
which re-exports :class:`CoordinatorConfig` where it has always been imported from)."""

from __future__ import annotations

from dataclasses import dataclass, field

from liveput.errors import LiveputError
from liveput.perf.costs import MigrationCostModel
from liveput.perf.types import check_instance_memory_gb
from liveput.runtime.prune import PruneConfig


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of the control loop."""

    num_steps: int
    """Steps to train (the job ends after step ``num_steps - 1``)."""
    num_micro_batches: int
    """M of the job: D is at most M."""
    interval_s: float = 2.0
    """Wall seconds between two interval decisions."""
    policy_interval_s: float = 60.0
    """What an interval stands for in the policy's cost and throughput model, seconds (an
    emulated cloud replays trace time faster: ``interval_s * time_scale``). Policies get every
    time in these seconds."""
    tick_s: float = 0.2
    """Seconds between two observations of the store."""
    heartbeat_timeout_s: float = 3.0
    """An instance whose heartbeat has not moved for this long is dead (the fallback signal)."""
    notice_settle_s: float = 0.5
    """Instances going together (a cloud preempting several at once) are gathered for this long
    before planning, so that one migration handles them all."""
    arrival_settle_s: float = 0.5
    """An instance that registers outside the plan has the policy asked at once (Rule 7), once
    no other has registered for this long: instances booted together join in one move."""
    notice_margin_s: float | None = None
    """A noticed instance trains until this many wall seconds before the end its notice
    announces; then the job moves off it (the margin covers the gathering, the plan and the
    layer transfer). A notice whose lead is this or shorter, or that gives none, is acted on
    at once. None (``--notice-margin auto``): ``notice_margin_safety`` times the move the
    running plan would make, as this run measured it (from a plan's publication to its first
    step, the newest plan that moved layers), until then as predicted (a group rebuild and the
    largest stage's state over the links); at least ``notice_margin_min_s``
    (:func:`liveput.runtime.decide.notice_margin_s`)."""
    notice_margin_safety: float = 2.0
    """``--notice-margin auto``: the margin is this many times the move's measured or predicted
    seconds (a loaded machine's move may take twice its last)."""
    notice_margin_min_s: float = 2.0
    """``--notice-margin auto``: the margin is at least this, wall seconds (the notice's way to
    the coordinator, its tick, the gathering of notices that come together)."""
    jit_checkpoint_lead_s: float = 5.0
    """Rule 9: when every current holder of some layer has a notice, at most this many wall
    seconds (and at most ``notice_margin_s``) before the earliest end those notices announce,
    the running generation ends at the next step boundary and its instances checkpoint the step
    they end at, so the restore after them redoes no step. The lead covers the step in flight
    and the write of an instance's share of the checkpoint; once both are measured it is
    ``jit_checkpoint_safety`` times their sum (``decide.checkpoint_lead_s``, at most
    ``notice_margin_s``), and this until then. The lead is also the longest wait for that
    checkpoint."""
    jit_checkpoint_safety: float = 3.0
    """Rule 9's measured lead is this many times a step plus a checkpoint write (the newest
    measured of each): a loaded machine's step or write may take twice its median."""
    jit_checkpoint_min_lead_s: float = 1.0
    """Rule 9's measured lead is at least this, wall seconds: it also covers the notice's way
    to the coordinator and the coordinator's tick."""
    suspect_after_s: float = 1.5
    """A plan member silent this long while its plan fails or meets is suspect (three missed
    heartbeats: instances killed together are not all detected at the same tick)."""
    failure_wait_s: float = 3.0
    """After a failure report, the longest wait for the failing peer to be known before
    replanning without every member that has not reported, seconds."""
    arrival_timeout_s: float = 30.0
    """A member that has not arrived at its plan's start after this long is suspect, seconds."""
    restore_after_failures: int = 2
    """After this many plans in a row that failed before running, restore from the checkpoint."""
    stall_warning_s: float = 60.0
    """Warn (with the last plans and why they failed) when no step committed for this long."""
    initial_workers: int = 1
    """Instances to wait for before the first plan (or ``start_grace_s``, whichever first)."""
    start_grace_s: float = 10.0
    """Longest wait for ``initial_workers``, seconds."""
    start_settle_s: float = 5.0
    """The first plan waits no longer for ``initial_workers`` once no instance has registered
    for this long, seconds: instances booted together register within seconds of each other,
    and one that has not by then may never (preempted while it booted). The p3 cut of ``bench
    peers --regime pipeline`` lost two of eight that way, and the job waited 18 s of its 100-s
    window for them (``start_grace_s``); an instance that comes later joins as an arrival."""
    finish_wait_s: float = 10.0
    """Once the job is done, the longest wait for every live instance to say it saw that
    (the store may end with the coordinator), seconds."""
    capacity: int = 8
    """Instances requested from the cloud (the most that can ever be available)."""
    policy: str = "liveput"
    """Policy deciding the configuration (``liveput.policies``)."""
    predictor: str = "persistence"
    """Predictor behind a forecasting policy."""
    horizon: int = 6
    """Intervals looked ahead."""
    costs: MigrationCostModel = field(default_factory=MigrationCostModel)
    """Migration costs the policy plans with (calibrate from measured downtimes: docs)."""
    prune: PruneConfig = field(default_factory=PruneConfig)
    """How the store is pruned as the job runs (:mod:`liveput.runtime.prune`)."""
    online_calibration: bool = True
    """Re-fit the throughput table to the step times the agents measure, once per interval
    when they changed (``perf.online``; not for deadline jobs, whose policy owns its table)."""
    instance_memory_gb: float | None = None
    """The job's per-instance memory budget, GB (``--instance-memory-gb``): it replaces the
    profile's instance memory, so only configurations whose every stage fits it are planned
    (``perf.types.with_instance_memory``); None: the profile's own."""

    def __post_init__(self) -> None:
        if self.num_steps < 1 or self.num_micro_batches < 1:
            raise LiveputError("coordinator: num_steps and num_micro_batches must be >= 1")
        times = (
            self.interval_s,
            self.tick_s,
            self.heartbeat_timeout_s,
            self.policy_interval_s,
            self.suspect_after_s,
            self.failure_wait_s,
            self.arrival_timeout_s,
            self.stall_warning_s,
        )
        if min(times) <= 0 or self.finish_wait_s < 0:
            raise LiveputError("coordinator: intervals and timeouts must be positive")
        if (
            min(
                self.notice_settle_s,
                self.arrival_settle_s,
                self.start_grace_s,
                self.start_settle_s,
                0.0 if self.notice_margin_s is None else self.notice_margin_s,
                self.notice_margin_safety,
                self.notice_margin_min_s,
                self.jit_checkpoint_lead_s,
                self.jit_checkpoint_min_lead_s,
                self.jit_checkpoint_safety,
            )
            < 0
        ):
            raise LiveputError(
                "coordinator: notice and arrival settle, notice margin, checkpoint lead, "
                "safety and least lead, and start grace must be >= 0"
            )
        check_instance_memory_gb(self.instance_memory_gb, "coordinator: instance_memory_gb")
        if self.capacity < 1 or self.initial_workers < 1 or self.restore_after_failures < 1:
            raise LiveputError(
                "coordinator: capacity, initial_workers and restore_after_failures must be >= 1"
            )
