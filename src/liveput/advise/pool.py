"""Pool advisor: on-demand anchors plus spot instances for the liveput runtime, chosen by
simulating each candidate pool on an availability trace with the liveput policy.

Notation
    a   on-demand anchors held all along (a in ``anchors``)
    k   spot cap: the pool holds at most k of the trace's spot instances (k in ``spot_caps``)
    W   the job, in samples;  D the deadline, hours
    For a candidate (a, k) the simulator (``liveput.sim``) replays the capped trace and returns the
    cumulative samples and dollars per interval. H(a, k) is the hour the cumulative samples reach
    W (the trace's average rate carries on past its end); C(a, k) the dollars spent by then.

Objective: minimize C(a, k).
Constraints
    (1) H(a, k) <= D
    (2) a + k >= 1
Every candidate is simulated (the simulator is the model; there is nothing to prune on soundly),
so the choice is exact over the candidate set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.catalog import Market
from liveput.errors import LiveputError
from liveput.perf import ModelProfile
from liveput.sim import PolicyRun, SimulationConfig, simulate_policy
from liveput.traces import IntervalTrace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolConfig:
    """A pool request."""

    target_samples: float
    """W: samples the job must train."""
    deadline_hours: float
    """D: by when, hours."""
    anchors: tuple[int, ...] = (0, 1, 2, 4)
    """Candidate numbers of on-demand anchors."""
    spot_caps: tuple[int, ...] | None = None
    """Candidate spot caps; None: the trace's peak count only (take every spot instance)."""
    spot_usd_per_hour: float = 1.25
    """Spot price of the trace's instance type."""
    on_demand_usd_per_hour: float = 3.06
    """On-demand price of the same type."""
    policy: str = "liveput"
    """Policy the candidates are simulated with."""
    max_plans: int = 5
    """Plans returned, cheapest first."""

    def __post_init__(self) -> None:
        if not self.target_samples > 0:
            raise LiveputError(f"--target-samples must be > 0, got {self.target_samples}")
        if not self.deadline_hours > 0:
            raise LiveputError(f"--deadline-hours must be > 0, got {self.deadline_hours}")
        if not self.anchors or min(self.anchors) < 0:
            raise LiveputError("anchor counts must be >= 0 and at least one given")
        if self.spot_caps is not None and (not self.spot_caps or min(self.spot_caps) < 0):
            raise LiveputError("spot caps must be >= 0 and at least one given")
        if not (self.spot_usd_per_hour > 0 and self.on_demand_usd_per_hour > 0):
            raise LiveputError("pool prices must be > 0")


def cap_trace(trace: IntervalTrace, cap: int) -> IntervalTrace:
    """The trace seen by a pool that holds at most ``cap`` spot instances: counts clipped at cap,
    losses of an interval hit the held instances first (min(preempted, held))."""
    count = np.minimum(trace.count, cap)
    following = np.append(count[1:], min(trace.end_count, cap))
    preempted = np.minimum(trace.preempted, count)
    allocated = following - count + preempted
    return IntervalTrace(
        f"{trace.name}-cap{cap}",
        trace.interval_s,
        count,
        preempted,
        allocated,
        trace.price_usd_per_hour,
    )


def finish(run: PolicyRun, target_samples: float) -> tuple[float, float]:
    """(hours, dollars) to train ``target_samples``: interpolated inside the replay, extrapolated
    at the replay's average rate past its end (inf when it trains nothing)."""
    samples = np.asarray(run.cumulative_samples, dtype=float)
    dollars = np.asarray(run.cumulative_cost_usd, dtype=float)
    interval_h = run.interval_s / 3600.0
    if len(samples) and samples[-1] >= target_samples:
        index = int(np.argmax(samples >= target_samples))
        before = samples[index - 1] if index else 0.0
        cost_before = dollars[index - 1] if index else 0.0
        part = (target_samples - before) / max(samples[index] - before, 1e-12)
        return ((index + part) * interval_h, cost_before + part * (dollars[index] - cost_before))
    if run.samples <= 0:
        return float("inf"), float("inf")
    scale = target_samples / run.samples
    return run.hours * scale, run.cost_usd * scale


Simulator = Callable[[IntervalTrace, ModelProfile, str, SimulationConfig], PolicyRun]


def advise_pool(
    trace: IntervalTrace,
    profile: ModelProfile,
    config: PoolConfig,
    on_candidate: Callable[[], None] | None = None,
    simulator: Simulator = simulate_policy,
) -> Advice:
    """Cheapest simulated pool that trains the job by the deadline."""
    caps = config.spot_caps if config.spot_caps is not None else (trace.max_count,)
    candidates = pool_candidates(config.anchors, caps)
    if not candidates:
        raise LiveputError("no candidate pool has an instance (anchors + spot cap >= 1)")
    name = profile.instance_type.name
    scored = []
    for anchors, cap in candidates:
        sim_config = SimulationConfig(
            interval_s=trace.interval_s,
            spot_price_usd_per_hour=config.spot_usd_per_hour,
            on_demand_price_usd_per_hour=config.on_demand_usd_per_hour,
            num_on_demand=anchors,
        )
        run = simulator(cap_trace(trace, cap), profile, config.policy, sim_config)
        hours, dollars = (float(x) for x in finish(run, config.target_samples))
        usd_per_hour = dollars / hours if np.isfinite(hours) and hours > 0 else 0.0
        items = []
        if cap:
            items.append(InstanceCount(name, cap, Market.SPOT))
        if anchors:
            items.append(InstanceCount(name, anchors, Market.ON_DEMAND, "anchor"))
        scored.append(
            Plan(
                "pool",
                tuple(items),
                usd_per_hour,
                "cost_usd",
                dollars,
                {
                    "hours_to_target": hours,
                    "deadline_hours": config.deadline_hours,
                    "samples_per_hour": float(run.samples / run.hours) if run.hours else 0.0,
                    "reconfigurations": int(run.reconfigurations),
                    "downtime_s": float(run.downtime_s),
                },
            )
        )
        log.info("pool %s: %.2f h, $%.2f", scored[-1].describe(), hours, dollars)
        if on_candidate is not None:
            on_candidate()
    feasible = sorted(
        (p for p in scored if p.metrics["hours_to_target"] <= config.deadline_hours + 1e-12),  # (1)
        key=lambda p: (p.value, p.metrics["hours_to_target"], p.describe()),
    )
    if not feasible:
        fastest = min(scored, key=lambda p: (p.metrics["hours_to_target"], p.value))
        raise LiveputError(
            f"no pool trains {config.target_samples:g} samples within {config.deadline_hours:g} h;"
            f" closest: {fastest.describe()} needs {fastest.metrics['hours_to_target']:.2f} h "
            f"for ${fastest.value:.2f}"
        )
    best = feasible[0]
    reason = (
        f"cheapest of {len(candidates)} simulated pools ({config.policy} policy on trace "
        f"{trace.name}) to finish by {config.deadline_hours:g} h: "
        f"{best.metrics['hours_to_target']:.2f} h for ${best.value:.2f}"
    )
    if len(feasible) > 1:
        reason += f", ${feasible[1].value - best.value:.2f} below the runner-up"
    inputs = {
        "model": profile.model,
        "trace": trace.name,
        "target_samples": config.target_samples,
        "deadline_hours": config.deadline_hours,
        "candidates": len(candidates),
    }
    return Advice(tuple(feasible[: config.max_plans]), reason, inputs)


def pool_candidates(anchors: Sequence[int], caps: Sequence[int]) -> list[tuple[int, int]]:
    """The (anchors, spot cap) pairs a request simulates."""
    return [(a, k) for a in sorted(set(anchors)) for k in sorted(set(caps)) if a + k >= 1]  # (2)
