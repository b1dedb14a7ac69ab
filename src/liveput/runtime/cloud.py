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
import os
import random
import signal
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from liveput.errors import LiveputError
from liveput.runtime.clock import Clock
from liveput.runtime.notices import AWS_NOTICE_LEAD_S, Notice, write_notice_file
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
]

INSTANCE_ID_ENV = "LIVEPUT_INSTANCE_ID"
"""Environment variable carrying a launched agent's instance id."""
NOTICE_FILE_ENV = "LIVEPUT_NOTICE_FILE"
"""Environment variable carrying the path where the emulator writes the agent's notice."""


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


@dataclass(frozen=True)
class InstanceSpec:
    """What a launcher needs to start the agent of a new instance."""

    instance_id: str
    """The new instance's id (``i-0000``, ``i-0001``, ...)."""
    notice_file: Path
    """Where the emulator will write this instance's preemption notice."""

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that tell the agent who it is and where its notice lands."""
        return {INSTANCE_ID_ENV: self.instance_id, NOTICE_FILE_ENV: str(self.notice_file)}


Launcher = Callable[[InstanceSpec], subprocess.Popen]
"""Starts the agent process of a new instance."""


def command_launcher(
    template: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log_dir: Path | None = None,
) -> Launcher:
    """A launcher running ``template`` with ``{instance_id}`` and ``{notice_file}`` filled in.

    The process gets ``env`` (default: this process's environment) plus :attr:`InstanceSpec.env`;
    with ``log_dir``, its stdout and stderr go to ``log_dir/<instance_id>.log``.
    """
    if not template:
        raise LiveputError("agent command template is empty")

    def launch(spec: InstanceSpec) -> subprocess.Popen:
        fields = {"instance_id": spec.instance_id, "notice_file": str(spec.notice_file)}
        try:
            argv = [part.format(**fields) for part in template]
        except (KeyError, IndexError, ValueError) as exc:
            raise LiveputError(f"agent command template {list(template)}: bad placeholder {exc}") from None
        full_env = {**(os.environ if env is None else env), **spec.env}
        if log_dir is None:
            return subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL)
        with open(Path(log_dir) / f"{spec.instance_id}.log", "ab") as out:
            return subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    return launch


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


def _schedule(trace: Trace | IntervalTrace) -> tuple[int, list[float], list[float], float]:
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


@dataclass
class _Instance:
    process: subprocess.Popen
    notice_file: Path
    doomed: bool = False


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
    notice_key_prefix: str = "notices/"
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
        if not self.notice_dir.is_dir():
            raise LiveputError(f"notice directory {self.notice_dir} does not exist")
        self._initial, removals, additions, self._end_s = _schedule(self.trace)
        self._actions: list[tuple[float, int, int, str]] = []
        self._serial = itertools.count()
        for time_s in removals:
            self._push(max(0.0, time_s - self.notice_lead_s), _NOTICE, f"{time_s!r}")
        for time_s in additions:
            self._push(time_s, _LAUNCH, "")
        self._rng = random.Random(self.seed)
        self._ids = itertools.count()
        self._live: dict[str, _Instance] = {}
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
            return {iid: inst.process.pid for iid, inst in self._live.items()}

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
        spec = InstanceSpec(instance_id, self.notice_dir / f"{instance_id}.notice.json")
        spec.notice_file.unlink(missing_ok=True)
        try:
            process = self.launcher(spec)
        except OSError as exc:
            raise LiveputError(f"emulated cloud could not launch {instance_id}: {exc}") from None
        self._live[instance_id] = _Instance(process, spec.notice_file)
        self._record(CloudEvent(CloudEventKind.LAUNCH, instance_id, time_s, self.clock.now_s(), process.pid, initial))

    def _notice_pending(self, now_s: float) -> None:
        """Give every removal that is due a notice a victim, while there are candidates."""
        while self._unnoticed:
            candidates = sorted(iid for iid, inst in self._live.items() if not inst.doomed)
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
        inst = self._live[instance_id]
        inst.doomed = True
        lead_s = max(0.0, kill_s - max(now_s, self.trace_time_s)) / self.time_scale
        notice = Notice("emulator", "terminate", lead_s, instance_id)
        write_notice_file(inst.notice_file, notice)
        if self.store is not None:
            self.store.set(self.notice_key_prefix + instance_id, notice.to_json().encode())
        if self.notice_signal is not None:
            try:
                os.kill(inst.process.pid, self.notice_signal)
            except ProcessLookupError:
                pass  # already gone; the kill will record it
        self._record(
            CloudEvent(CloudEventKind.NOTICE, instance_id, now_s, self.clock.now_s(), inst.process.pid, lead_s=lead_s)
        )

    def _kill(self, time_s: float, instance_id: str) -> None:
        inst = self._live.pop(instance_id)
        code = inst.process.poll()
        detail = "" if code is None else f"already exited (code {code})"
        if code is None:
            inst.process.kill()
            try:
                inst.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("instance %s (pid %d) survived SIGKILL for 10 s", instance_id, inst.process.pid)
        event = CloudEvent(CloudEventKind.KILL, instance_id, time_s, self.clock.now_s(), inst.process.pid, detail=detail)
        self._record(event)

    def _reap(self) -> None:
        now = self.trace_time_s
        for instance_id, inst in list(self._live.items()):
            # A noticed instance that is gone before its kill (say it exited on the notice, or the
            # notice signal caught it before it installed a handler) still counts as preempted,
            # at its kill time.
            code = None if inst.doomed else inst.process.poll()
            if code is None:
                continue
            del self._live[instance_id]
            self._record(
                CloudEvent(CloudEventKind.EXIT, instance_id, now, self.clock.now_s(), inst.process.pid, detail=f"exit code {code}")
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
            for inst in self._live.values():
                if inst.process.poll() is None:
                    inst.process.kill()
                try:
                    inst.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.warning("pid %d survived SIGKILL", inst.process.pid)
            self._live.clear()

