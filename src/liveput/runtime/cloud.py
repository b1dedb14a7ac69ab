"""The cloud the runtime runs on: a contract, and an emulator that replays a spot trace.

:class:`EmulatedCloud` replays a :class:`~liveput.traces.Trace` or
:class:`~liveput.traces.IntervalTrace`, time-scaled (``time_scale`` trace seconds per clock second),
against agent processes on this machine:

- at the start it launches the trace's initial instances;
- for each instance the trace removes at trace time ``t`` it picks a victim (seeded) at
  ``t - notice_lead_s`` (AWS 120 s, GCP 30 s), delivers the notice (a JSON notice file, an optional
  store key, then a signal, SIGUSR1 by default), and at ``t`` SIGKILLs the victim's process;
- for each instance the trace adds, it launches a new agent through the injected launcher.

If no instance is there to be noticed when a removal's notice falls due (the victim is still to be
launched), the notice goes to the next instance launched before ``t``, with a shorter lead. An
:class:`IntervalTrace`'s preemptions and allocations in an interval are spread evenly inside it.

Time comes from an injected :class:`~liveput.runtime.clock.Clock`: call :meth:`EmulatedCloud.step`
after moving a manual clock in tests, or :meth:`EmulatedCloud.start_background` to let a thread step
it in real time (the coordinator of ``liveput train``). Every event is logged and kept in
:attr:`EmulatedCloud.events`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from liveput.errors import LiveputError
from liveput.runtime import keys
from liveput.runtime.clock import Clock
from liveput.runtime.notices import AWS_NOTICE_LEAD_S
from liveput.runtime.processes import (INSTANCE_ID_ENV, NOTICE_FILE_ENV, InstanceProcesses,
                                       InstanceSpec, Launcher, command_launcher)
from liveput.runtime.store import Store
from liveput.traces import IntervalTrace, Trace

log = logging.getLogger(__name__)

__all__ = [
    "INSTANCE_ID_ENV",
    "NOTICE_FILE_ENV",
    "CloudEventKind",
    "CloudEvent",
    "InstanceSpec",
    "Launcher",
    "command_launcher",
    "Cloud",
    "EmulatedCloud",
    "trace_schedule",
]

class CloudEventKind(str, Enum):
    """What the cloud did."""

    LAUNCH = "launch"
    """An instance (agent process) was started."""
    NOTICE = "notice"
    """An instance was told it will be preempted."""
    KILL = "kill"
    """An instance was preempted (its process SIGKILLed)."""
    EXIT = "exit"
    """An instance's process ended by itself before any notice (not a preemption)."""


@dataclass(frozen=True)
class CloudEvent:
    """One thing the cloud did to one instance."""

    kind: CloudEventKind
    """What happened."""
    instance_id: str
    """Which instance."""
    trace_time_s: float
    """When the trace scheduled it, in trace seconds from the trace's start."""
    time_s: float
    """When it was carried out, in the injected clock's seconds."""
    pid: int | None
    """The instance's process id."""
    initial: bool = False
    """For launches: one of the trace's initial instances (not an allocation)."""
    lead_s: float | None = None
    """For notices: clock seconds until the kill."""
    detail: str = ""
    """Anything else worth logging (an exit code)."""


class Cloud(ABC):
    """Where instances come from and go: the runtime's view of a cloud."""

    @abstractmethod
    def start(self) -> None:
        """Bring up the initial instances."""

    @abstractmethod
    def step(self) -> list[CloudEvent]:
        """Carry out everything due by now; the events that produced."""

    @abstractmethod
    def instances(self) -> dict[str, int]:
        """Live instances: id -> process id."""

    @property
    @abstractmethod
    def events(self) -> list[CloudEvent]:
        """Everything the cloud has done so far, in order."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True when nothing more will happen."""

    @abstractmethod
    def close(self) -> None:
        """Stop stepping and kill every instance still running. Idempotent."""

    @property
    def preemptions(self) -> int:
        """Instances preempted so far."""
        return sum(e.kind is CloudEventKind.KILL for e in self.events)

    @property
    def allocations(self) -> int:
        """Instances added so far (the initial ones are not allocations)."""
        return sum(e.kind is CloudEventKind.LAUNCH and not e.initial for e in self.events)


# Actions at the same trace time: notices, then kills, then launches.
_NOTICE, _KILL, _LAUNCH = 0, 1, 2


def trace_schedule(trace: Trace | IntervalTrace) -> tuple[int, list[float], list[float], float]:
    """(initial count, removal times, addition times, end), all in trace seconds."""
    removals: list[float] = []
    additions: list[float] = []
    if isinstance(trace, IntervalTrace):
        if len(trace) == 0:
            raise LiveputError(f"trace {trace.name} has no intervals")
        width = trace.interval_s
        for index in range(len(trace)):
            for count, into in ((int(trace.preempted[index]), removals), (int(trace.allocated[index]), additions)):
                into.extend(index * width + width * (j + 1) / (count + 1) for j in range(count))
        return int(trace.count[0]), removals, additions, len(trace) * width
    initial = trace.initial_count
    for time_s, added, removed in zip(trace.times_s, trace.added, trace.removed, strict=True):
        if time_s <= 0:  # a change at exactly 0 is part of the initial state
            initial += int(added) - int(removed)
            continue
        removals.extend([float(time_s)] * int(removed))
        additions.extend([float(time_s)] * int(added))
    return initial, removals, additions, float(trace.end_s)


@dataclass(eq=False)
class EmulatedCloud(Cloud):
    """Replays a spot trace, time-scaled, against agent processes on this machine."""

    trace: Trace | IntervalTrace
    """The availability to replay."""
    launcher: Launcher
    """Starts an agent process for a new instance (see :func:`command_launcher`)."""
    clock: Clock
    """Where time comes from."""
    notice_dir: Path
    """Directory for the per-instance notice files."""
    time_scale: float = 30.0
    """Trace seconds per clock second (30: an hour of trace in two minutes)."""
    notice_lead_s: float = AWS_NOTICE_LEAD_S
    """Notice before a preemption, in trace seconds (AWS 120, GCP 30); scaled like the trace."""
    seed: int = 0
    """Seeds the choice of victims."""
    notice_signal: int | None = signal.SIGUSR1
    """Signal sent to a victim after its notice is written (None: none; the file is the notice)."""
    store: Store | None = None
    """Optionally also publish each notice under ``notice_key_prefix + instance_id`` here."""
    notice_key_prefix: str = keys.CLOUD_NOTICE.prefix
    """Store key prefix for notices."""
    on_event: Callable[[CloudEvent], None] | None = None
    """Called with every event as it happens (from the stepping thread)."""
    _events: list[CloudEvent] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise LiveputError(f"time_scale must be positive, got {self.time_scale}")
        if not self.notice_lead_s >= 0:
            raise LiveputError(f"notice_lead_s must be >= 0, got {self.notice_lead_s}")
        self.notice_dir = Path(self.notice_dir)
        self._procs = InstanceProcesses(self.launcher, self.notice_dir,
                                        notice_signal=self.notice_signal, store=self.store,
                                        notice_key_prefix=self.notice_key_prefix)
        self._initial, removals, additions, self._end_s = trace_schedule(self.trace)
        self._actions: list[tuple[float, int, int, str]] = []
        self._serial = itertools.count()
        for time_s in removals:
            self._push(max(0.0, time_s - self.notice_lead_s), _NOTICE, f"{time_s!r}")
        for time_s in additions:
            self._push(time_s, _LAUNCH, "")
        self._rng = random.Random(self.seed)
        self._ids = itertools.count()
        self._doomed: set[str] = set()  # noticed, not yet killed
        self._unnoticed: list[float] = []  # kill times of removals still waiting for a victim
        self._lock = threading.RLock()
        self._start_s: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _push(self, time_s: float, order: int, payload: str) -> None:
        heapq.heappush(self._actions, (time_s, order, next(self._serial), payload))

    @property
    def trace_time_s(self) -> float:
        """Where the replay is, in trace seconds (0 before :meth:`start`)."""
        if self._start_s is None:
            return 0.0
        return (self.clock.now_s() - self._start_s) * self.time_scale

    @property
    def end_s(self) -> float:
        """The trace's end, in trace seconds."""
        return self._end_s

    @property
    def events(self) -> list[CloudEvent]:
        with self._lock:
            return list(self._events)

    @property
    def done(self) -> bool:
        with self._lock:
            return self._start_s is not None and not self._actions and self.trace_time_s >= self._end_s

    def instances(self) -> dict[str, int]:
        with self._lock:
            return self._procs.pids()

    def start(self) -> None:
        with self._lock:
            if self._start_s is not None:
                raise LiveputError("the emulated cloud is already started")
            self._start_s = self.clock.now_s()
            log.info(
                "emulated cloud: %s, %d initial instances, %d removals, %d additions over %.0f s (x%g)",
                self.trace.name, self._initial, sum(a[1] == _NOTICE for a in self._actions),
                sum(a[1] == _LAUNCH for a in self._actions), self._end_s, self.time_scale,
            )  # fmt: skip
            for _ in range(self._initial):
                self._launch(0.0, initial=True)

    def step(self) -> list[CloudEvent]:
        with self._lock:
            if self._start_s is None:
                raise LiveputError("start the emulated cloud before stepping it")
            first = len(self._events)
            self._reap()
            now = self.trace_time_s
            while self._actions and self._actions[0][0] <= now:
                time_s, order, _, payload = heapq.heappop(self._actions)
                if order == _NOTICE:
                    self._unnoticed.append(float(payload))
                    self._unnoticed.sort()
                elif order == _KILL:
                    self._kill(time_s, payload)
                else:
                    self._launch(time_s, initial=False)
                self._notice_pending(time_s)
            return self._events[first:]

    def next_action_s(self) -> float | None:
        """Trace time of the next scheduled action, or None if there is none."""
        with self._lock:
            return self._actions[0][0] if self._actions else None

    # -- actions ---------------------------------------------------------------------------------

    def _record(self, event: CloudEvent) -> None:
        self._events.append(event)
        log.info(
            "cloud %s %s at trace %.1f s (pid %s)%s",
            event.kind.value, event.instance_id, event.trace_time_s, event.pid,
            f" lead {event.lead_s:.2f} s" if event.lead_s is not None else "",
        )  # fmt: skip
        if self.on_event is not None:
            self.on_event(event)

    def _launch(self, time_s: float, *, initial: bool) -> None:
        instance_id = f"i-{next(self._ids):04d}"
        pid = self._procs.launch(instance_id)
        self._record(CloudEvent(CloudEventKind.LAUNCH, instance_id, time_s, self.clock.now_s(), pid, initial))

    def _notice_pending(self, now_s: float) -> None:
        """Give every removal that is due a notice a victim, while there are candidates."""
        while self._unnoticed:
            candidates = sorted(iid for iid in self._procs.pids() if iid not in self._doomed)
            if not candidates:
                # Removals whose time has come with nobody to remove (agents that exited by
                # themselves) are void; later ones wait for the next launch.
                void = [kill_s for kill_s in self._unnoticed if kill_s <= now_s]
                if void:
                    log.warning("cloud: %d preemption(s) at trace %.1f s found no instance", len(void), now_s)
                self._unnoticed = [kill_s for kill_s in self._unnoticed if kill_s > now_s]
                return
            kill_s = self._unnoticed.pop(0)
            victim = self._rng.choice(candidates)
            self._deliver_notice(victim, now_s, kill_s)
            self._push(kill_s, _KILL, victim)

    def _deliver_notice(self, instance_id: str, now_s: float, kill_s: float) -> None:
        self._doomed.add(instance_id)
        lead_s = max(0.0, kill_s - max(now_s, self.trace_time_s)) / self.time_scale
        pid = self._procs.notice(instance_id, lead_s)
        self._record(CloudEvent(CloudEventKind.NOTICE, instance_id, now_s, self.clock.now_s(), pid, lead_s=lead_s))

    def _kill(self, time_s: float, instance_id: str) -> None:
        self._doomed.discard(instance_id)
        pid, code = self._procs.kill(instance_id)
        detail = "" if code is None else f"already exited (code {code})"
        event = CloudEvent(CloudEventKind.KILL, instance_id, time_s, self.clock.now_s(), pid, detail=detail)
        self._record(event)

    def _reap(self) -> None:
        now = self.trace_time_s
        for instance_id in list(self._procs.pids()):
            # A noticed instance that is gone before its kill (say it exited on the notice, or the
            # notice signal caught it before it installed a handler) still counts as preempted,
            # at its kill time.
            code = None if instance_id in self._doomed else self._procs.exit_code(instance_id)
            if code is None:
                continue
            pid = self._procs.forget(instance_id)
            self._record(
                CloudEvent(CloudEventKind.EXIT, instance_id, now, self.clock.now_s(), pid, detail=f"exit code {code}")
            )

    # -- running on a thread ---------------------------------------------------------------------

    def start_background(self, poll_s: float = 0.05) -> None:
        """Start, then step on a daemon thread until closed (sleeping on the injected clock)."""
        if not poll_s > 0:
            raise LiveputError(f"poll_s must be positive, got {poll_s}")
        self.start()
        self._thread = threading.Thread(target=self._run, args=(poll_s,), name="liveput-cloud", daemon=True)
        self._thread.start()

    def _run(self, poll_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a dead stepping thread would silently freeze the trace
                log.exception("emulated cloud step failed")
            upcoming = self.next_action_s()
            wait_s = poll_s
            if upcoming is not None:
                wait_s = min(poll_s, max(0.0, (upcoming - self.trace_time_s) / self.time_scale))
            self.clock.sleep(max(wait_s, 0.001))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        with self._lock:
            self._procs.close()
            self._doomed.clear()

