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

A budget (``--budget-usd`` or ``--budget-usd-per-hour``, as ``liveput simulate``'s) binds as in
the simulator: the policy rents on-demand instances only within it (per hour: beside the spot
instances held; total: what is left of it, spread over the hours to the deadline). It neither
stops the job nor caps the spot instances, whose dollars count against it: the summary says what
was spent against it (:meth:`~liveput.launch.cloud.LocalCloud.summary`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from liveput.catalog import load_catalog
from liveput.errors import LiveputError
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
    budget_usd: float | None = None
    """Most dollars the whole job may cost (None: no cap): the policy rents on-demand instances
    within what is left of it, spread over the hours to the deadline, as the simulator's do."""
    budget_usd_per_hour: float | None = None
    """Most dollars per hour the instances held at once may cost (None: no cap): the policy
    rents on-demand instances only within what the spot ones it holds leave of it."""

    def __post_init__(self) -> None:
        objective = self.objective(steps=1)  # checks the deadline, cap and budget
        spec = load_catalog("aws").get(self.instance_type)  # an unknown type: a one-line error
        # A budget that pays for no instance (one hour of one, for a total) is refused now.
        objective.check_budget(min(spec.spot_usd_per_hour, spec.on_demand_usd_per_hour))
        DEADLINE_POLICIES.get(self.policy)  # an unknown policy: a one-line error

    def objective(self, steps: int) -> JobObjective:
        """The policy's objective: ``steps`` by the deadline, within the cap and the budget."""
        return JobObjective(
            self.deadline_hours,
            steps=steps,
            budget_usd=self.budget_usd,
            budget_usd_per_hour=self.budget_usd_per_hour,
            on_demand_max=self.on_demand_max,
        )


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
    ``prices_usd_per_hour`` (spot, on-demand) replace the catalog's (a provider's quote). The
    job's budget caps the on-demand instances the policy rents (a budget below the cheapest
    instance at these prices is refused)."""
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
    return make_deadline_context(
        intervals,
        profile,
        job.objective(steps),
        SimulationConfig(
            interval_s=interval_s,
            spot_price_usd_per_hour=spot_usd,
            on_demand_price_usd_per_hour=on_demand_usd,
        ),
    )


def deadline_job(
    deadline_hours: float | None,
    on_demand_max: int | None,
    instance_type: str,
    policy: str,
    budget_usd: float | None = None,
    budget_usd_per_hour: float | None = None,
) -> DeadlineJob | None:
    """``liveput train``'s deadline job of its options (None: no deadline); a budget without a
    deadline, or both budgets, are refused in one line."""
    budgets = [
        name
        for name, value in (
            ("--budget-usd", budget_usd),
            ("--budget-usd-per-hour", budget_usd_per_hour),
        )
        if value is not None
    ]
    if len(budgets) == 2:
        raise LiveputError("train: give --budget-usd or --budget-usd-per-hour, not both")
    if deadline_hours is None:
        if budgets:
            raise LiveputError(
                f"train: {budgets[0]} needs --deadline-hours (the deadline policy is what "
                "rents within a budget)"
            )
        return None
    return DeadlineJob(
        deadline_hours,
        on_demand_max,
        instance_type,
        policy,
        budget_usd=budget_usd,
        budget_usd_per_hour=budget_usd_per_hour,
    )
