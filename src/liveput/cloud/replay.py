"""A trace as a schedule: when instances are there at first, removed and added, in trace seconds.

:func:`trace_schedule` reads a :class:`~liveput.traces.Trace` (changes at instants) or an
:class:`~liveput.traces.IntervalTrace` (an interval's preemptions and allocations spread evenly
inside it). :class:`ReplaySchedule` orders what replaying a trace as one job's own instances
means (the emulated provider's :attr:`~liveput.cloud.emulated.SpotModel.REPLAY`): a notice
``notice_lead_s`` before each removal, the removal's preemption, each addition's launch; at the
same trace time notices come first, then preemptions, then launches.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum

from liveput.errors import LiveputError
from liveput.traces import IntervalTrace, Trace

__all__ = ["trace_schedule", "ReplayAction", "ReplaySchedule"]


def trace_schedule(trace: Trace | IntervalTrace) -> tuple[int, list[float], list[float], float]:
    """(initial count, removal times, addition times, end), all in trace seconds."""
    removals: list[float] = []
    additions: list[float] = []
    if isinstance(trace, IntervalTrace):
        if len(trace) == 0:
            raise LiveputError(f"trace {trace.name} has no intervals")
        width = trace.interval_s
        for index in range(len(trace)):
            for count, into in (
                (int(trace.preempted[index]), removals),
                (int(trace.allocated[index]), additions),
            ):
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


class ReplayAction(IntEnum):
    """What falls due; the value orders actions due at the same trace time."""

    NOTICE = 0
    """A removal's notice is due: it needs a victim (the payload: the removal's time)."""
    PREEMPT = 1
    """A noticed victim goes (the payload: its instance id)."""
    LAUNCH = 2
    """The trace adds an instance."""


class ReplaySchedule:
    """The actions of replaying ``trace`` with ``notice_lead_s`` (trace seconds), due in order."""

    def __init__(self, trace: Trace | IntervalTrace, notice_lead_s: float) -> None:
        self.initial, removals, additions, self.end_s = trace_schedule(trace)
        self._actions: list[tuple[float, int, int, str]] = []
        self._serial = itertools.count()
        for time_s in removals:
            self.push(max(0.0, time_s - notice_lead_s), ReplayAction.NOTICE, f"{time_s!r}")
        for time_s in additions:
            self.push(time_s, ReplayAction.LAUNCH, "")
        self.removals = len(removals)
        self.additions = len(additions)

    def push(self, time_s: float, action: ReplayAction, payload: str) -> None:
        heapq.heappush(self._actions, (time_s, int(action), next(self._serial), payload))

    def next_s(self) -> float | None:
        """Trace time of the next action, or None if there is none."""
        return self._actions[0][0] if self._actions else None

    def pop_due(self, now_s: float) -> tuple[float, ReplayAction, str] | None:
        """The next action due by ``now_s`` (time, what, payload), removed; None if none is."""
        if not self._actions or self._actions[0][0] > now_s:
            return None
        time_s, action, _, payload = heapq.heappop(self._actions)
        return time_s, ReplayAction(action), payload

    def __bool__(self) -> bool:
        return bool(self._actions)
