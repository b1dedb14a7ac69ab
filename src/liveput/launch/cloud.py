"""The cloud of ``liveput train``: the one emulated provider, replaying a trace as the job's
instances, or (a deadline job) renting through a holder from a trace of spot capacity."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from liveput.cloud.billing import BillingAccount, peak_holding
from liveput.cloud.emulated import EmulatedProvider, EmulatedProviderConfig, SpotModel
from liveput.cloud.holding import InstanceHolder
from liveput.cloud.market import HolderMarket
from liveput.cloud.processes import Launcher
from liveput.cloud.types import InstanceState
from liveput.policies.base import Provisioning
from liveput.runtime import keys
from liveput.runtime.clock import Clock
from liveput.runtime.coordinator.objective import EarlierCoordinators
from liveput.runtime.instance_env import instance_number
from liveput.runtime.store import Store
from liveput.traces import IntervalTrace, Trace

if TYPE_CHECKING:
    from liveput.launch.deadline import DeadlineJob


class LocalCloud:
    """The emulated provider of ``liveput train``, with the surface it reads (agents running,
    ended instances, preemptions, allocations, close).

    Without an ``instance_type`` it replays the trace as the job's instances
    (:attr:`SpotModel.REPLAY`). With one (a deadline job) the trace is the spot capacity and a
    holder carries out the policy's provisioning (:attr:`market`): it asks for ``workers`` spot
    instances all along, and for the on-demand instances the policy wants.

    ``loss_signal_delay_s``: trace seconds from an instance's end until the provider's list
    reports it (None: never; :class:`EmulatedProviderConfig`)."""

    def __init__(
        self,
        trace: Trace | IntervalTrace,
        launcher: Launcher,
        clock: Clock,
        notice_dir: Path,
        *,
        workers: int,
        time_scale: float,
        notice_lead_s: float,
        seed: int,
        instance_type: str | None = None,
        loss_signal_delay_s: float | None = 0.0,
    ) -> None:
        self.workers = workers
        self.provider = EmulatedProvider(
            trace,
            clock,
            EmulatedProviderConfig(
                instance_types=() if instance_type is None else (instance_type,),
                time_scale=time_scale,
                notice_lead_s=notice_lead_s,
                seed=seed,
                spot=SpotModel.REPLAY if instance_type is None else SpotModel.CAPACITY,
                loss_signal_delay_s=loss_signal_delay_s,
            ),
            launcher=launcher,
            notice_dir=notice_dir,
        )
        self.holder = (
            None
            if instance_type is None
            else InstanceHolder(self.provider, Provisioning(workers, 0), [instance_type])
        )
        self.market = None if self.holder is None else HolderMarket(self.holder, workers)
        """The coordinator's view of the market (None: the trace decides the instances)."""
        self.finished_s: float | None = None
        """Cloud seconds at which the job's last step committed (set by :meth:`finish`)."""

    def start_background(self, interval_s: float) -> None:
        """Start the provider's thread (and the holder's, reconciling every ``interval_s``)."""
        if self.holder is not None:
            self.holder.reconcile()
        self.provider.start_background()
        if self.holder is not None:
            self.holder.start_background(interval_s)

    def finish(self) -> None:
        """The job is done: hold nothing more (agents already ending finish by themselves)."""
        self.finished_s = self.provider.now_s()
        if self.holder is not None:
            self.holder.target = Provisioning(0, 0)
            self.holder.reconcile()

    @property
    def agents_running(self) -> bool:
        """Whether any instance's agent process still runs (an instance noticed of its
        preemption whose agent exited is an instance until its kill, but has no agent)."""
        return bool(self.provider.running_agents())

    def ended_instances(self) -> list[int]:
        """The job's instance numbers of the instances the provider's list reports ended
        (preempted, released, or exited), read as an EC2 caller reads ``DescribeInstances``: an
        end by the cloud's hand shows only its loss signal delay after it."""
        return sorted(
            number
            for record in self.provider.instances()
            if record.state == InstanceState.TERMINATED
            and (number := instance_number(record.instance_id)) is not None
        )

    @property
    def preemptions(self) -> int:
        return self.provider.preemptions

    @property
    def allocations(self) -> int:
        return self.provider.allocations

    def close(self) -> None:
        if self.holder is not None:
            self.holder.close()
        self.provider.close()

    def summary(self, job: DeadlineJob, earlier: EarlierCoordinators | None = None) -> dict:
        """The deadline fields of the ``--json`` document (cloud hours, dollars, and what was
        spent against the job's budget: ``within_budget`` is None without one).

        A resumed job counts from its first coordinator (``earlier``): ``finished_hours`` and
        ``deadline_met`` take in the cloud hours before this run, ``usd`` the dollars billed
        then (``usd_before_resume``; ``usd_spot`` and ``usd_on_demand`` are this run's)."""
        earlier = earlier or EarlierCoordinators()
        records = self.provider.records()  # billed to their true ends, reported or not
        now_s = self.provider.now_s()
        bill = BillingAccount.bill(records, now_s)
        peak = peak_holding(records, now_s)
        before_s = earlier.elapsed_wall_s * self.provider.config.time_scale
        finished_s = before_s + (now_s if self.finished_s is None else self.finished_s)
        usd = earlier.usd + bill.usd
        within = None
        if job.budget_usd is not None:
            within = usd <= job.budget_usd + 1e-9
        elif job.budget_usd_per_hour is not None:
            within = peak.usd_per_hour <= job.budget_usd_per_hour + 1e-9
        return {
            "deadline_hours": job.deadline_hours,
            "finished_hours": round(finished_s / 3600.0, 4),
            "deadline_met": finished_s <= job.deadline_hours * 3600.0,
            "usd": round(usd, 4),
            "usd_before_resume": round(earlier.usd, 4),
            "usd_spot": round(bill.usd_spot, 4),
            "usd_on_demand": round(bill.usd_on_demand, 4),
            "on_demand_hours": round(bill.on_demand_hours, 4),
            "on_demand_peak": peak.on_demand,
            "usd_per_hour_peak": round(peak.usd_per_hour, 4),
            "budget_usd": job.budget_usd,
            "budget_usd_per_hour": job.budget_usd_per_hour,
            "within_budget": within,
        }


def tell_gone(store: Store, ended: Iterable[int], seen: set[int]) -> None:
    """``gone/<n>`` for each registered instance of ``ended`` (the cloud ended it) not yet in
    ``seen``, which then holds it: the coordinator counts it dead at its next look instead of a
    heartbeat timeout later, which after a total loss without a notice kept the first instance
    back waiting that long to restore. Each ended instance is looked at once: one that never
    registered (its process is gone, it never will) has nothing to plan around, and no keys for
    pruning to forget with it."""
    for number in ended:
        if number in seen:
            continue
        seen.add(number)
        if store.get(keys.member(number)) is not None:
            store.set(keys.gone(number), b"1")
