"""The deadline simulator: a fixed amount of work, a deadline, spot and on-demand instances.

It executes deadline policies (:mod:`liveput.policies.deadline`) as the interval simulator
(:mod:`liveput.sim.engine`) executes the others, on the same losses (common random numbers),
with an emulated cloud in between. Model of interval t (length T, starting at ``t * T``):

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

import numpy as np

from liveput.errors import LiveputError
from liveput.perf import estimate_configs
from liveput.perf.types import ModelProfile
from liveput.policies.base import Observation, Provisioning
from liveput.policies.common import restart_s
from liveput.policies.deadline import (
    DEADLINE_POLICIES,
    DEADLINE_POLICY_NAMES,
    DeadlineContext,
    make_deadline_policy,
)
from liveput.policies.objective import JobObjective
from liveput.sim.config import SimulationConfig
from liveput.sim.deadline_result import DeadlineResult, DeadlineRun
from liveput.sim.engine import InvariantError, _Draws, _Job, _lost_slots, make_context
from liveput.traces import IntervalTrace

logger = logging.getLogger(__name__)

CAP_FACTOR = 2.0
"""The replay stops at this many times the deadline (a policy unfinished then is late)."""


def make_deadline_context(trace: IntervalTrace, profile: ModelProfile, objective: JobObjective,
                          config: SimulationConfig, check: bool = True) -> DeadlineContext:
    """What every deadline policy knows before the replay; refuses impossible objectives (a
    deadline before the fastest possible finish only when ``check``)."""
    base = make_context(trace, profile, config)
    on_demand_max = (trace.max_count if objective.on_demand_max is None
                     else objective.on_demand_max)
    base = dataclasses.replace(
        base, table=estimate_configs(profile, max(trace.max_count + on_demand_max, 1)),
        objective="cost")
    objective.check_budget(min(base.spot_price_usd_per_hour, base.on_demand_price_usd_per_hour))
    context = DeadlineContext(base, objective, objective.samples(profile.global_batch_size),
                              on_demand_max, config.launch_delay_max_s)
    fastest_s = fastest_finish_s(context, config)
    if math.isinf(fastest_s):
        raise LiveputError(
            f"no configuration of {profile.model} fits the {on_demand_max} on-demand instances "
            "allowed: no deadline can be promised (raise the on-demand maximum)")
    if check and objective.deadline_s < fastest_s:
        raise LiveputError(
            f"deadline {objective.deadline_hours:g} h is shorter than the fastest possible "
            f"finish: {fastest_s / 3600:.2f} h for {context.target_samples:,.0f} samples on "
            f"the largest allowed on-demand cluster ({on_demand_max} instances)")
    return context


def fastest_finish_s(context: DeadlineContext, config: SimulationConfig) -> float:
    """Seconds the work takes on the largest allowed on-demand cluster asked for at the start:
    the shortest launch, a launch, then training (inf when no configuration fits it)."""
    from liveput.policies.common import ConfigurationLookup

    lookup = ConfigurationLookup(context.policy)
    best = lookup.best_for(context.on_demand_max)
    if best is None:
        return math.inf
    return (config.launch_delay_min_s + restart_s(context.policy, best)
            + context.target_samples / lookup.throughput(best))


def all_on_demand_hours(trace: IntervalTrace, profile: ModelProfile, objective: JobObjective,
                        config: SimulationConfig) -> float:
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
    return IntervalTrace(trace.name, trace.interval_s,
                         np.concatenate([trace.count, np.full(extra, trace.end_count)]),
                         np.concatenate([trace.preempted, zeros]),
                         np.concatenate([trace.allocated, zeros]), trace.price_usd_per_hour)


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
        return (sum(release - grant for grant, release in self.ledger)
                + sum(now_s - grant for grant in self.held)
                + sum(now_s - grant for grant in self.pending if grant <= now_s))


def _delays(config: SimulationConfig) -> Callable[[int], float]:
    rng = np.random.default_rng([config.seed, 0x0D])
    table = rng.uniform(config.launch_delay_min_s, config.launch_delay_max_s, 4096)

    def delay(index: int) -> float:
        if index < len(table):
            return float(table[index])
        return float(np.random.default_rng([config.seed, 0x0D, index]).uniform(
            config.launch_delay_min_s, config.launch_delay_max_s))
    return delay


class _DeadlineJob(_Job):
    def run_until(self, seconds: float, target: float) -> float | None:
        """Train for ``seconds`` or until ``target`` samples; the seconds it took to reach the
        target (None: not reached)."""
        if self.current is None or seconds <= 0:
            return None
        moving = min(self.moving_s, seconds)
        redo = min(self.redo_s, seconds - moving)
        rate = self.grid[self.current.data_parallel, self.current.pipeline_stages] * self.factor
        need = target - self.samples
        if rate > 0 and rate * (seconds - moving - redo) >= need:
            done = moving + redo + max(need, 0.0) / rate
            self.run(done)
            self.samples = max(self.samples, target)
            return done
        self.run(seconds)
        return None


def simulate_deadline_policy(trace: IntervalTrace, profile: ModelProfile, policy: str,
                             context: DeadlineContext, config: SimulationConfig,
                             on_step: Callable[[int], None] | None = None) -> DeadlineRun:
    """Replay ``trace`` with one deadline policy until its work is done (module docstring)."""
    decider = make_deadline_policy(policy, context)
    interval_s = config.interval_s
    deadline_s = context.objective.deadline_s
    target = context.target_samples
    trace = _extended(trace, int(math.ceil(CAP_FACTOR * deadline_s / interval_s)))
    draws = _Draws.make(len(trace), config.seed)
    cloud = _Cloud(_delays(config))
    job = _DeadlineJob(context.policy, 0)
    spot_usd_per_s = context.policy.spot_price_usd_per_hour / 3600.0
    on_demand_usd_per_s = context.policy.on_demand_price_usd_per_hour / 3600.0
    spot_s = 0.0
    gone = 0
    finish_s: float | None = None
    series: dict[str, list[float]] = {key: [] for key in (
        "spot", "on_demand", "data_parallel", "pipeline_stages", "samples", "usd")}
    for t in range(len(trace)):
        start_s = t * interval_s
        cloud.grant(start_s)
        market = int(trace.count[t])
        available = max(market - gone, 0)
        spent = spot_s * spot_usd_per_s + cloud.seconds(start_s) * on_demand_usd_per_s
        observation = Observation(
            time_s=start_s, interval_index=t, interval_s=interval_s, history=trace.head(t + 1),
            num_available=available, current=job.current, num_on_demand=len(cloud.held),
            future=trace.window(t + 1), capacity=context.policy.capacity, remaining_s=interval_s,
            samples_done=job.samples, samples_remaining=max(target - job.samples, 0.0),
            seconds_to_deadline=deadline_s - start_s, on_demand_pending=len(cloud.pending),
            usd_spent=spent)
        decision = decider.decide(observation)
        provisioning = decision.provisioning or Provisioning(available, len(cloud.held)
                                                             + len(cloud.pending))
        cloud.target(min(provisioning.on_demand, context.on_demand_max), start_s)
        kept = min(provisioning.spot, available)
        job.num_on_demand = len(cloud.held)
        job.apply(dataclasses.replace(decision, provisioning=None, num_on_demand=len(cloud.held)),
                  kept, start_s)
        num_lost = int(trace.preempted[t])
        hit_s = float(draws.loss_fraction[t]) * interval_s if num_lost else interval_s
        done = job.run_until(hit_s, target)
        lost_kept = lost_released = 0
        if done is None and num_lost:
            # The losses fall among the market's instances; the job's kept ones come first.
            lost = draws.loss_order(t, market)[:num_lost]
            mine = lost[lost < kept]
            lost_kept = len(mine)
            lost_released = int(np.sum((lost >= kept) & (lost < available)))
            slots, spares = _lost_slots(job.current, len(cloud.held), mine)
            event = dataclasses.replace(
                observation, time_s=start_s + hit_s, num_available=kept - lost_kept,
                current=job.current, num_on_demand=len(cloud.held),
                on_demand_pending=len(cloud.pending), event="preemption", lost_slots=slots,
                lost_spares=spares,
                remaining_s=interval_s - hit_s)
            recovery = decider.decide(event)
            job.apply(dataclasses.replace(recovery, provisioning=None,
                                          num_on_demand=len(cloud.held)),
                      kept - lost_kept, start_s + hit_s)
            rest = job.run_until(interval_s - hit_s, target)
            done = None if rest is None else hit_s + rest
        end_s = interval_s if done is None else done
        spot_s += kept * min(hit_s, end_s) + (kept - lost_kept) * max(end_s - hit_s, 0.0)
        gone = (available - kept) - lost_released
        if done is not None:
            finish_s = start_s + done
            cloud.end(finish_s)
        series["spot"].append(kept)
        series["on_demand"].append(job.num_on_demand)
        series["data_parallel"].append(job.current.data_parallel if job.current else 0)
        series["pipeline_stages"].append(job.current.pipeline_stages if job.current else 0)
        series["samples"].append(job.samples)
        now_s = start_s + end_s
        series["usd"].append(spot_s * spot_usd_per_s + cloud.seconds(now_s) * on_demand_usd_per_s)
        if len(series["usd"]) > 1 and series["usd"][-1] < series["usd"][-2] - 1e-9:
            raise InvariantError(f"interval {t}: dollars paid decreased")
        if on_step is not None:
            on_step(t)
        if finish_s is not None:
            break
    end_s = finish_s if finish_s is not None else len(trace) * interval_s
    cloud.end(end_s)
    usd_spot = spot_s * spot_usd_per_s
    on_demand_s = cloud.seconds(end_s)
    usd_on_demand = on_demand_s * on_demand_usd_per_s
    late_s = (finish_s if finish_s is not None else end_s) - deadline_s
    logger.info("%s on %s: %s, $%.2f", policy, trace.name,
                "unfinished" if finish_s is None else f"done at {finish_s / 3600:.2f} h",
                usd_spot + usd_on_demand)
    return DeadlineRun(
        policy=policy,
        deadline_met=bool(finish_s is not None and late_s <= 1e-6),
        hours_late=float(max(late_s, 0.0) / 3600.0),
        finished_hours=None if finish_s is None else float(finish_s / 3600.0),
        usd=float(usd_spot + usd_on_demand),
        usd_spot=float(usd_spot),
        usd_on_demand=float(usd_on_demand),
        on_demand_hours=float(on_demand_s / 3600.0),
        samples=float(job.samples),
        interval_s=interval_s,
        spot=np.array(series["spot"], dtype=np.int64),
        on_demand=np.array(series["on_demand"], dtype=np.int64),
        data_parallel=np.array(series["data_parallel"], dtype=np.int64),
        pipeline_stages=np.array(series["pipeline_stages"], dtype=np.int64),
        cumulative_samples=np.array(series["samples"]),
        cumulative_usd=np.array(series["usd"]),
        on_demand_ledger=tuple(cloud.ledger),
    )


def simulate_deadline(trace: IntervalTrace, profile: ModelProfile, objective: JobObjective,
                      policies: Sequence[str] = DEADLINE_POLICY_NAMES,
                      config: SimulationConfig | None = None,
                      on_step: Callable[[str, int], None] | None = None) -> DeadlineResult:
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
    return DeadlineResult(
        trace=trace.name, model=profile.model, interval_s=config.interval_s,
        deadline_hours=objective.deadline_hours, target_samples=context.target_samples,
        on_demand_max=context.on_demand_max,
        fastest_hours=fastest_finish_s(context, config) / 3600.0, runs=runs)
