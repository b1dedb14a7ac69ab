"""A deadline job on the emulated provider: ``liveput train --deadline-hours H``.

The coordinator asks a deadline policy (:mod:`liveput.policies.deadline`) each interval, as the
deadline simulator does; the policy's :class:`~liveput.policies.base.Provisioning` is carried out
here, by an :class:`~liveput.cloud.holding.InstanceHolder` over an
:class:`~liveput.cloud.emulated.EmulatedProvider` that starts one agent process per running
instance: spot instances as the trace allows (a preempted one is asked for again), on-demand ones
after their launch delay, never preempted, registered as on-demand (the planner spreads them
over the stages). Times are the trace's (cloud) seconds: the deadline, the bill and
``finished_hours`` are in them, ``time_scale`` of them per wall second.

What the runtime does not do yet, unlike the simulator: it keeps asking for every spot instance
the trace offers (up to ``workers``) rather than releasing idle spot spares.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from liveput.advise.catalog import load_catalog
from liveput.cloud.emulated import EmulatedProvider, EmulatedProviderConfig
from liveput.cloud.holding import Holding, InstanceHolder
from liveput.cloud.types import InstanceState, Market, ProviderEventKind
from liveput.perf.types import ModelProfile
from liveput.policies.base import Provisioning
from liveput.policies.deadline import DEADLINE_POLICIES, DeadlineContext
from liveput.policies.objective import JobObjective
from liveput.runtime.clock import Clock
from liveput.runtime.processes import Launcher
from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import make_deadline_context
from liveput.traces import IntervalTrace, Trace

LOG = logging.getLogger(__name__)
__all__ = ["DeadlineJob", "HolderMarket", "ProvidedCloud", "deadline_context"]


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


def deadline_context(trace: Trace | IntervalTrace, profile: ModelProfile, job: DeadlineJob,
                     steps: int, time_scale: float = 1.0, interval_s: float = 60.0,
                     prices_usd_per_hour: tuple[float, float] | None = None) -> DeadlineContext:
    """What the deadline policy knows: the work (``steps``), the deadline, the catalog prices of
    ``job.instance_type``; a deadline shorter than the fastest possible finish is refused.

    The profile was measured in wall seconds and the policy counts trace seconds, of which
    ``time_scale`` pass per wall second: its compute times are stretched by ``time_scale``.
    ``prices_usd_per_hour`` (spot, on-demand) replace the catalog's (a provider's quote)."""
    intervals = trace.resample(interval_s) if isinstance(trace, Trace) else trace
    profile = dataclasses.replace(profile, layers=tuple(
        dataclasses.replace(layer, forward_s=layer.forward_s * time_scale,
                            backward_s=layer.backward_s * time_scale,
                            optimizer_s=layer.optimizer_s * time_scale)
        for layer in profile.layers))
    spec = load_catalog("aws").get(job.instance_type)
    spot_usd, on_demand_usd = prices_usd_per_hour or (spec.spot_usd_per_hour,
                                                      spec.on_demand_usd_per_hour)
    objective = JobObjective(job.deadline_hours, steps=steps, on_demand_max=job.on_demand_max)
    return make_deadline_context(intervals, profile, objective, SimulationConfig(
        interval_s=interval_s, spot_price_usd_per_hour=spot_usd,
        on_demand_price_usd_per_hour=on_demand_usd))


class HolderMarket:
    """A deadline job's view of any provider (a :class:`~liveput.runtime.coordinator.MarketView`):
    the holder asks for ``spot`` instances all along (the runtime does not release idle spot
    spares) and for the on-demand instances the policy wants."""

    def __init__(self, holder: InstanceHolder, spot: int) -> None:
        self.holder = holder
        self.spot = spot

    def on_demand_pending(self) -> int:
        return sum(1 for r in self.holder.provider.instances()
                   if r.market is Market.ON_DEMAND and r.state is InstanceState.PENDING)

    def usd_spent(self) -> float:
        return self.holder.provider.bill().usd

    def provision(self, provisioning: Provisioning) -> None:
        target = Holding(self.spot, provisioning.on_demand)
        if target != self.holder.target:
            LOG.info("provisioning: %d spot and %d on-demand instances (was %s)", target.spot,
                     target.on_demand, self.holder.target)
            self.holder.target = target
            self.holder.reconcile()


class ProvidedCloud:
    """The emulated provider and the holder that carries out the policy's provisioning, with the
    surface ``liveput train`` reads (instances, preemptions, allocations, close)."""

    def __init__(self, trace: Trace | IntervalTrace, launcher: Launcher, clock: Clock,
                 notice_dir: Path, *, workers: int, time_scale: float, notice_lead_s: float,
                 instance_type: str, seed: int) -> None:
        self.workers = workers
        self.provider = EmulatedProvider(trace, clock, EmulatedProviderConfig(
            instance_types=(instance_type,), time_scale=time_scale,
            notice_lead_s=notice_lead_s, seed=seed), launcher=launcher, notice_dir=notice_dir)
        self.holder = InstanceHolder(self.provider, Holding(workers, 0), [instance_type])
        self.market = HolderMarket(self.holder, workers)
        self.finished_s: float | None = None
        """Cloud seconds at which the job's last step committed (set by :meth:`finish`)."""

    # --- acting -------------------------------------------------------------------------------
    def start_background(self, interval_s: float) -> None:
        self.holder.reconcile()
        self.provider.start_background()
        self.holder.start_background(interval_s)

    def finish(self) -> None:
        """The job is done: hold nothing more (agents already ending finish by themselves)."""
        self.finished_s = self.provider.now_s()
        self.holder.target = Holding(0, 0)
        self.holder.reconcile()

    @property
    def instances(self) -> dict[str, int]:
        return self.provider.pids()

    @property
    def preemptions(self) -> int:
        return sum(e.kind is ProviderEventKind.PREEMPT for e in self.provider.events)

    @property
    def allocations(self) -> int:
        return sum(e.kind is ProviderEventKind.LAUNCH for e in self.provider.events)

    def close(self) -> None:
        self.holder.close()
        self.provider.close()

    def summary(self, deadline_hours: float) -> dict:
        """The deadline fields of the ``--json`` document (cloud hours, dollars)."""
        bill = self.provider.bill()
        finished_s = self.provider.now_s() if self.finished_s is None else self.finished_s
        return {"deadline_hours": deadline_hours,
                "finished_hours": round(finished_s / 3600.0, 4),
                "deadline_met": finished_s <= deadline_hours * 3600.0,
                "usd": round(bill.usd, 4), "usd_spot": round(bill.usd_spot, 4),
                "usd_on_demand": round(bill.usd_on_demand, 4),
                "on_demand_hours": round(bill.on_demand_hours, 4)}

