"""Sim-to-real: the simulator's prediction of what the runtime trains on the benchmark's trace.

The simulator gets what ``bench runtime`` measures on this machine for the job: the per-layer
profile (:func:`liveput.runtime.planning.profile_job`, the throughput table the runtime's own
coordinator plans with) and the migration costs (:func:`bench.bench_runtime.downtimes`: an
intra-stage move's rendezvous and group rebuild, a checkpoint restore, which is the runtime's
restart) and the start-up (wall seconds from the cloud starting an instance to its first step,
from the no-preemption run: process start, imports, building the job, the first plan). It
replays the trace in wall seconds at the benchmark's time scale: intervals of ``60 /
time_scale`` s, the notice lead divided likewise, each instance ready to train only its
start-up after the trace gives it (``Trace.ready_after``), so the samples are those of the
same wall-clock window.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass

from liveput.perf.costs import MigrationCostModel
from liveput.perf.types import ModelProfile
from liveput.runtime.job import resolve_job
from liveput.runtime.planning import profile_job
from liveput.sim.config import SimulationConfig
from liveput.sim.engine import make_context, simulate_policy
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


def measure(job_name: str, startup_s: float) -> Measured:
    """Profile the job and time its migrations here (about a minute on two idle cores);
    ``startup_s`` is measured by the caller (a no-preemption run's first step)."""
    import torch

    from bench.bench_runtime import downtimes

    # One thread, as every instance runs: with two on a busy two-core machine the profile came
    # out about ten times slower than the runtime's steps (the simulator predicted 7 % of them).
    torch.set_num_threads(1)
    job = resolve_job(job_name)
    profile = profile_job(job)
    with tempfile.TemporaryDirectory(prefix="peers-costs-") as directory:
        measured = downtimes(job, directory)
    costs = MigrationCostModel(
        network_gbps=profile.instance_type.network_gbps,
        rebuild_base_s=measured.get("intra-stage", 1.5), rebuild_per_node_s=0.0,
        checkpoint_latency_s=0.05,
        measured_restart_s=measured.get("checkpoint-restore"))
    return Measured(profile, costs, {**measured, "start-up": startup_s}, startup_s)


def wall_clock_trace(trace: Trace, time_scale: float) -> IntervalTrace:
    """The trace in 60-s intervals, each relabelled as the ``60 / time_scale`` wall seconds it
    is replayed in."""
    minutes = trace.resample(60.0)
    return dataclasses.replace(minutes, interval_s=60.0 / time_scale)


def predict(trace: Trace, measured: Measured, time_scale: float, notice_lead_s: float,
            seed: int) -> dict[str, float]:
    """Samples the simulator predicts, per benchmark system it shares with the runtime."""
    intervals = wall_clock_trace(trace.ready_after(measured.startup_s * time_scale), time_scale)
    config = SimulationConfig(interval_s=intervals.interval_s, seed=seed, predictor="persistence",
                              preemption_notice_s=notice_lead_s / time_scale)
    context = dataclasses.replace(make_context(intervals, measured.profile, config),
                                  costs=measured.costs)
    return {system: simulate_policy(intervals, measured.profile, policy, config, context).samples
            for system, policy in POLICIES.items()}
