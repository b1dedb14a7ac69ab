"""The emulated provider (the default, no account needed): spot follows a trace, on-demand is late.

Spot: the trace's count at cloud time ``t`` is the spot capacity ``C(t)``, what the market would
let this job hold. A spot request is granted at once as *pending* instances, queued; a queued
instance starts running when the job's spot instances that are running and not noticed number
fewer than ``min C`` over ``[now, now + notice lead]`` (so that no instance starts into a
removal it could not be noticed of). For each removal the trace makes at ``t`` the provider looks,
at ``t - notice_lead_s``, whether the running, un-noticed spot instances outnumber ``C(t)``: if so
one of them (seeded choice) gets a notice then and is SIGKILLed at ``t``, as
:class:`~liveput.runtime.cloud.EmulatedCloud` does; a removal of capacity the job does not hold
preempts nothing.

On-demand: a request is granted at once, pending; each instance starts running after a launch
delay drawn uniformly (seeded) from ``on_demand_delay_s`` (default 60-90 s; CM-DARE measured
70-92 s on EC2), and is never preempted.

Quotas: the catalog's vCPU quota per (family, market) counts pending and running instances; a
request beyond it is granted in part, the rest failing with ``VcpuLimitExceeded`` (not retried:
only this job's releases free the emulator's quota).

Billing: an instance is charged its catalog price from the moment it started running to the
moment it was released or killed, in cloud (trace) seconds: ``time_scale`` trace seconds pass per
clock second. With a launcher each running instance is an agent process
(:class:`~liveput.runtime.processes.InstanceProcesses`); without one the provider only accounts.
Call :meth:`EmulatedProvider.step` after moving a manual clock, or
:meth:`EmulatedProvider.start_background`.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import logging
import random
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from liveput.advise.catalog import Catalog, load_catalog
from liveput.cloud.provider import Provider
from liveput.cloud.retry import ProviderError, RetryPolicy
from liveput.cloud.types import (InstanceRecord, InstanceState, Market, PriceQuote,
                                 ProviderEvent, ProviderEventKind)
from liveput.errors import LiveputError
from liveput.runtime.clock import Clock
from liveput.runtime.cloud import trace_schedule
from liveput.runtime.notices import AWS_NOTICE_LEAD_S
from liveput.runtime.processes import InstanceProcesses, Launcher
from liveput.runtime.store import Store
from liveput.traces import IntervalTrace, Trace

log = logging.getLogger(__name__)

__all__ = ["EmulatedProviderConfig", "EmulatedProvider"]

DEFAULT_ZONES = ("emulated-1a",)


@dataclass(frozen=True)
class EmulatedProviderConfig:
    """Settings of the emulated provider."""

    catalog: str = "aws"
    """Built-in catalog name or catalog file: instance types, prices, vCPU quotas."""
    instance_types: tuple[str, ...] = ()
    """Types it rents (default: every type of the catalog)."""
    zones: tuple[str, ...] = DEFAULT_ZONES
    """Zone names (one trace drives them all; instances are spread over the zones asked)."""
    time_scale: float = 1.0
    """Trace (cloud) seconds per clock second."""
    notice_lead_s: float = AWS_NOTICE_LEAD_S
    """Notice before a preemption, cloud seconds (AWS 120, GCP 30)."""
    on_demand_delay_s: tuple[float, float] = (60.0, 90.0)
    """On-demand launch delay, cloud seconds: uniform in [low, high] (CM-DARE: 70-92 s)."""
    seed: int = 0
    """Seeds launch delays and the choice of victims."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff of retryable errors."""

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise LiveputError(f"emulated provider: time_scale must be > 0, got {self.time_scale}")
        if not self.notice_lead_s >= 0:
            raise LiveputError(f"emulated provider: notice_lead_s must be >= 0, got {self.notice_lead_s}")
        low, high = self.on_demand_delay_s
        if not 0 <= low <= high:
            raise LiveputError(f"emulated provider: on_demand_delay_s must be 0 <= low <= high, "
                               f"got {self.on_demand_delay_s}")
        if not self.zones or len(set(self.zones)) != len(self.zones):
            raise LiveputError(f"emulated provider: zones must be distinct and not empty, got {self.zones}")


class EmulatedProvider(Provider):
    """Spot capacity from a trace, on-demand after a launch delay, catalog prices (see module)."""

    name = "emulated"

    def __init__(self, trace: Trace | IntervalTrace, clock: Clock,
                 config: EmulatedProviderConfig | None = None, *,
                 launcher: Launcher | None = None, notice_dir: Path | None = None,
                 notice_signal: int | None = signal.SIGUSR1, store: Store | None = None,
                 on_event: Callable[[ProviderEvent], None] | None = None) -> None:
        self.config = config or EmulatedProviderConfig()
        super().__init__(clock, self.config.retry, on_event)
        self.catalog: Catalog = load_catalog(self.config.catalog)
        names = self.config.instance_types or tuple(s.name for s in self.catalog.instances)
        self.catalog = self.catalog.subset(list(names))  # unknown names: one-line error here
        self._types = names
        self.trace = trace
        initial, removals, additions, self._end_s = trace_schedule(trace)
        self._initial = initial
        self._removals = sorted(removals)
        self._additions = sorted(additions)
        self._changes = sorted(set(self._removals) | set(self._additions))
        self._procs: InstanceProcesses | None = None
        if launcher is not None:
            if notice_dir is None:
                raise LiveputError("emulated provider: a launcher needs a notice directory")
            self._procs = InstanceProcesses(launcher, notice_dir, notice_signal=notice_signal,
                                            store=store, what="emulated provider")
        self._rng = random.Random(self.config.seed)
        self._ids = itertools.count()
        self._zone_turn = itertools.count()
        self._records: dict[str, InstanceRecord] = {}
        self._ready_s: dict[str, float] = {}  # pending on-demand: when its launch delay is over
        self._spot_queue: list[str] = []  # pending spot, first come first served
        self._next_removal = 0  # index into _removals of the next removal to notice
        self._kills: list[tuple[float, str]] = []  # (kill time, victim), a heap
        self._doomed: set[str] = set()
        self._lock = threading.RLock()
        self._start_clock_s = clock.now_s()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the contract ------------------------------------------------------------------------

    def now_s(self) -> float:
        return (self.clock.now_s() - self._start_clock_s) * self.config.time_scale

    @property
    def instance_types(self) -> tuple[str, ...]:
        return self._types

    @property
    def zones(self) -> tuple[str, ...]:
        return self.config.zones

    def _grant(self, count: int, instance_types: tuple[str, ...], market: Market,
               zones: tuple[str, ...]) -> tuple[list[InstanceRecord], ProviderError | None]:
        with self._lock:
            spec = min((self.catalog.get(name) for name in instance_types),
                       key=lambda s: s.price_usd_per_hour(market.catalog))
            allowed, error = count, None
            quota = self.catalog.quota_vcpus(spec.family, market.catalog)
            if quota is not None:
                used = sum(self.catalog.get(r.instance_type).vcpus for r in self._records.values()
                           if r.end_s is None and r.market is market
                           and self.catalog.get(r.instance_type).family == spec.family)
                allowed = max(0, min(count, (quota - used) // max(spec.vcpus, 1)))
                if allowed < count:
                    error = ProviderError(
                        "VcpuLimitExceeded", f"{market.value} vCPU quota of family {spec.family} "
                        f"is {quota}, {used} in use; {spec.name} needs {spec.vcpus} each",
                        retryable=False)
            now = self.now_s()
            granted = []
            for _ in range(allowed):
                iid = f"e-{next(self._ids):04d}"
                zone = zones[next(self._zone_turn) % len(zones)]
                record = InstanceRecord(iid, spec.name, market, zone, InstanceState.PENDING, now,
                                        spec.price_usd_per_hour(market.catalog))
                self._records[iid] = record
                if market is Market.ON_DEMAND:
                    self._ready_s[iid] = now + self._rng.uniform(*self.config.on_demand_delay_s)
                else:
                    self._spot_queue.append(iid)
                granted.append(record)
            self._step_locked()  # spot with capacity to spare runs at once
            return [self._records[r.instance_id] for r in granted], error

    def _terminate(self, instance_ids: list[str]) -> None:
        with self._lock:
            now = self.now_s()
            for iid in instance_ids:
                record = self._records[iid]
                if record.end_s is not None:
                    continue
                self._ready_s.pop(iid, None)
                if iid in self._spot_queue:
                    self._spot_queue.remove(iid)
                self._doomed.discard(iid)
                if self._procs is not None and iid in self._procs:
                    self._procs.stop(iid)
                self._records[iid] = dataclasses.replace(record, state=InstanceState.TERMINATED,
                                                         end_s=now)

    def _list(self) -> list[InstanceRecord]:
        with self._lock:
            return list(self._records.values())

    def _quote(self, instance_type: str, zones: tuple[str, ...]) -> list[PriceQuote]:
        spec = self.catalog.get(instance_type)
        return [PriceQuote(spec.name, zone, spec.spot_usd_per_hour, spec.on_demand_usd_per_hour)
                for zone in zones]

    # -- the emulation -----------------------------------------------------------------------

    def spot_capacity(self, time_s: float) -> int:
        """C(t): spot instances the trace offers at cloud time ``time_s``."""
        added = bisect.bisect_right(self._additions, time_s)
        removed = bisect.bisect_right(self._removals, time_s)
        return max(0, self._initial + added - removed)

    def _min_capacity(self, start_s: float, end_s: float) -> int:
        low = bisect.bisect_right(self._changes, start_s)
        high = bisect.bisect_right(self._changes, end_s)
        return min([self.spot_capacity(start_s),
                    *(self.spot_capacity(t) for t in self._changes[low:high])])

    def _running_spot(self) -> list[str]:
        return sorted(iid for iid, r in self._records.items() if r.market is Market.SPOT
                      and r.state is InstanceState.RUNNING and iid not in self._doomed)

    def step(self) -> list[ProviderEvent]:
        """Carry out everything due by now; the events that produced."""
        with self._lock:
            first = len(self._events)
            self._step_locked()
            return self.events[first:]

    def _step_locked(self) -> None:
        now = self.now_s()
        lead_s = self.config.notice_lead_s
        while (self._next_removal < len(self._removals)
               and self._removals[self._next_removal] - lead_s <= now):
            kill_s = self._removals[self._next_removal]
            self._next_removal += 1
            running = self._running_spot()
            if len(running) > self.spot_capacity(kill_s):
                self._notice(self._rng.choice(running), now, kill_s)
        while self._kills and self._kills[0][0] <= now:
            _, iid = heapq.heappop(self._kills)
            self._preempt(iid, now)
        for iid, ready_s in sorted(self._ready_s.items(), key=lambda kv: (kv[1], kv[0])):
            if ready_s <= now:
                del self._ready_s[iid]
                self._launch(iid, now)
        while self._spot_queue and len(self._running_spot()) < self._min_capacity(now, now + lead_s):
            self._launch(self._spot_queue.pop(0), now)

    def _launch(self, iid: str, now: float) -> None:
        self._records[iid] = dataclasses.replace(self._records[iid], state=InstanceState.RUNNING,
                                                 launch_s=now)
        record = self._records[iid]
        pid = self._procs.launch(iid, record.market.value) if self._procs is not None else None
        self._event(ProviderEventKind.LAUNCH, f"{iid} {record.market.value} {record.instance_type} "
                    f"in {record.zone}" + (f" (pid {pid})" if pid is not None else ""),
                    instance_id=iid)

    def _notice(self, iid: str, now: float, kill_s: float) -> None:
        self._doomed.add(iid)
        lead_clock_s = max(0.0, kill_s - now) / self.config.time_scale
        if self._procs is not None:
            self._procs.notice(iid, lead_clock_s)
        heapq.heappush(self._kills, (kill_s, iid))
        self._event(ProviderEventKind.NOTICE, f"{iid} preempted at {kill_s:.1f} s "
                    f"(lead {lead_clock_s:.2f} clock s)", instance_id=iid)

    def _preempt(self, iid: str, now: float) -> None:
        if iid not in self._doomed:  # released after its notice
            return
        self._doomed.discard(iid)
        detail = ""
        if self._procs is not None and iid in self._procs:
            _, code = self._procs.kill(iid)
            detail = "" if code is None else f" (its agent had exited, code {code})"
        self._records[iid] = dataclasses.replace(self._records[iid], preempted=True,
                                                 state=InstanceState.TERMINATED, end_s=now)
        self._event(ProviderEventKind.PREEMPT, iid + detail, instance_id=iid)

    def pids(self) -> dict[str, int]:
        """Running instances' agent processes: id -> pid (empty without a launcher)."""
        with self._lock:
            return {} if self._procs is None else self._procs.pids()

    # -- running on a thread -----------------------------------------------------------------

    def start_background(self, poll_s: float = 0.05) -> None:
        """Step on a daemon thread until closed (sleeping on the injected clock)."""
        if not poll_s > 0:
            raise LiveputError(f"poll_s must be positive, got {poll_s}")
        if self._thread is not None:
            raise LiveputError("the emulated provider is already stepping")
        self._thread = threading.Thread(target=self._run, args=(poll_s,),
                                        name="liveput-provider", daemon=True)
        self._thread.start()

    def _run(self, poll_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a dead stepping thread would silently freeze the cloud
                log.exception("emulated provider step failed")
            self.clock.sleep(poll_s)

    def close(self) -> None:
        """Stop stepping and release every instance still alive (its bill is then final)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            alive = [iid for iid, r in self._records.items() if r.end_s is None]
            if alive:
                self.release(alive)
            if self._procs is not None:
                self._procs.close()
