"""The simulator: an executor of policy decisions on a replayed availability trace.

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
5. *Cost.* Every instance held is billed per second at its price: spot instances until they are
   lost or released, granted ones from the next interval, on-demand ones all along.
6. *Released spares are gone for the next interval.* ``Decision.release`` gives idle spares
   back to the cloud: asked for again, they boot like any grant (70 to 92 s), so the next
   interval has ``count[t + 1]`` minus the released ones that were not lost, and they join at the
   one after (at most the trace's count: what the market offers then).

*Online calibration* (optional, :class:`OnlineCalibration`): the runtime's coordinator re-fits its
throughput table to the step times it measured (``perf.online``) and plans with the new table
from then on. With ``learn``, every ``every_s`` the configurations the job has trained on for
at least ``min_trained_s`` count as measured, at the step time they really train at (the job's
table: ``actual`` when given); when that set changed, the policy is made anew with the table
``learn.fit`` returns for them, as the coordinator makes a new policy at each re-fit.

The draws (u and the loss order of each interval) come from ``seed`` and the interval index
only, so every policy meets the same losses at the same times (common random numbers). The
simulator never branches on the policy; every tick it asserts its invariants: instances used
<= instances available, one clock that only moves forward, samples that never decrease.
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
from liveput.perf.types import ConfigTable, Measurement, ModelProfile
from liveput.plan.liveput import on_demand_per_stage
from liveput.policies import POLICIES, Decision, Observation, PolicyContext
from liveput.sim.config import SimulationConfig
from liveput.sim.result import PolicyRun, SimulationResult
from liveput.traces import IntervalTrace, generate_trace

logger = logging.getLogger(__name__)

DEFAULT_POLICIES = ("liveput", "liveput-oracle", "reactive", "bamboo", "checkpoint", "on-demand",
                    "ideal")
DEFAULT_MODEL = "gpt-1.5b"
DEFAULT_TRACE_NODES = 32
DEFAULT_TRACE_HOURS = 12.0


@dataclass(frozen=True)
class OnlineCalibration:
    """The runtime's online calibration, for the simulator to do what it does (module
    docstring)."""

    every_s: float
    """Seconds between two re-fits (the coordinator's decision interval)."""
    fit: Callable[[tuple[Measurement, ...]], ConfigTable]
    """Measured step times -> the table the policy then plans with (the coordinator's:
    ``estimate_configs`` with ``fit_online``'s constants)."""
    min_trained_s: float = 1.0
    """Seconds a configuration trains before its step time counts as measured (the runtime
    publishes a median after a few steps)."""

    def __post_init__(self) -> None:
        if not (self.every_s > 0 and self.min_trained_s >= 0):
            raise ValueError("online calibration: every_s > 0 and min_trained_s >= 0 required")


class InvariantError(AssertionError):
    """The simulator found its own state impossible (a bug, never bad input)."""


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
            f"{config.interval_s:g}-s ones (resample it)")
    if trace.max_count + config.num_on_demand == 0:
        raise LiveputError(f"trace {trace.name} never has an instance: nothing to simulate")


def make_context(trace: IntervalTrace, profile: ModelProfile,
                 config: SimulationConfig) -> PolicyContext:
    """What every policy knows before the replay: model, configurations, costs and prices."""
    _check_trace(trace, config)
    capacity = trace.max_count
    instance = profile.instance_type
    spot_price = (config.spot_price_usd_per_hour if config.spot_price_usd_per_hour is not None
                  else trace.price_usd_per_hour if trace.price_usd_per_hour is not None
                  else instance.spot_price_usd_per_hour)
    on_demand_price = (config.on_demand_price_usd_per_hour
                       if config.on_demand_price_usd_per_hour is not None
                       else instance.on_demand_price_usd_per_hour)
    # The on-demand policy rents what the spot job had on average: the same instance budget.
    budget = int(round(float(np.mean(trace.count)))) + config.num_on_demand
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
    )


class _Job:
    """The simulated job: its running configuration, time still lost to a move and to re-done
    work, samples and dollars."""

    def __init__(self, context: PolicyContext, num_on_demand: int,
                 actual: ConfigTable | None = None) -> None:
        self.grid = (actual or context.table).throughput_grid(context.max_instances)
        self.spot_usd_per_s = context.spot_price_usd_per_hour / 3600.0
        self.on_demand_usd_per_s = context.on_demand_price_usd_per_hour / 3600.0
        self.current: Configuration | None = None
        self.used = 0
        self.num_on_demand = num_on_demand
        self.factor = 1.0
        self.moving_s = 0.0
        self.redo_s = 0.0
        self.samples = 0.0
        self.cost_usd = 0.0
        self.downtime_s = 0.0
        self.reconfigurations = 0
        self.clock_s = 0.0

    def apply(self, decision: Decision, num_available: int, time_s: float) -> None:
        """Adopt a decision, checking that it fits what is there."""
        if time_s < self.clock_s - 1e-9:
            raise InvariantError(f"clock went back from {self.clock_s} s to {time_s} s")
        self.clock_s = time_s
        if decision.num_on_demand is not None:
            self.num_on_demand = decision.num_on_demand
        chosen = decision.configuration
        used = (decision.num_instances_used if decision.num_instances_used is not None
                else chosen.num_instances if chosen is not None else 0)
        if chosen is not None:
            if used > num_available + self.num_on_demand:
                raise InvariantError(
                    f"configuration {chosen} uses {used} instances; only "
                    f"{num_available} spot + {self.num_on_demand} on-demand are available")
            if (chosen.data_parallel >= self.grid.shape[0]
                    or chosen.pipeline_stages >= self.grid.shape[1]
                    or self.grid[chosen.data_parallel, chosen.pipeline_stages] <= 0):
                raise InvariantError(f"configuration {chosen} is not feasible for this model")
        self.reconfigurations += int(chosen != self.current or decision.downtime_s > 0)
        if chosen is None:
            self.moving_s = 0.0
        elif chosen != self.current or decision.downtime_s > 0:
            self.moving_s = decision.downtime_s
        self.moving_s += decision.checkpoint_s
        self.redo_s += decision.rollback_s
        self.current = chosen
        self.used = used
        self.factor = decision.throughput_factor

    def run(self, seconds: float) -> None:
        """Train for ``seconds`` of wall time, after the move and the re-done work."""
        if self.current is None:
            return
        moving = min(self.moving_s, seconds)
        redo = min(self.redo_s, seconds - moving)
        self.moving_s -= moving
        self.redo_s -= redo
        paid = moving + redo
        self.downtime_s += paid
        rate = self.grid[self.current.data_parallel, self.current.pipeline_stages] * self.factor
        gained = rate * (seconds - paid)
        if gained < 0:
            raise InvariantError("samples would decrease")
        self.samples += gained

    def bill(self, spot_instance_s: float, seconds: float) -> None:
        """Pay ``spot_instance_s`` spot instance-seconds and ``seconds`` of the on-demand
        instances held now."""
        self.cost_usd += (spot_instance_s * self.spot_usd_per_s
                          + self.num_on_demand * seconds * self.on_demand_usd_per_s)

    def measurements(self, configurations: list[tuple[int, int]],
                     trained_s: dict[tuple[int, int], float],
                     global_batch_size: int) -> tuple[Measurement, ...]:
        """The step time each configuration trains at, as the runtime measures it."""
        out = []
        for d, p in configurations:
            rate = float(self.grid[d, p])
            out.append(Measurement(d, p, global_batch_size / rate,
                                   max(1, int(trained_s[(d, p)] * rate / global_batch_size))))
        return tuple(out)

    def spot_in_use(self) -> int:
        return self.used - min(self.num_on_demand, self.used)


def _lost_slots(current: Configuration | None, num_on_demand: int, lost_positions: np.ndarray,
                ) -> tuple[tuple[tuple[int, int], ...], int]:
    """Map lost spot positions to ``(pipeline, stage)`` slots of ``current`` and lost spares.

    Positions ``0..s-1`` are the spot slots of the configuration (stage by stage, the on-demand
    instances of each stage take its first slots), positions ``>= s`` are spares.
    """
    if current is None:
        return (), len(lost_positions)
    d, p = current.data_parallel, current.pipeline_stages
    on_demand = on_demand_per_stage(num_on_demand, d, p)
    slots = [(pipeline, stage) for stage in range(p)
             for pipeline in range(int(on_demand[stage]), d)]
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
            "or --start-hour/--end-hour")


def simulate_policy(trace: IntervalTrace, profile: ModelProfile, policy: str,
                    config: SimulationConfig | None = None,
                    context: PolicyContext | None = None,
                    on_step: Callable[[int], None] | None = None,
                    actual: ConfigTable | None = None,
                    learn: OnlineCalibration | None = None) -> PolicyRun:
    """Replay ``trace`` with one policy (module docstring gives the model).

    ``actual``: the samples/s each configuration really trains at, where it differs from the
    table the policy plans with (``context.table``, an estimate); None: the policy's table.
    ``learn``: re-fit the policy's table to the step times measured as the job runs."""
    config = config or SimulationConfig()
    factory = POLICIES.get(policy)
    context = context or make_context(trace, profile, config)
    decider = factory(context)
    trained_s: dict[tuple[int, int], float] = {}
    fitted_on: frozenset[tuple[int, int]] = frozenset()
    next_fit_s = 0.0
    draws = _Draws.make(len(trace), config.seed)
    job = _Job(context, config.num_on_demand, actual)
    interval_s = config.interval_s
    num_intervals = len(trace)
    data_parallel = np.zeros(num_intervals, dtype=np.int64)
    stages = np.zeros(num_intervals, dtype=np.int64)
    on_demand = np.zeros(num_intervals, dtype=np.int64)
    cumulative_samples = np.zeros(num_intervals)
    cumulative_cost = np.zeros(num_intervals)
    gone = 0  # released in the interval before, booting again
    for t in range(num_intervals):
        start_s = t * interval_s
        if learn is not None and start_s >= next_fit_s - 1e-9:
            next_fit_s = start_s + learn.every_s
            measured = frozenset(c for c, seconds in trained_s.items()
                                 if seconds >= learn.min_trained_s)
            if measured != fitted_on:
                fitted_on = measured
                table = learn.fit(job.measurements(sorted(measured), trained_s,
                                                   profile.global_batch_size))
                decider = factory(dataclasses.replace(context, table=table))
        available = max(int(trace.count[t]) - gone, 0)
        observation = Observation(
            time_s=start_s, interval_index=t, interval_s=interval_s, history=trace.head(t + 1),
            num_available=available, current=job.current, num_on_demand=job.num_on_demand,
            future=trace.window(t + 1), capacity=context.capacity, remaining_s=interval_s)
        decision = decider.decide(observation)
        job.apply(decision, available, start_s)
        data_parallel[t] = job.current.data_parallel if job.current else 0
        stages[t] = job.current.pipeline_stages if job.current else 0
        on_demand[t] = job.num_on_demand
        released = min(decision.release, available - job.spot_in_use())
        held = available - max(released, 0)
        before = job.samples
        num_lost = int(trace.preempted[t])
        lost_held = 0
        if num_lost == 0:
            job.run(interval_s)
            job.bill(held * interval_s, interval_s)
        else:
            hit_s = float(draws.loss_fraction[t]) * interval_s
            job.run(hit_s)
            # The losses fall among the market's instances; the job's are its first positions.
            order = draws.loss_order(t, int(trace.count[t]))
            lost_positions = order[:num_lost]
            lost_positions = lost_positions[lost_positions < available]
            lost_slots, lost_spares = _lost_slots(job.current, job.num_on_demand, lost_positions)
            # Lost instances were held until the loss (released spares sit last in the order).
            lost_held = int(np.sum(lost_positions < held))
            job.bill(held * hit_s + (held - lost_held) * (interval_s - hit_s), hit_s)
            event = Observation(
                time_s=start_s + hit_s, interval_index=t, interval_s=interval_s,
                history=observation.history, num_available=available - len(lost_positions),
                current=job.current, num_on_demand=job.num_on_demand, future=observation.future,
                capacity=context.capacity, event=ObservationEvent.PREEMPTION, lost_slots=lost_slots,
                lost_spares=lost_spares, remaining_s=interval_s - hit_s)
            job.apply(decider.decide(event), available - len(lost_positions), start_s + hit_s)
            job.run(interval_s - hit_s)
            job.bill(0.0, interval_s - hit_s)
        gone = (available - held) - (len(lost_positions) - lost_held if num_lost else 0)
        if job.samples < before or min(job.moving_s, job.redo_s) < -1e-9:
            raise InvariantError(f"interval {t}: samples decreased or negative lost time")
        if job.current is not None and job.samples > before:
            key = (job.current.data_parallel, job.current.pipeline_stages)
            trained_s[key] = trained_s.get(key, 0.0) + (job.samples - before) / float(
                job.grid[key])
        cumulative_samples[t] = job.samples
        cumulative_cost[t] = job.cost_usd
        if on_step is not None:
            on_step(t)
    samples = float(job.samples)
    logger.info("%s on %s: %.0f samples, $%.2f", policy, trace.name, samples, job.cost_usd)
    return PolicyRun(
        policy=policy,
        samples=samples,
        cost_usd=float(job.cost_usd),
        usd_per_1k_samples=float(job.cost_usd) / samples * 1000 if samples > 0 else float("inf"),
        reconfigurations=job.reconfigurations,
        downtime_s=float(job.downtime_s),
        interval_s=interval_s,
        available=trace.count.copy(),
        data_parallel=data_parallel,
        pipeline_stages=stages,
        on_demand=on_demand,
        cumulative_samples=cumulative_samples,
        cumulative_cost_usd=cumulative_cost,
    )


def simulate(trace: IntervalTrace, profile: ModelProfile, policies: Sequence[str],
             config: SimulationConfig | None = None,
             on_step: Callable[[str, int], None] | None = None) -> SimulationResult:
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
