"""Sim-to-real: the simulator's prediction of what the runtime trains on the benchmark's trace.

The simulator gets what ``bench runtime`` measures on this machine for the job: the per-layer
profile (:func:`liveput.runtime.planning.profile_job`, the throughput table the runtime's own
coordinator plans with) and the migration costs (:func:`bench.bench_runtime.downtimes`: an
intra-stage move's rendezvous and group rebuild, a checkpoint restore, which is the runtime's
restart) and the start-up (wall seconds from the cloud starting an instance to its first step,
from the no-preemption run: process start, imports, building the job, the first plan).

What the first versions got wrong, measured against the runtime (``docs/peers.md``):

- *Throughput per instance count.* The benchmark runs up to four instances on this machine's
  two cores, so three or four instances train slower than two; the profile's table assumes a
  core per instance (140 samples/s on three where the runtime trains 81, and 98 on two). The
  runtime's samples/s with ``n`` instances and no preemption is measured for every ``n``; each
  configuration of ``n`` instances trains at the table's rate times
  ``measured(n) / table(best configuration of n)`` (:func:`measured_table`). The policy still
  plans with the profile's table, as the runtime's coordinator does (on real instances, each
  with its own accelerator, there is no such contention to plan for).
- *Time resolution.* Replayed in intervals of ``60 / time_scale`` s (five in a window), an
  instance counted only from the interval after it came, and one ready 2.6 s after the start
  of the trace trained from 30 s on. The runtime replans at every loss and arrival, so the
  trace is replayed in intervals of ``resolution_s`` trace seconds (default 2: one wall second
  at time scale 2); the policy is asked every interval, as the runtime asks it at every event.

- *The runtime learns.* Its coordinator re-fits the throughput table to the step times it
  measures, every decision interval (``60 / time_scale`` wall seconds), and plans with that
  (``perf.online``); here three or four instances measure slower than two, which the fit can
  only explain with compute at its lower bound and every second fixed per step, by which one
  instance is as fast as two (on p3-cut it then ran one of two instances). The simulator makes
  the same re-fits (:class:`~liveput.sim.engine.OnlineCalibration`, :func:`coordinator_fit`)
  from the step times of the configurations it has trained.

The notice lead is divided by the time scale like the trace, each instance ready to train only
its start-up after the trace gives it (``Trace.ready_after``), so the samples are those of the
same wall-clock window.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from liveput.models.jobs import resolve_job
from liveput.perf.costs import MigrationCostModel
from liveput.perf.estimator import estimate_configs
from liveput.perf.online import refit
from liveput.perf.types import (
    ConfigTable,
    Measurement,
    ModelProfile,
    with_instance_memory,
    with_network,
)
from liveput.runtime.planning import profile_job
from liveput.sim.config import SimulationConfig
from liveput.sim.engine import OnlineCalibration, make_context, simulate_policy
from liveput.traces import IntervalTrace, Trace

POLICIES = {"liveput": "liveput", "liveput-restart": "reactive"}
"""Benchmark system -> the simulator's policy it executes."""


@dataclass(frozen=True)
class Measured:
    """What this machine measured for the job."""

    profile: ModelProfile
    """Per-layer times and sizes (the throughput table comes from it)."""
    costs: MigrationCostModel
    """Migration costs with the measured rebuild and restart."""
    downtimes_s: dict[str, float]
    """Measured seconds per migration kind (``bench runtime``'s table), and ``start-up``."""
    startup_s: float = 0.0
    """Wall seconds from the cloud starting an instance to its first step."""
    samples_per_s_by_count: Mapping[int, float] = field(default_factory=dict)
    """The runtime's samples/s with ``n`` instances and no preemption, measured here past each
    run's warm-up (:func:`bench.peers_rates.steady_rate`; empty: the profile's table as it
    is)."""


def measured_table(table: ConfigTable, samples_per_s_by_count: Mapping[int, float]) -> ConfigTable:
    """``table`` with every configuration of ``n = D * P`` instances scaled by the measured
    samples/s of ``n`` over the table's best configuration of ``n`` (``n`` not measured: as
    it is). The table's choice among configurations of ``n`` stays; their level is what this
    machine gives ``n`` instances (contention for its cores included)."""
    rates = table.samples_per_s.astype(float).copy()
    used = table.data_parallel * table.pipeline_stages
    for count, measured in samples_per_s_by_count.items():
        same = (used == count) & table.feasible
        if not same.any() or measured <= 0:
            continue
        best = float(rates[same].max())
        if best > 0:
            rates[same] *= measured / best
    return dataclasses.replace(table, samples_per_s=rates)


def measure(
    job_name: str,
    startup_s: float,
    samples_per_s_by_count: Mapping[int, float] | None = None,
    instance_memory_gb: float | None = None,
    link_mbit: float | None = None,
    object_store: bool = False,
) -> Measured:
    """Profile the job and time its migrations here (about a minute on two idle cores);
    ``startup_s`` and the samples/s per instance count are measured by the caller (runs
    with no preemption). The profile plans for instances of ``instance_memory_gb`` and moves
    state over links of ``link_mbit`` where the benchmark gives them (the migrations timed here
    run over loopback: their fixed part is what they measure). With ``object_store`` the
    checkpoints cross those links too: a restore's stages read their shares at once, each
    through its own link, so the storage's bandwidth is a link's times the fewest stages of
    any configuration that fits."""
    import torch

    from bench.bench_runtime import downtimes

    # One thread, as every instance runs: with two on a busy two-core machine the profile came
    # out about ten times slower than the runtime's steps (the simulator predicted 7 % of them).
    torch.set_num_threads(1)
    job = resolve_job(job_name)
    profile = with_network(
        with_instance_memory(profile_job(job), instance_memory_gb),
        None if link_mbit is None else link_mbit / 1000,
    )
    with tempfile.TemporaryDirectory(prefix="peers-costs-") as directory:
        measured = downtimes(job, directory)
    costs = MigrationCostModel(
        network_gbps=profile.instance_type.network_gbps,
        rebuild_base_s=measured.get("intra-stage", 1.5),
        rebuild_per_node_s=0.0,
        checkpoint_latency_s=0.05,
        measured_restart_s=measured.get("checkpoint-restore"),
        **_object_store_costs(profile, link_mbit, max(samples_per_s_by_count or {}, default=1))
        if object_store and link_mbit is not None
        else {},
    )
    return Measured(
        profile,
        costs,
        {**measured, "start-up": startup_s},
        startup_s,
        dict(samples_per_s_by_count or {}),
    )


def _object_store_costs(profile: ModelProfile, link_mbit: float, instances: int) -> dict:
    table = estimate_configs(profile, max(instances, 1))
    stages = table.pipeline_stages[table.feasible]
    readers = int(stages.min()) if stages.size else 1
    return {"checkpoint_bandwidth_bytes_per_s": link_mbit * 1e6 / 8 * readers}


def wall_clock_trace(trace: Trace, time_scale: float, resolution_s: float = 2.0) -> IntervalTrace:
    """The trace in intervals of ``resolution_s`` trace seconds, each relabelled as the
    ``resolution_s / time_scale`` wall seconds it is replayed in."""
    intervals = trace.resample(resolution_s)
    return dataclasses.replace(intervals, interval_s=resolution_s / time_scale)


def coordinator_fit(
    profile: ModelProfile, capacity: int
) -> Callable[[tuple[Measurement, ...]], ConfigTable]:
    """What the runtime's coordinator plans with once it has measured step times: the table
    of ``perf.online.refit``'s constants (``runtime.coordinator.upkeep.refitted``)."""

    def fit(measurements: tuple[Measurement, ...]) -> ConfigTable:
        return estimate_configs(profile, capacity, refit(profile, measurements))

    return fit


def upper_bound(
    trace: Trace,
    startup_s: float,
    samples_per_s_by_count: Mapping[int, float],
    time_scale: float,
    resolution_s: float = 2.0,
) -> float:
    """Samples no system trains more than on ``trace`` here: in every interval, every instance
    the trace holds at any moment of it (ready its start-up after it came, as for the
    simulator) trains at the best measured rate of at most that many instances, with no
    migration, restart, notice margin or lost step. The rates are liveput's, measured with no
    preemption; a peer faster per step (torchrun's DDP, by the no-preemption runs) could pass it
    by that much."""
    intervals = wall_clock_trace(
        trace.ready_after(startup_s * time_scale), time_scale, resolution_s
    )
    present = intervals.count + intervals.allocated
    # best[n]: the best rate of at most n instances (an instance may sit idle).
    best = np.maximum.accumulate(
        [0.0]
        + [
            float(samples_per_s_by_count.get(n, 0.0))
            for n in range(1, int(present.max(initial=0)) + 1)
        ]
    )
    return float(best[present].sum() * intervals.interval_s)


def look_ahead_intervals(time_scale: float, interval_s: float) -> int:
    """The simulator's horizon, in its intervals of ``interval_s`` wall seconds, that looks as
    far ahead as the runtime's coordinator does (its horizon of decision intervals of ``60 /
    time_scale`` wall seconds). Twelve of the simulator's short intervals looked 16 s ahead in
    the pipeline regime, where moving a stage takes 13 to 40 s: no move paid for itself within
    the horizon, and after a loss the simulated job ran nothing, then restored the checkpoint."""
    from liveput.runtime.coordinator_config import CoordinatorConfig

    look_ahead_s = CoordinatorConfig.horizon * 60.0 / time_scale
    return max(1, round(look_ahead_s / interval_s))


def predict(
    trace: Trace,
    measured: Measured,
    time_scale: float,
    notice_lead_s: float,
    seed: int,
    checkpoint_every_s: float = 0.0,
    resolution_s: float = 2.0,
) -> dict[str, float]:
    """Samples the simulator predicts, per benchmark system it shares with the runtime, whose
    instances checkpoint every ``checkpoint_every_s`` wall seconds and keep buddy copies."""
    intervals = wall_clock_trace(
        trace.ready_after(measured.startup_s * time_scale), time_scale, resolution_s
    )
    config = SimulationConfig(
        interval_s=intervals.interval_s,
        seed=seed,
        predictor="persistence",
        preemption_notice_s=notice_lead_s / time_scale,
        horizon=look_ahead_intervals(time_scale, intervals.interval_s),
        buddy_copies=True,
        checkpoint_every_s=checkpoint_every_s,
    )
    context = dataclasses.replace(
        make_context(intervals, measured.profile, config), costs=measured.costs
    )
    actual = measured_table(context.table, measured.samples_per_s_by_count)
    learn = OnlineCalibration(
        every_s=60.0 / time_scale, fit=coordinator_fit(measured.profile, int(intervals.max_count))
    )
    predicted = {
        system: simulate_policy(
            intervals, measured.profile, policy, config, context, actual=actual, learn=learn
        ).samples
        for system, policy in POLICIES.items()
    }
    if measured.samples_per_s_by_count:
        predicted["bound"] = upper_bound(
            trace, measured.startup_s, measured.samples_per_s_by_count, time_scale, resolution_s
        )
    return predicted
