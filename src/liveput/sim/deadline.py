"""The deadline objective: a fixed amount of work, a deadline, spot and on-demand instances.

The one executor (:func:`liveput.sim.engine.execute`) replays deadline policies
(:mod:`liveput.policies.deadline`) under :class:`Deadline` as it replays the others for
throughput, on the same losses (common random numbers); the objective puts an emulated
on-demand market in between. Model of interval t (length T, starting at ``t * T``):

1. *On-demand grants.* Instances asked for earlier whose launch delay has passed join: usable
   from this interval on (one granted inside an interval is billed from its grant but joins at
   the next start, as a booted agent joins at the next decision). Launch delays are uniform in
   ``[launch_delay_min_s, launch_delay_max_s]`` (default 60 to 90 s; CM-DARE measured 70 to
   92 s), the i-th request of a run getting the i-th draw of the seed: every policy meets the
   same delays. On-demand instances are never preempted.
2. *Decide.* The policy sees the spot instances available (the trace's count minus those it
   released the interval before: they boot again), the on-demand ones held and launching, the
   samples done and left, the seconds to the deadline and the dollars spent, and returns a
   decision with a :class:`~liveput.policies.base.Provisioning`: spot instances above its spot
   target are released now (gone for the next interval), on-demand ones are requested up to its
   target (at most ``on_demand_max``) or released down to it (launching ones first: a request
   not yet granted costs nothing). The configuration must fit the spot kept plus the on-demand
   running.
3. *Run, lose, recover* as in :mod:`liveput.sim.engine`: the interval's losses fall together at
   a drawn time among the market's instances (the job's kept ones first), the policy recovers.
4. *Finish.* The job ends the moment its samples reach the work: every instance is released
   then (launching ones cancelled) and billing stops.
5. *Bill* exactly: each spot instance per second from the interval it is held in until it is
   lost, released or the job ends; each on-demand instance from its grant to its release.

The replay goes on past the trace's end at the trace's last count (no more events), up to twice
the deadline: a policy that has not finished by then is reported unfinished.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from liveput.errors import LiveputError
from liveput.perf import estimate_configs
from liveput.perf.types import ModelProfile
from liveput.policies.base import Decision, Observation, Provisioning
from liveput.policies.common import ConfigurationLookup, restart_s
from liveput.policies.deadline import (
    DEADLINE_POLICIES,
    DEADLINE_POLICY_NAMES,
    DeadlineContext,
    make_deadline_policy,
)
from liveput.policies.objective import JobObjective
from liveput.sim.config import SimulationConfig
from liveput.sim.engine import execute, make_context
from liveput.sim.job import SimulatedJob
from liveput.sim.objective import Interval, Objective
from liveput.sim.result import PolicyRun, SimulationResult
from liveput.traces import IntervalTrace

logger = logging.getLogger(__name__)

CAP_FACTOR = 2.0
"""The replay stops at this many times the deadline (a policy unfinished then is late)."""


def make_deadline_context(
    trace: IntervalTrace,
    profile: ModelProfile,
    objective: JobObjective,
    config: SimulationConfig,
    check: bool = True,
) -> DeadlineContext:
    """What every deadline policy knows before the replay; refuses impossible objectives (a
    deadline before the fastest possible finish only when ``check``)."""
    base = make_context(trace, profile, config)
    on_demand_max = trace.max_count if objective.on_demand_max is None else objective.on_demand_max
    base = dataclasses.replace(
        base,
        table=estimate_configs(profile, max(trace.max_count + on_demand_max, 1)),
        objective="cost",
    )
    objective.check_budget(min(base.spot_price_usd_per_hour, base.on_demand_price_usd_per_hour))
    context = DeadlineContext(
        base,
        objective,
        objective.samples(profile.global_batch_size),
        on_demand_max,
        config.launch_delay_max_s,
    )
    fastest_s = fastest_finish_s(context, config)
    if math.isinf(fastest_s):
        raise LiveputError(
            f"no configuration of {profile.model} fits the {on_demand_max} on-demand instances "
            "allowed: no deadline can be promised (raise the on-demand maximum)"
        )
    if check and objective.deadline_s < fastest_s:
        raise LiveputError(
            f"deadline {objective.deadline_hours:g} h is shorter than the fastest possible "
            f"finish: {fastest_s / 3600:.2f} h for {context.target_samples:,.0f} samples on "
            f"the largest allowed on-demand cluster ({on_demand_max} instances)"
        )
    return context


def fastest_finish_s(context: DeadlineContext, config: SimulationConfig) -> float:
    """Seconds the work takes on the largest allowed on-demand cluster asked for at the start:
    the shortest launch, a launch, then training (inf when no configuration fits it)."""
    lookup = ConfigurationLookup(context.policy)
    best = lookup.best_for(context.on_demand_max)
    if best is None:
        return math.inf
    return (
        config.launch_delay_min_s
        + restart_s(context.policy, best)
        + context.target_samples / lookup.throughput(best)
    )


def all_on_demand_hours(
    trace: IntervalTrace, profile: ModelProfile, objective: JobObjective, config: SimulationConfig
) -> float:
    """Hours the objective's work takes on the largest allowed on-demand cluster (the unit of
    the sweep's deadlines)."""
    context = make_deadline_context(trace, profile, objective, config, check=False)
    return fastest_finish_s(context, config) / 3600.0


def _extended(trace: IntervalTrace, num_intervals: int) -> IntervalTrace:
    """The trace, then its last count with no events up to ``num_intervals``."""
    extra = num_intervals - len(trace)
    if extra <= 0:
        return trace
    zeros = np.zeros(extra, dtype=np.int64)
    return IntervalTrace(
        trace.name,
        trace.interval_s,
        np.concatenate([trace.count, np.full(extra, trace.end_count)]),
        np.concatenate([trace.preempted, zeros]),
        np.concatenate([trace.allocated, zeros]),
        trace.price_usd_per_hour,
    )


class _Cloud:
    """The emulated on-demand market of one run: requests, grants, releases, the bill."""

    def __init__(self, delays_s: Callable[[int], float]) -> None:
        self.delays_s = delays_s
        self.held: list[float] = []
        """Grant times of the instances running."""
        self.pending: list[float] = []
        """Grant times of the instances launching, earliest first."""
        self.requests = 0
        self.ledger: list[tuple[float, float]] = []
        """(grant, release) of every instance released so far."""

    def grant(self, now_s: float) -> None:
        while self.pending and self.pending[0] <= now_s + 1e-9:
            self.held.append(self.pending.pop(0))

    def target(self, count: int, now_s: float) -> None:
        while len(self.held) + len(self.pending) > count:
            if self.pending:
                self.pending.pop()  # the latest launch: not granted, not billed
            else:
                self.ledger.append((self.held.pop(), now_s))
        while len(self.held) + len(self.pending) < count:
            self.pending.append(now_s + self.delays_s(self.requests))
            self.requests += 1
        self.pending.sort()

    def end(self, now_s: float) -> None:
        """Release everything at ``now_s`` (launches granted by then were billed from grant)."""
        self.grant(now_s)
        self.pending.clear()
        self.target(0, now_s)

    def seconds(self, now_s: float) -> float:
        """On-demand instance-seconds billed up to ``now_s``."""
        return (
            sum(release - grant for grant, release in self.ledger)
            + sum(now_s - grant for grant in self.held)
            + sum(now_s - grant for grant in self.pending if grant <= now_s)
        )


def _delays(config: SimulationConfig) -> Callable[[int], float]:
    rng = np.random.default_rng([config.seed, 0x0D])
    table = rng.uniform(config.launch_delay_min_s, config.launch_delay_max_s, 4096)

    def delay(index: int) -> float:
        if index < len(table):
            return float(table[index])
        return float(
            np.random.default_rng([config.seed, 0x0D, index]).uniform(
                config.launch_delay_min_s, config.launch_delay_max_s
            )
        )

    return delay


class Deadline(Objective):
    """The work by the deadline at the least cost: the policy's provisioning carried out on an
    emulated on-demand market (module docstring); the replay stops when the work is done."""

    def __init__(self, policy: str, context: DeadlineContext, config: SimulationConfig) -> None:
        self.policy_name = policy
        self.deadline = context
        self.context = context.policy
        self.policy = make_deadline_policy(policy, context)
        self.target_samples = context.target_samples
        self.deadline_s = context.objective.deadline_s
        self.cloud = _Cloud(_delays(config))
        self.spot_usd_per_s = self.context.spot_price_usd_per_hour / 3600.0
        self.on_demand_usd_per_s = self.context.on_demand_price_usd_per_hour / 3600.0
        self.spot_s = 0.0
        """Spot instance-seconds paid so far."""
        self.finish_s: float | None = None

    def new_job(self) -> SimulatedJob:
        return SimulatedJob(self.context, 0)

    def decide(self, observation: Observation) -> Decision:
        return self.policy.decide(observation)

    def replayed(self, trace: IntervalTrace) -> IntervalTrace:
        return _extended(trace, math.ceil(CAP_FACTOR * self.deadline_s / self.context.interval_s))

    def begin(self, job: SimulatedJob, interval: Interval) -> None:
        self.cloud.grant(interval.start_s)
        job.num_on_demand = len(self.cloud.held)

    def _spent_usd(self, now_s: float) -> float:
        return (
            self.spot_s * self.spot_usd_per_s + self.cloud.seconds(now_s) * self.on_demand_usd_per_s
        )

    def observed(self, job: SimulatedJob, interval: Interval) -> dict[str, Any]:
        return {
            "samples_done": job.samples,
            "samples_remaining": max(self.target_samples - job.samples, 0.0),
            "seconds_to_deadline": self.deadline_s - interval.start_s,
            "on_demand_pending": len(self.cloud.pending),
            "usd_spent": self._spent_usd(interval.start_s),
        }

    def adopt(self, job: SimulatedJob, decision: Decision, interval: Interval) -> None:
        cloud = self.cloud
        provisioning = decision.provisioning or Provisioning(
            interval.available, len(cloud.held) + len(cloud.pending)
        )
        cloud.target(min(provisioning.on_demand, self.deadline.on_demand_max), interval.start_s)
        kept = min(provisioning.spot, interval.available)
        job.num_on_demand = len(cloud.held)
        self.recover(job, decision, kept, interval.start_s)
        interval.pool = interval.held = kept

    def event_fields(self) -> dict[str, Any]:
        return {"on_demand_pending": len(self.cloud.pending)}

    def recover(
        self, job: SimulatedJob, decision: Decision, num_available: int, time_s: float
    ) -> None:
        job.apply(
            dataclasses.replace(decision, provisioning=None, num_on_demand=len(self.cloud.held)),
            num_available,
            time_s,
        )

    def _end_s(self, interval: Interval) -> float:
        return interval.interval_s if interval.done_s is None else interval.done_s

    def close(self, job: SimulatedJob, interval: Interval) -> bool:
        end_s, hit_s = self._end_s(interval), interval.hit_s
        kept = interval.held
        self.spot_s += kept * min(hit_s, end_s) + (kept - interval.lost_held) * max(
            end_s - hit_s, 0.0
        )
        if interval.done_s is not None:
            self.finish_s = interval.start_s + interval.done_s
            self.cloud.end(self.finish_s)
        return interval.done_s is not None

    def paid_usd(self, job: SimulatedJob, interval: Interval) -> float:
        return self._spent_usd(interval.start_s + self._end_s(interval))

    def outcome(
        self, job: SimulatedJob, trace: IntervalTrace, intervals_replayed: int
    ) -> dict[str, Any]:
        finish_s = self.finish_s
        end_s = finish_s if finish_s is not None else len(trace) * self.context.interval_s
        self.cloud.end(end_s)
        usd_spot = self.spot_s * self.spot_usd_per_s
        on_demand_s = self.cloud.seconds(end_s)
        usd_on_demand = on_demand_s * self.on_demand_usd_per_s
        late_s = end_s - self.deadline_s
        logger.info(
            "%s on %s: %s, $%.2f",
            self.policy_name,
            trace.name,
            "unfinished" if finish_s is None else f"done at {finish_s / 3600:.2f} h",
            usd_spot + usd_on_demand,
        )
        return {
            "cost_usd": float(usd_spot + usd_on_demand),
            "deadline_met": bool(finish_s is not None and late_s <= 1e-6),
            "hours_late": float(max(late_s, 0.0) / 3600.0),
            "finished_hours": None if finish_s is None else float(finish_s / 3600.0),
            "usd_spot": float(usd_spot),
            "usd_on_demand": float(usd_on_demand),
            "on_demand_hours": float(on_demand_s / 3600.0),
            "on_demand_ledger": tuple(self.cloud.ledger),
        }


def simulate_deadline_policy(
    trace: IntervalTrace,
    profile: ModelProfile,
    policy: str,
    context: DeadlineContext,
    config: SimulationConfig,
    on_step: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Replay ``trace`` with one deadline policy until its work is done (module docstring)."""
    return execute(Deadline(policy, context, config), trace, config.seed, on_step)


def simulate_deadline(
    trace: IntervalTrace,
    profile: ModelProfile,
    objective: JobObjective,
    policies: Sequence[str] = DEADLINE_POLICY_NAMES,
    config: SimulationConfig | None = None,
    on_step: Callable[[str, int], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` with every deadline policy on the same job."""
    config = config or SimulationConfig()
    if not policies:
        raise LiveputError("no deadline policy to simulate")
    for name in policies:
        DEADLINE_POLICIES.get(name)
    context = make_deadline_context(trace, profile, objective, config)
    runs = {}
    for name in dict.fromkeys(policies):
        step = None if on_step is None else (lambda t, name=name: on_step(name, t))
        runs[name] = simulate_deadline_policy(trace, profile, name, context, config, step)
    return SimulationResult(
        trace=trace.name,
        model=profile.model,
        interval_s=config.interval_s,
        hours=trace.hours,
        runs=runs,
        deadline_hours=objective.deadline_hours,
        target_samples=context.target_samples,
        on_demand_max=context.on_demand_max,
        fastest_hours=fastest_finish_s(context, config) / 3600.0,
    )
