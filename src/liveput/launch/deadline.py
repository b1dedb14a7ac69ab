"""A deadline job on the emulated provider: ``liveput train --deadline-hours H``.

The coordinator asks a deadline policy (:mod:`liveput.policies.deadline`) each interval, as the
deadline simulator does; the policy's :class:`~liveput.policies.base.Provisioning` is carried out
by an :class:`~liveput.cloud.holding.InstanceHolder` (through the market adapter,
:class:`~liveput.cloud.market.HolderMarket`) over an
:class:`~liveput.cloud.emulated.EmulatedProvider` that starts one agent process per running
instance (:class:`~liveput.launch.cloud.LocalCloud`): spot instances as the trace allows (a
preempted one is asked for again), on-demand ones after their launch delay, never preempted,
registered as on-demand (the planner spreads them over the stages). Times are the trace's
(cloud) seconds: the deadline, the bill and ``finished_hours`` are in them, ``time_scale`` of
them per wall second. This module holds the job's deadline and what its policy knows.

What the runtime does not do yet, unlike the simulator: it keeps asking for every spot instance
the trace offers (up to ``workers``) rather than releasing idle spot spares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from liveput.catalog import load_catalog
from liveput.perf.types import ModelProfile
from liveput.policies.deadline import DEADLINE_POLICIES, DeadlineContext
from liveput.policies.objective import JobObjective
from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import make_deadline_context
from liveput.traces import IntervalTrace, Trace

__all__ = ["DeadlineJob", "deadline_context"]


@dataclass(frozen=True)
class DeadlineJob:
    """The deadline of a local training run and what it may rent."""

    deadline_hours: float
    """Trace hours from the start by which every step must be done."""
    on_demand_max: int | None = None
    """Most on-demand instances held at once (None: the trace's peak count)."""
    instance_type: str = "p3.2xlarge"
    """Catalog instance type the emulated provider rents and prices (spot and on-demand)."""
    policy: str = "liveput"
    """Deadline policy: ``liveput``, ``uniform-progress``, ``greedy``, ``on-demand`` or
    ``spot-only``."""

    def __post_init__(self) -> None:
        JobObjective(self.deadline_hours, steps=1, on_demand_max=self.on_demand_max)  # checks
        load_catalog("aws").get(self.instance_type)  # an unknown type: a one-line error
        DEADLINE_POLICIES.get(self.policy)  # an unknown policy: a one-line error


def deadline_context(
    trace: Trace | IntervalTrace,
    profile: ModelProfile,
    job: DeadlineJob,
    steps: int,
    time_scale: float = 1.0,
    interval_s: float = 60.0,
    prices_usd_per_hour: tuple[float, float] | None = None,
) -> DeadlineContext:
    """What the deadline policy knows: the work (``steps``), the deadline, the catalog prices of
    ``job.instance_type``; a deadline shorter than the fastest possible finish is refused.

    The profile was measured in wall seconds and the policy counts trace seconds, of which
    ``time_scale`` pass per wall second: its compute times are stretched by ``time_scale``.
    ``prices_usd_per_hour`` (spot, on-demand) replace the catalog's (a provider's quote)."""
    intervals = trace.resample(interval_s) if isinstance(trace, Trace) else trace
    profile = dataclasses.replace(
        profile,
        layers=tuple(
            dataclasses.replace(
                layer,
                forward_s=layer.forward_s * time_scale,
                backward_s=layer.backward_s * time_scale,
                optimizer_s=layer.optimizer_s * time_scale,
            )
            for layer in profile.layers
        ),
    )
    spec = load_catalog("aws").get(job.instance_type)
    spot_usd, on_demand_usd = prices_usd_per_hour or (
        spec.spot_usd_per_hour,
        spec.on_demand_usd_per_hour,
    )
    objective = JobObjective(job.deadline_hours, steps=steps, on_demand_max=job.on_demand_max)
    return make_deadline_context(
        intervals,
        profile,
        objective,
        SimulationConfig(
            interval_s=interval_s,
            spot_price_usd_per_hour=spot_usd,
            on_demand_price_usd_per_hour=on_demand_usd,
        ),
    )
