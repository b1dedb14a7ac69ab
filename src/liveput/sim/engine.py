"""The simulator: one executor of policy decisions on a replayed availability trace, run for an
objective (:mod:`liveput.sim.objective`: throughput here, a deadline in
:mod:`liveput.sim.deadline`).

The objective is a strategy the executor is handed: it says which spot instances the job holds,
how instances are paid for and when the replay stops; the executor owns what follows.

Model of one interval t (length T, ``count[t] = n`` spot instances at its start, ``k =
preempted[t]`` lost and ``a = allocated[t]`` granted during it, ``o`` on-demand instances held):

1. *Decide.* The policy sees an :class:`Observation` (history ``trace.head(t + 1)``, ``n``, the
   running configuration, ``o``; the true future only for oracle policies) and returns a
   :class:`Decision`. The simulator checks it (``|c| <= n + o``). Its downtime (migration,
   restart) is the time to reach its configuration: it replaces what is left of an earlier move
   when the decision moves again (that move is abandoned) and is dropped when nothing runs; a
   checkpoint save adds a pause; a rollback adds work to re-do, which is never dropped.
2. *Run.* Training time first finishes the move, then re-does rolled-back work (either may carry
   over to later intervals), then trains at ``thr(c) * throughput_factor`` samples/s.
3. *Preemptions take effect at their time.* The k losses of the interval fall together at one
   time ``u * T`` with ``u`` uniform in (0, 1) (the measured traces lose instances in bursts that
   share a timestamp; an interval trace keeps only the counts, so the time is drawn). Which
   instances go is a uniformly random k-subset of the n spot instances (spot slots of the running
   configuration, then spares; on-demand instances are never lost). The policy is asked again
   (``event="preemption"``, the lost ``(pipeline, stage)`` slots) and decides what runs for the
   rest of the interval, paying its own recovery (regroup, failover, restart, rollback).
4. *Allocations* of the interval become usable at the next interval (instances boot in 70 to 92 s,
   CM-DARE measurement, more than a 60-s interval).
5. *Cost* (the objective's). Every instance held is billed per second at its price: spot
   instances until they are lost or released, granted ones from the next interval, on-demand
   ones all along (the throughput objective; the deadline one has its on-demand market).
6. *Released spares are gone for the next interval.* ``Decision.release`` gives idle spares
   back to the cloud: asked for again, they boot like any grant (70 to 92 s), so the next
   interval has ``count[t + 1]`` minus the released ones that were not lost, and they join at the
   one after (at most the trace's count: what the market offers then).

*The end.* The replay stops at the trace's end, or as soon as the job's samples reach the
objective's work (``target_samples``; inf for throughput).

*Online calibration* (optional, :class:`~liveput.sim.objective.OnlineCalibration`): the
runtime's coordinator re-fits its throughput table to the step times it measured
(``perf.online``) and plans with the new table from then on. With ``learn``, every ``every_s``
the configurations the job has trained on for at least ``min_trained_s`` count as measured, at the
step time they really train at (the job's table: ``actual`` when given); when that set changed,
the policy plans with the table ``learn.fit`` returns for them (``Policy.refitted``: remembering
what it saw of the job), as the coordinator's does at each re-fit.

The draws (u and the loss order of each interval) come from ``seed`` and the interval index
only, so every policy meets the same losses at the same times (common random numbers). The
simulator never branches on the policy; every tick it asserts its invariants: instances used
<= instances available, one clock that only moves forward, samples and dollars paid that
never decrease.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.perf import MigrationCostModel, estimate_configs
from liveput.perf.configuration import Configuration, ObservationEvent
from liveput.perf.types import ConfigTable, ModelProfile
from liveput.plan.liveput import on_demand_per_stage
from liveput.policies import POLICIES, Observation, PolicyContext
from liveput.sim.config import SimulationConfig
from liveput.sim.job import InvariantError, SimulatedJob
from liveput.sim.objective import Interval, Objective, OnlineCalibration, Throughput
from liveput.sim.result import PolicyRun, SimulationResult
from liveput.traces import IntervalTrace, generate_trace

logger = logging.getLogger(__name__)

DEFAULT_POLICIES = (
    "liveput",
    "liveput-oracle",
    "reactive",
    "bamboo",
    "checkpoint",
    "on-demand",
    "ideal",
)
DEFAULT_MODEL = "gpt-1.5b"
DEFAULT_TRACE_NODES = 32
DEFAULT_TRACE_HOURS = 12.0


def default_trace(interval_s: float = 60.0) -> IntervalTrace:
    """The project's own default trace: 32 instances, 12 hours, the default (p3-like) regime."""
    trace = generate_trace(DEFAULT_TRACE_NODES, DEFAULT_TRACE_HOURS, seed=0)
    return trace.resample(interval_s)


@dataclass(frozen=True)
class _Draws:
    """Common random numbers of a trace: when each interval's losses fall and in which order."""

    loss_fraction: np.ndarray
    """u of each interval: the losses fall at ``u * T``."""
    seed: int

    def loss_order(self, interval: int, num_instances: int) -> np.ndarray:
        """A random permutation of the n spot instances: the first k are lost."""
        return np.random.default_rng([self.seed, interval]).permutation(num_instances)

    @classmethod
    def make(cls, num_intervals: int, seed: int) -> _Draws:
        rng = np.random.default_rng([seed, 2**31 - 1])
        return cls(rng.uniform(0.0, 1.0, num_intervals), seed)


def _check_trace(trace: IntervalTrace, config: SimulationConfig) -> None:
    if len(trace) == 0:
        raise LiveputError(f"trace {trace.name} is empty: nothing to simulate")
    if abs(trace.interval_s - config.interval_s) > 1e-9:
        raise LiveputError(
            f"trace {trace.name} has {trace.interval_s:g}-s intervals but the simulation uses "
            f"{config.interval_s:g}-s ones (resample it)"
        )
    if trace.max_count + config.num_on_demand == 0:
        raise LiveputError(f"trace {trace.name} never has an instance: nothing to simulate")


def make_context(
    trace: IntervalTrace, profile: ModelProfile, config: SimulationConfig
) -> PolicyContext:
    """What every policy knows before the replay: model, configurations, costs and prices."""
    _check_trace(trace, config)
    capacity = trace.max_count
    instance = profile.instance_type
    spot_price = (
        config.spot_price_usd_per_hour
        if config.spot_price_usd_per_hour is not None
        else trace.price_usd_per_hour
        if trace.price_usd_per_hour is not None
        else instance.spot_price_usd_per_hour
    )
    on_demand_price = (
        config.on_demand_price_usd_per_hour
        if config.on_demand_price_usd_per_hour is not None
        else instance.on_demand_price_usd_per_hour
    )
    # The on-demand policy rents what the spot job had on average: the same instance budget.
    budget = round(float(np.mean(trace.count))) + config.num_on_demand
    max_nodes = max(capacity + config.num_on_demand, budget, 1)
    return PolicyContext(
        profile=profile,
        table=estimate_configs(profile, max_nodes),
        costs=MigrationCostModel.from_profile(profile),
        interval_s=config.interval_s,
        horizon=config.horizon,
        objective=config.objective,
        spot_price_usd_per_hour=float(spot_price),
        on_demand_price_usd_per_hour=float(on_demand_price),
        capacity=capacity,
        on_demand_budget=budget,
        predictor=config.predictor,
        preemption_notice_s=config.preemption_notice_s,
        seed=config.seed,
        buddy_copies=config.buddy_copies,
        checkpoint_every_s=config.checkpoint_every_s,
    )


def _lost_slots(
    current: Configuration | None,
    num_on_demand: int,
    lost_positions: np.ndarray,
) -> tuple[tuple[tuple[int, int], ...], int]:
    """Map lost spot positions to ``(pipeline, stage)`` slots of ``current`` and lost spares.

    Positions ``0..s-1`` are the spot slots of the configuration (stage by stage, the on-demand
    instances of each stage take its first slots), positions ``>= s`` are spares.
    """
    if current is None:
        return (), len(lost_positions)
    d, p = current.data_parallel, current.pipeline_stages
    on_demand = on_demand_per_stage(num_on_demand, d, p)
    slots = [
        (pipeline, stage) for stage in range(p) for pipeline in range(int(on_demand[stage]), d)
    ]
    lost = tuple(sorted(slots[i] for i in lost_positions if i < len(slots)))
    return lost, int(np.sum(lost_positions >= len(slots)))


MAX_SIMULATED_INTERVALS = 200_000
"""Most intervals one simulation replays (139 days of 60-s intervals): each costs a decision per
policy, so more would run for hours."""


def check_size(trace: IntervalTrace) -> None:
    """Refuse a trace cut into more intervals than :data:`MAX_SIMULATED_INTERVALS`."""
    if len(trace) > MAX_SIMULATED_INTERVALS:
        raise LiveputError(
            f"simulate: {trace.name} is {len(trace):,} intervals of {trace.interval_s:g} s, more "
            f"than the {MAX_SIMULATED_INTERVALS:,} a simulation replays: use a longer --interval, "
            "or --start-hour/--end-hour"
        )


def _lose(
    objective: Objective,
    job: SimulatedJob,
    interval: Interval,
    observation: Observation,
    draws: _Draws,
    market: int,
) -> int:
    """The interval's losses fall at ``hit_s``: the policy recovers and the job trains to the
    interval's end (or its work). Returns the released spares lost (not booting again)."""
    # The losses fall among the market's instances; the job's are its first positions.
    lost = draws.loss_order(interval.index, market)[: interval.num_lost]
    mine = lost[lost < interval.pool]
    interval.lost_held = int(np.sum(lost < interval.held))
    objective.on_loss(job, interval)
    slots, spares = _lost_slots(job.current, job.num_on_demand, mine)
    time_s = interval.start_s + interval.hit_s
    left = interval.pool - len(mine)
    event = dataclasses.replace(
        observation,
        time_s=time_s,
        num_available=left,
        current=job.current,
        num_on_demand=job.num_on_demand,
        event=ObservationEvent.PREEMPTION,
        lost_slots=slots,
        lost_spares=spares,
        remaining_s=interval.interval_s - interval.hit_s,
        **objective.event_fields(),
    )
    objective.recover(job, objective.decide(event), left, time_s)
    rest = job.run_until(interval.interval_s - interval.hit_s, objective.target_samples)
    interval.done_s = None if rest is None else interval.hit_s + rest
    return int(np.sum((lost >= interval.held) & (lost < interval.available)))


class _Series:
    """What the job ran, held and did in each interval (the run's arrays)."""

    def __init__(self, num_intervals: int) -> None:
        self.data_parallel = np.zeros(num_intervals, dtype=np.int64)
        self.pipeline_stages = np.zeros(num_intervals, dtype=np.int64)
        self.on_demand = np.zeros(num_intervals, dtype=np.int64)
        self.spot = np.zeros(num_intervals, dtype=np.int64)
        self.samples = np.zeros(num_intervals)
        self.cost_usd = np.zeros(num_intervals)

    def start(self, t: int, job: SimulatedJob, interval: Interval) -> None:
        self.data_parallel[t] = job.current.data_parallel if job.current else 0
        self.pipeline_stages[t] = job.current.pipeline_stages if job.current else 0
        self.on_demand[t] = job.num_on_demand
        self.spot[t] = interval.held

    def end(self, t: int, samples: float, paid_usd: float) -> None:
        if t > 0 and paid_usd < self.cost_usd[t - 1] - 1e-9:
            raise InvariantError(f"interval {t}: dollars paid decreased")
        self.samples[t] = samples
        self.cost_usd[t] = paid_usd


def execute(
    objective: Objective,
    trace: IntervalTrace,
    seed: int,
    on_step: Callable[[int], None] | None = None,
) -> PolicyRun:
    """Replay ``trace`` with one policy under ``objective`` (module docstring gives the model).

    ``on_step(interval)`` is called after each simulated interval (progress bars)."""
    trace = objective.replayed(trace)
    interval_s = objective.context.interval_s
    draws = _Draws.make(len(trace), seed)
    job = objective.new_job()
    series = _Series(len(trace))
    gone = 0  # released in the interval before, booting again
    replayed = 0
    for t in range(len(trace)):
        market = int(trace.count[t])
        interval = Interval(
            t,
            t * interval_s,
            interval_s,
            max(market - gone, 0),
            num_lost=int(trace.preempted[t]),
            samples_before=job.samples,
        )
        objective.begin(job, interval)
        observation = Observation(
            time_s=interval.start_s,
            interval_index=t,
            interval_s=interval_s,
            history=trace.head(t + 1),
            num_available=interval.available,
            current=job.current,
            num_on_demand=job.num_on_demand,
            future=trace.window(t + 1),
            capacity=objective.context.capacity,
            remaining_s=interval_s,
            **objective.observed(job, interval),
        )
        objective.adopt(job, objective.decide(observation), interval)
        series.start(t, job, interval)
        interval.hit_s = (
            float(draws.loss_fraction[t]) * interval_s if interval.num_lost else interval_s
        )
        interval.done_s = job.run_until(interval.hit_s, objective.target_samples)
        lost_released = 0
        if interval.done_s is None and interval.num_lost:
            lost_released = _lose(objective, job, interval, observation, draws, market)
        gone = (interval.available - interval.held) - lost_released
        stop = objective.close(job, interval)
        if job.samples < interval.samples_before or min(job.moving_s, job.redo_s) < -1e-9:
            raise InvariantError(f"interval {t}: samples decreased or negative lost time")
        series.end(t, job.samples, objective.paid_usd(job, interval))
        replayed = t + 1
        if on_step is not None:
            on_step(t)
        if stop:
            break
    figures = objective.outcome(job, trace, replayed)
    samples = float(job.samples)
    cost_usd = figures.pop("cost_usd")
    return PolicyRun(
        policy=objective.policy_name,
        samples=samples,
        cost_usd=cost_usd,
        usd_per_1k_samples=cost_usd / samples * 1000 if samples > 0 else float("inf"),
        reconfigurations=job.reconfigurations,
        downtime_s=float(job.downtime_s),
        interval_s=interval_s,
        available=trace.count[:replayed].copy(),
        spot=series.spot[:replayed],
        data_parallel=series.data_parallel[:replayed],
        pipeline_stages=series.pipeline_stages[:replayed],
        on_demand=series.on_demand[:replayed],
        cumulative_samples=series.samples[:replayed],
        cumulative_cost_usd=series.cost_usd[:replayed],
        **figures,
    )


def simulate_policy(
    trace: IntervalTrace,
    profile: ModelProfile,
    policy: str,
    config: SimulationConfig | None = None,
    context: PolicyContext | None = None,
    on_step: Callable[[int], None] | None = None,
    actual: ConfigTable | None = None,
    learn: OnlineCalibration | None = None,
) -> PolicyRun:
    """Replay ``trace`` with one policy for throughput (module docstring gives the model).

    ``actual``: the samples/s each configuration really trains at, where it differs from the
    table the policy plans with (``context.table``, an estimate); None: the policy's table.
    ``learn``: re-fit the policy's table to the step times measured as the job runs."""
    config = config or SimulationConfig()
    POLICIES.get(policy)  # an unknown name: a one-line error before any work
    context = context or make_context(trace, profile, config)
    objective = Throughput(policy, context, config.num_on_demand, actual, learn)
    return execute(objective, trace, config.seed, on_step)


def simulate(
    trace: IntervalTrace,
    profile: ModelProfile,
    policies: Sequence[str],
    config: SimulationConfig | None = None,
    on_step: Callable[[str, int], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` with every policy (and ``ideal``, for the fractions, when not asked).

    ``on_step(policy, interval)`` is called after each simulated interval (progress bars).
    """
    config = config or SimulationConfig()
    if not policies:
        raise LiveputError("no policy to simulate")
    check_size(trace)
    for name in policies:
        POLICIES.get(name)
    context = make_context(trace, profile, config)
    names = list(dict.fromkeys(policies))
    runs: dict[str, PolicyRun] = {}
    for name in [*names, *(["ideal"] if "ideal" not in names else [])]:
        step = None if on_step is None else (lambda t, name=name: on_step(name, t))
        runs[name] = simulate_policy(trace, profile, name, config, context, step)
    return SimulationResult(
        trace=trace.name,
        model=profile.model,
        interval_s=config.interval_s,
        hours=trace.hours,
        runs={name: runs[name] for name in names},
        ideal_samples=runs["ideal"].samples,
    )
