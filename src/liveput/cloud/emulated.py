"""The emulated provider (the default, no account needed): spot follows a trace, on-demand is late.

The trace drives spot instances in one of two ways (:class:`SpotModel`):

- *capacity* (``liveput train --deadline-hours``, ``liveput coordinator --provider emulated``):
  the trace's count at cloud time ``t`` is the spot capacity ``C(t)``, what the market would let
  this job hold; spot requests are queued, run within it and are noticed and killed as it
  shrinks (:mod:`liveput.cloud.capacity` says how).
- *replay* (``liveput train``): the trace is one job's own spot instances. :meth:`start`
  launches its initial instances; each instance it adds is launched at its time, unasked; for
  each instance it removes at ``t`` a victim (seeded) gets a notice at ``t - notice_lead_s``
  (AWS 120 s, GCP 30 s) and is SIGKILLed at ``t``. If no instance is there to be noticed when a
  removal's notice falls due (the victim is still to be launched), the notice goes to the next
  instance launched before ``t``, with a shorter lead; a removal whose time comes with nobody
  to remove is void. An agent that ends by itself before any notice is gone (an ``exit``
  event), not replaced. Spot requests are refused: the trace alone grants spot instances.

On-demand (both): a request is granted at once, pending; each instance starts running after a
launch delay drawn uniformly (seeded) from ``on_demand_delay_s`` (default 60-90 s; CM-DARE
measured 70-92 s on EC2), and is never preempted.

Quotas: the catalog's vCPU quota per (family, market) counts pending and running instances
(:func:`~liveput.cloud.capacity.within_quota`). Billing: an instance is charged its catalog price
from its start to its release or kill, in cloud (trace) seconds (``time_scale`` of them per clock
second), even where the API reports its end ``loss_signal_delay_s`` late
(:mod:`liveput.cloud.loss_report`). With a launcher each running instance is an agent process
(:class:`~liveput.cloud.processes.InstanceProcesses`, :mod:`liveput.runtime.instance_env`);
without one the provider only accounts. Step it with :meth:`EmulatedProvider.step` after
moving a manual clock, or on a thread in real time (:meth:`EmulatedProvider.start_background`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from liveput.catalog import Catalog, load_catalog
from liveput.cloud.capacity import CapacitySchedule, within_quota
from liveput.cloud.emulated_config import DEFAULT_ZONES as DEFAULT_ZONES
from liveput.cloud.emulated_config import EmulatedProviderConfig, SpotModel
from liveput.cloud.loss_report import as_reported, report_s
from liveput.cloud.processes import InstanceProcesses, Launcher
from liveput.cloud.provider import Provider
from liveput.cloud.retry import ProviderError
from liveput.cloud.spot_supply import spot_supply
from liveput.cloud.stepping import BackgroundStepper
from liveput.cloud.types import (
    InstanceRecord,
    InstanceState,
    Market,
    PriceQuote,
    ProviderEvent,
    ProviderEventKind,
)
from liveput.errors import LiveputError
from liveput.runtime.clock import Clock
from liveput.runtime.store import Store
from liveput.traces import IntervalTrace, Trace

log = logging.getLogger(__name__)

__all__ = ["SpotModel", "EmulatedProviderConfig", "EmulatedProvider"]


class EmulatedProvider(Provider):
    """Spot from a trace (its capacity, or replayed), on-demand after a launch delay, catalog
    prices (see the module)."""

    name = "emulated"

    def __init__(
        self,
        trace: Trace | IntervalTrace,
        clock: Clock,
        config: EmulatedProviderConfig | None = None,
        *,
        launcher: Launcher | None = None,
        notice_dir: Path | None = None,
        notice_signal: int | None = signal.SIGUSR1,
        store: Store | None = None,
        on_event: Callable[[ProviderEvent], None] | None = None,
    ) -> None:
        self.config = config or EmulatedProviderConfig()
        super().__init__(clock, self.config.retry, on_event)
        self.catalog: Catalog = load_catalog(self.config.catalog)
        names = self.config.instance_types or tuple(s.name for s in self.catalog.instances)
        self.catalog = self.catalog.subset(list(names))  # unknown names: one-line error here
        self._types = names
        self.trace = trace
        self._capacity = CapacitySchedule(trace)
        self._end_s = self._capacity.end_s
        self._supply = spot_supply(
            self.config.spot, trace, self._capacity, self.config.notice_lead_s
        )
        if launcher is not None and notice_dir is None:
            raise LiveputError("emulated provider: a launcher needs a notice directory")
        self._procs = (
            None
            if launcher is None or notice_dir is None
            else InstanceProcesses(launcher, notice_dir, notice_signal=notice_signal, store=store)
        )
        self._rng = random.Random(self.config.seed)
        self._ids = itertools.count()
        self._zone_turn = itertools.count()
        self._records: dict[str, InstanceRecord] = {}
        self._ready_s: dict[str, float] = {}  # pending on-demand: when its launch delay is over
        self._spot_queue: list[str] = []  # pending spot, first come first served
        self._doomed: set[str] = set()
        # Ended by the cloud: when the list reports it (None: never; loss_signal_delay_s).
        self._report_s: dict[str, float | None] = {}
        self._lock = threading.RLock()
        # A replay's cloud time starts with the replay (start); capacity's at once.
        self._start_clock_s = clock.now_s() if self._supply.starts_with_provider else None
        self._stepper = BackgroundStepper(
            self.step, self.next_action_s, self.now_s, clock, self.config.time_scale
        )

    # -- the contract ------------------------------------------------------------------------

    def now_s(self, clock_s: float | None = None) -> float:
        """Cloud seconds at clock time ``clock_s`` (default: now; 0 before a replay starts)."""
        if self._start_clock_s is None:
            return 0.0
        clock_s = self.clock.now_s() if clock_s is None else clock_s
        return (clock_s - self._start_clock_s) * self.config.time_scale

    @property
    def instance_types(self) -> tuple[str, ...]:
        return self._types

    @property
    def zones(self) -> tuple[str, ...]:
        return self.config.zones

    def _grant(
        self, count: int, instance_types: tuple[str, ...], market: Market, zones: tuple[str, ...]
    ) -> tuple[list[InstanceRecord], ProviderError | None]:
        refusal = self._supply.refusal(market)
        if refusal is not None:
            return [], refusal
        with self._lock:
            spec = min(
                (self.catalog.get(name) for name in instance_types),
                key=lambda s: s.price_usd_per_hour(market),
            )
            allowed, error = within_quota(self.catalog, spec, market, count, self._records.values())
            now = self.now_s()
            granted = []
            for _ in range(allowed):
                record = self._new_record("e", spec.name, market, zones, now)
                if market is Market.ON_DEMAND:
                    self._ready_s[record.instance_id] = now + self._rng.uniform(
                        *self.config.on_demand_delay_s
                    )
                else:
                    self._spot_queue.append(record.instance_id)
                granted.append(record)
            self._step_locked()  # spot with capacity to spare runs at once
            return [self._records[r.instance_id] for r in granted], error

    def _new_record(
        self, prefix: str, instance_type: str, market: Market, zones: tuple[str, ...], now: float
    ) -> InstanceRecord:
        """A pending instance: ``i-`` replayed from the trace, ``e-`` granted on request; one
        count numbers both (the agents take their instance number from it)."""
        iid = f"{prefix}-{next(self._ids):04d}"
        zone = zones[next(self._zone_turn) % len(zones)]
        spec = self.catalog.get(instance_type)
        record = InstanceRecord(
            iid,
            spec.name,
            market,
            zone,
            InstanceState.PENDING,
            now,
            spec.price_usd_per_hour(market),
        )
        self._records[iid] = record
        return record

    def _terminate(self, instance_ids: list[str]) -> None:
        with self._lock:
            now = self.now_s()
            for iid in instance_ids:
                record = self._records[iid]
                if record.end_s is not None:
                    # Ended before its release was asked, not reported yet: the terminate
                    # call's answer says what state it is in.
                    self._report_s[iid] = now
                    continue
                self._ready_s.pop(iid, None)
                if iid in self._spot_queue:
                    self._spot_queue.remove(iid)
                self._doomed.discard(iid)
                if self._procs is not None and iid in self._procs:
                    self._procs.stop(iid)
                self._records[iid] = dataclasses.replace(
                    record, state=InstanceState.TERMINATED, end_s=now
                )

    def _list(self) -> list[InstanceRecord]:
        """What the API reports: an instance the cloud ended shows so only once its report is
        due (``loss_signal_delay_s``)."""
        with self._lock:
            now = self.now_s()
            return [
                as_reported(r, self._report_s[iid], now) if iid in self._report_s else r
                for iid, r in self._records.items()
            ]

    def records(self) -> list[InstanceRecord]:
        """Every instance as it really stands, its end at once (the API's view reports an end by
        the cloud's hand later)."""
        with self._lock:
            return list(self._records.values())

    def _quote(self, instance_type: str, zones: tuple[str, ...]) -> list[PriceQuote]:
        spec = self.catalog.get(instance_type)
        return [
            PriceQuote(spec.name, zone, spec.spot_usd_per_hour, spec.on_demand_usd_per_hour)
            for zone in zones
        ]

    # -- the emulation -----------------------------------------------------------------------

    @property
    def end_s(self) -> float:
        """The trace's end, cloud seconds."""
        return self._end_s

    @property
    def done(self) -> bool:
        """True when the trace is over and nothing more is due."""
        with self._lock:
            return (
                self._start_clock_s is not None
                and self.next_action_s() is None
                and not self._supply.pending()
                and not self._ready_s
                and self.now_s() >= self._end_s
            )

    @property
    def preemptions(self) -> int:
        """Instances preempted so far."""
        return sum(e.kind is ProviderEventKind.PREEMPT for e in self.events)

    @property
    def allocations(self) -> int:
        """Instances launched so far, a replay's initial ones not counted."""
        return sum(e.kind is ProviderEventKind.LAUNCH and not e.initial for e in self.events)

    def spot_capacity(self, time_s: float) -> int:
        """C(t): spot instances the trace offers at cloud time ``time_s``."""
        return self._capacity.at(time_s)

    def _running_spot(self) -> list[str]:
        return sorted(
            iid
            for iid, r in self._records.items()
            if r.market is Market.SPOT
            and r.state is InstanceState.RUNNING
            and iid not in self._doomed
        )

    def start(self) -> None:
        """Start a replay: its clock, and the trace's initial instances (a provider of spot
        capacity runs from its construction; starting it is a no-op)."""
        with self._lock:
            if self._supply.starts_with_provider:
                return
            if self._start_clock_s is not None:
                raise LiveputError("the emulated provider is already started")
            self._start_clock_s = self.clock.now_s()
            self._supply.start(self)

    def step(self) -> list[ProviderEvent]:
        """Carry out everything due by now; the events that produced."""
        with self._lock:
            if self._start_clock_s is None:
                raise LiveputError("start the emulated provider before stepping it")
            first = len(self._events)
            self._step_locked()
            return self.events[first:]

    def next_action_s(self) -> float | None:
        """Cloud time of a replay's next scheduled action (None: none, or no replay)."""
        with self._lock:
            return self._supply.next_action_s()

    def _step_locked(self) -> None:
        if self._start_clock_s is not None:  # nothing of a replay is due before its start
            self._supply.step(self)

    def _launch_on_demand(self, now: float) -> None:
        """Launch the pending on-demand instances whose launch delay is over by ``now``."""
        for iid, ready_s in sorted(self._ready_s.items(), key=lambda kv: (kv[1], kv[0])):
            if ready_s <= now:
                del self._ready_s[iid]
                self._launch(iid, now)

    def _launch(self, iid: str, now: float, *, initial: bool = False) -> None:
        self._records[iid] = dataclasses.replace(
            self._records[iid], state=InstanceState.RUNNING, launch_s=now
        )
        record = self._records[iid]
        pid = self._procs.launch(iid, record.market.value) if self._procs is not None else None
        self._event(
            ProviderEventKind.LAUNCH,
            f"{iid} {record.market.value} {record.instance_type} "
            f"in {record.zone}" + (f" (pid {pid})" if pid is not None else ""),
            instance_id=iid,
            time_s=now,
            pid=pid,
            initial=initial,
        )

    def _notice(self, iid: str, now: float, kill_s: float) -> None:
        """Notice ``iid`` at cloud time ``now`` of its preemption at ``kill_s`` (the caller
        schedules the preemption)."""
        self._doomed.add(iid)
        clock_s = self.clock.now_s()  # its stamp: the instant its lead counts from
        lead_clock_s = max(0.0, kill_s - max(now, self.now_s(clock_s))) / self.config.time_scale
        pid = self._procs.notice(iid, lead_clock_s) if self._procs is not None else None
        self._event(
            ProviderEventKind.NOTICE,
            f"{iid} preempted at {kill_s:.1f} s (lead {lead_clock_s:.2f} clock s)",
            instance_id=iid,
            time_s=now,
            pid=pid,
            lead_s=lead_clock_s,
            clock_s=clock_s,
        )

    def _preempt(self, iid: str, now: float) -> None:
        if iid not in self._doomed:  # released after its notice
            return
        self._doomed.discard(iid)
        detail, pid = "", None
        if self._procs is not None and iid in self._procs:
            pid, code = self._procs.kill(iid)
            detail = "" if code is None else f" (its agent had exited, code {code})"
        self._ended(iid, now, preempted=True)
        self._event(ProviderEventKind.PREEMPT, iid + detail, instance_id=iid, time_s=now, pid=pid)

    def _reap(self) -> None:
        """A replayed instance whose agent ended by itself before any notice is gone."""
        if self._procs is None:
            return
        now = self.now_s()
        for iid in list(self._procs.pids()):
            # A noticed instance that is gone before its kill (say it exited on the notice)
            # still counts as preempted, at its kill time.
            code = None if iid in self._doomed else self._procs.exit_code(iid)
            if code is None:
                continue
            pid = self._procs.forget(iid)
            self._ended(iid, now, preempted=False)
            self._event(
                ProviderEventKind.EXIT,
                f"{iid} exit code {code}",
                instance_id=iid,
                time_s=now,
                pid=pid,
            )

    def _ended(self, iid: str, now: float, *, preempted: bool) -> None:
        """The cloud ended ``iid`` at ``now``: its list reports so ``loss_signal_delay_s`` on."""
        self._records[iid] = dataclasses.replace(
            self._records[iid], preempted=preempted, state=InstanceState.TERMINATED, end_s=now
        )
        self._report_s[iid] = report_s(now, self.config.loss_signal_delay_s)

    def pids(self) -> dict[str, int]:
        """Running instances' agent processes: id -> pid (empty without a launcher)."""
        with self._lock:
            return {} if self._procs is None else self._procs.pids()

    def running_agents(self) -> list[str]:
        """Instances whose agent process still runs: a noticed instance whose agent exited by
        itself stays an instance until its kill (:meth:`_reap` leaves it to the preemption), but
        has no agent left to wait for."""
        with self._lock:
            if self._procs is None:
                return []
            return [iid for iid in self._procs.pids() if self._procs.exit_code(iid) is None]

    # -- running on a thread -----------------------------------------------------------------

    def start_background(self, poll_s: float = 0.05) -> None:
        """Start (a replay), then step on a daemon thread until closed (sleeping on the
        injected clock: ``poll_s``, or less until a replay's next action)."""
        self._stepper.check(poll_s)
        self.start()
        self._stepper.start(poll_s)

    def close(self) -> None:
        """Stop stepping and end every instance still alive (its bill is then final): a
        replay's agents are killed at once, as at the end of its trace; the others are
        released (stopped, with a grace)."""
        self._stepper.stop()
        with self._lock:
            if self._supply.kills_agents_at_close and self._procs is not None:
                self._procs.close()
                self._doomed.clear()
            alive = [iid for iid, r in self._records.items() if r.end_s is None]
            if alive:
                self.release(alive)
            if self._procs is not None:
                self._procs.close()
