"""What a replay is run for: the strategy the one executor (:func:`liveput.sim.engine.execute`)
is handed, never a branch on a policy's name.

The executor owns time, losses and the job's training (decide, run, lose, recover); an
:class:`Objective` owns what differs between kinds of jobs: the policy it asks, what the
observation adds, which of the available spot instances the job holds, how instances are paid
for, when the replay stops and the figures of the run. Two are built in:

- :class:`Throughput` (here): as many samples as the trace allows, spot instances held as the
  policy keeps them, a fixed number of on-demand ones (or what the decision asks), no end but
  the trace's;
- :class:`liveput.sim.deadline.Deadline`: a fixed amount of work by a deadline, an emulated
  on-demand market with launch delays, the replay ends when the work is done.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from liveput.perf.types import ConfigTable, Measurement
from liveput.policies import POLICIES, Decision, Observation, PolicyContext
from liveput.sim.job import SimulatedJob
from liveput.traces import IntervalTrace

logger = logging.getLogger(__name__)


@dataclass
class Interval:
    """One interval of a replay as the executor saw it (what an objective's hooks read)."""

    index: int
    """Interval index t."""
    start_s: float
    """Its start, ``t * T`` seconds."""
    interval_s: float
    """Its length T, seconds."""
    available: int
    """Spot instances available at its start (the market's count less those released before)."""
    num_lost: int = 0
    """Instances the market lost in it (the trace's count)."""
    pool: int = 0
    """Spot instances the job's losses fall among (its first positions in the market)."""
    held: int = 0
    """Spot instances billed in it (the pool less the spares released now)."""
    hit_s: float = 0.0
    """Seconds into it when its losses fall (T when none fall)."""
    lost_held: int = 0
    """Held instances lost at ``hit_s``."""
    done_s: float | None = None
    """Seconds into it when the work was done (None: not done)."""
    samples_before: float = 0.0
    """Samples trained before it."""


class Objective(ABC):
    """One policy's replay under one objective: the hooks the executor calls, in this order,
    each interval: :meth:`begin`, :meth:`observed`, :meth:`adopt`; on a loss
    :meth:`on_loss`, :meth:`event_fields`, :meth:`recover`; then :meth:`close`; and once at
    the end :meth:`outcome`."""

    policy_name: str
    """The policy's registered name (what the run reports)."""
    context: PolicyContext
    """What every policy knows before the replay."""
    target_samples: float = math.inf
    """Samples at which the job is done and the replay stops (inf: it trains to the end)."""

    @abstractmethod
    def new_job(self) -> SimulatedJob:
        """The job before the first interval."""

    @abstractmethod
    def decide(self, observation: Observation) -> Decision:
        """The policy's decision."""

    def replayed(self, trace: IntervalTrace) -> IntervalTrace:
        """The trace the executor replays (the given one, unless the objective extends it)."""
        return trace

    def begin(self, job: SimulatedJob, interval: Interval) -> None:
        """An interval starts (before the policy is asked)."""

    def observed(self, job: SimulatedJob, interval: Interval) -> dict[str, Any]:
        """Observation fields the objective adds (beyond time, trace, counts and the job)."""
        return {}

    @abstractmethod
    def adopt(self, job: SimulatedJob, decision: Decision, interval: Interval) -> None:
        """Apply the interval's decision; set ``interval.pool`` and ``interval.held``."""

    def on_loss(self, job: SimulatedJob, interval: Interval) -> None:
        """The interval's losses just fell (before the policy recovers)."""

    def event_fields(self) -> dict[str, Any]:
        """Observation fields of the loss event that differ from the interval's start."""
        return {}

    @abstractmethod
    def recover(
        self, job: SimulatedJob, decision: Decision, num_available: int, time_s: float
    ) -> None:
        """Apply the decision taken after a loss."""

    @abstractmethod
    def close(self, job: SimulatedJob, interval: Interval) -> bool:
        """The interval ends: pay for it; True when the replay stops here."""

    @abstractmethod
    def paid_usd(self, job: SimulatedJob, interval: Interval) -> float:
        """Dollars paid by the end of the interval just closed (or the finish)."""

    @abstractmethod
    def outcome(
        self, job: SimulatedJob, trace: IntervalTrace, intervals_replayed: int
    ) -> dict[str, Any]:
        """The run's figures beyond its series: ``cost_usd`` and the objective's own."""


@dataclass(frozen=True)
class OnlineCalibration:
    """The runtime's online calibration, for the simulator to do what it does (module
    docstring of :mod:`liveput.sim.engine`)."""

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


class Throughput(Objective):
    """As many samples as the trace allows: spot instances as the policy keeps them (released
    spares are gone for the next interval), ``num_on_demand`` on-demand ones all along (or as
    decisions set them), every instance billed per second while held."""

    def __init__(
        self,
        policy: str,
        context: PolicyContext,
        num_on_demand: int,
        actual: ConfigTable | None = None,
        learn: OnlineCalibration | None = None,
    ) -> None:
        self.policy_name = policy
        self.context = context
        self.num_on_demand = num_on_demand
        self.actual = actual
        self.learn = learn
        self.policy = POLICIES.get(policy)(context)
        self.trained_s: dict[tuple[int, int], float] = {}
        """Seconds each (D, P) has trained (what the runtime has measured)."""
        self.fitted_on: frozenset[tuple[int, int]] = frozenset()
        self.next_fit_s = 0.0

    def new_job(self) -> SimulatedJob:
        return SimulatedJob(self.context, self.num_on_demand, self.actual)

    def decide(self, observation: Observation) -> Decision:
        return self.policy.decide(observation)

    def begin(self, job: SimulatedJob, interval: Interval) -> None:
        """Re-fit the policy's table to what was measured, every ``learn.every_s``."""
        learn = self.learn
        if learn is None or interval.start_s < self.next_fit_s - 1e-9:
            return
        self.next_fit_s = interval.start_s + learn.every_s
        measured = frozenset(
            c for c, seconds in self.trained_s.items() if seconds >= learn.min_trained_s
        )
        if measured != self.fitted_on:
            self.fitted_on = measured
            table = learn.fit(
                job.measurements(
                    sorted(measured), self.trained_s, self.context.profile.global_batch_size
                )
            )
            self.policy = self.policy.refitted(dataclasses.replace(self.context, table=table))

    def adopt(self, job: SimulatedJob, decision: Decision, interval: Interval) -> None:
        job.apply(decision, interval.available, interval.start_s)
        released = min(decision.release, interval.available - job.spot_in_use())
        interval.pool = interval.available
        interval.held = interval.available - max(released, 0)

    def on_loss(self, job: SimulatedJob, interval: Interval) -> None:
        # Lost instances were held until the loss (released spares sit last in the order).
        held, hit_s = interval.held, interval.hit_s
        job.bill(held * hit_s + (held - interval.lost_held) * (interval.interval_s - hit_s), hit_s)

    def recover(
        self, job: SimulatedJob, decision: Decision, num_available: int, time_s: float
    ) -> None:
        job.apply(decision, num_available, time_s)

    def close(self, job: SimulatedJob, interval: Interval) -> bool:
        if interval.num_lost:
            job.bill(0.0, interval.interval_s - interval.hit_s)
        else:
            job.bill(interval.held * interval.interval_s, interval.interval_s)
        if job.current is not None and job.samples > interval.samples_before:
            key = (job.current.data_parallel, job.current.pipeline_stages)
            self.trained_s[key] = self.trained_s.get(key, 0.0) + (
                job.samples - interval.samples_before
            ) / float(job.grid[key])
        return False

    def paid_usd(self, job: SimulatedJob, interval: Interval) -> float:
        return job.cost_usd

    def outcome(
        self, job: SimulatedJob, trace: IntervalTrace, intervals_replayed: int
    ) -> dict[str, Any]:
        logger.info(
            "%s on %s: %.0f samples, $%.2f", self.policy_name, trace.name, job.samples, job.cost_usd
        )
        return {"cost_usd": float(job.cost_usd)}
