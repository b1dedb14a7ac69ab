"""The trace type: how many spot instances a job has over time.

Every trace format is normalized to :class:`Trace`, an immutable step function of the available
instance count, kept as the events that change it (instances added and removed at each change
time). :meth:`Trace.resample` cuts it into fixed intervals, giving an :class:`IntervalTrace`, the
form every predictor, policy and simulator consumes.

Conventions (chosen once, used everywhere):

- Time is in seconds from the trace's start (``0``). The count is right-continuous: the count at
  time ``t`` includes the changes made exactly at ``t``.
- ``initial_count`` is the count at the start; it is the starting state, not an allocation.
- The trace spans ``[0, end_s]``. Time-weighted statistics are over that span.
- Interval ``i`` of a resampling with interval ``I`` covers ``(i*I, (i+1)*I]``: ``count[i]`` is the
  count at time ``i*I``; ``preempted[i]`` and ``allocated[i]`` are the instances removed and added
  during the interval, so ``count[i+1] = count[i] + allocated[i] - preempted[i]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError

DEFAULT_INTERVAL_S = 60.0


MAX_INTERVALS = 2_000_000
"""Most intervals a trace is cut into (a year in 16-s intervals; tens of MB per series)."""


def _frozen(values: object, dtype: type) -> np.ndarray:
    array: np.ndarray = np.array(values, dtype=dtype)
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class Trace:
    """Available instances over time, as the changes to the count."""

    name: str
    """Where the trace came from (a file name or a generator description)."""
    initial_count: int
    """Instances available at time 0."""
    times_s: np.ndarray
    """Change times in seconds from the start, strictly increasing, all within ``[0, end_s]``."""
    added: np.ndarray
    """Instances added at each change time (int, >= 0)."""
    removed: np.ndarray
    """Instances removed (preempted) at each change time (int, >= 0)."""
    end_s: float
    """End of the trace's span in seconds (>= the last change time)."""
    price_usd_per_hour: float | None = None
    """Spot price per instance-hour, when the source gives one."""

    def __post_init__(self) -> None:
        times = _frozen(self.times_s, np.float64)
        added = _frozen(self.added, np.int64)
        removed = _frozen(self.removed, np.int64)
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "added", added)
        object.__setattr__(self, "removed", removed)
        object.__setattr__(self, "initial_count", int(self.initial_count))
        object.__setattr__(self, "end_s", float(self.end_s))
        if not (times.shape == added.shape == removed.shape) or times.ndim != 1:
            raise LiveputError(f"trace {self.name}: times, added and removed differ in length")
        if self.initial_count < 0:
            raise LiveputError(f"trace {self.name}: negative initial count {self.initial_count}")
        if (added < 0).any() or (removed < 0).any():
            raise LiveputError(f"trace {self.name}: negative number of added or removed instances")
        if len(times) and (times[0] < 0 or (np.diff(times) <= 0).any()):
            raise LiveputError(f"trace {self.name}: change times must be increasing and >= 0")
        if not math.isfinite(self.end_s) or (len(times) and self.end_s < times[-1]):
            raise LiveputError(f"trace {self.name}: end {self.end_s} s is before its last change")
        counts = self.initial_count + np.cumsum(added - removed)
        if (counts < 0).any():
            where = int(np.argmax(counts < 0))
            raise LiveputError(
                f"trace {self.name}: count goes negative at t={times[where]:.0f} s "
                "(an instance is removed that is not there)"
            )

    # --- views -----------------------------------------------------------------------------
    @property
    def counts(self) -> np.ndarray:
        """The count right after each change time."""
        return self.initial_count + np.cumsum(self.added - self.removed)

    @property
    def hours(self) -> float:
        return self.end_s / 3600.0

    def count_at(self, time_s: float | np.ndarray) -> np.ndarray:
        """Count at the given time(s), changes at exactly that time included."""
        index = np.searchsorted(self.times_s, np.asarray(time_s, dtype=float), side="right")
        steps = np.concatenate(([self.initial_count], self.counts))
        return steps[index]

    def step_function(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts_s, counts)``: count ``counts[k]`` holds from ``starts_s[k]`` to the next start
        (or ``end_s``)."""
        starts = np.concatenate(([0.0], self.times_s))
        counts = np.concatenate(([self.initial_count], self.counts))
        return starts, counts

    def mean_count(self) -> float:
        """Time-weighted mean of the available count over ``[0, end_s]``."""
        if self.end_s <= 0:
            return float(self.initial_count)
        starts, counts = self.step_function()
        durations = np.diff(np.concatenate((starts, [self.end_s])))
        return float((durations * counts).sum() / self.end_s)

    def min_count(self) -> int:
        return int(self.step_function()[1].min())

    def max_count(self) -> int:
        return int(self.step_function()[1].max())

    # --- transformations --------------------------------------------------------------------
    def slice(self, start_s: float = 0.0, end_s: float | None = None) -> Trace:
        """The part of the trace in ``[start_s, end_s]``, re-based to start at 0."""
        end_s = self.end_s if end_s is None else float(end_s)
        if start_s < 0 or end_s > self.end_s + 1e-9 or end_s <= start_s:
            raise LiveputError(
                f"trace {self.name}: cannot slice [{start_s / 3600:.3f} h, {end_s / 3600:.3f} h] "
                f"from a trace of {self.hours:.3f} h"
            )
        initial = int(self.count_at(start_s))
        inside = (self.times_s > start_s) & (self.times_s <= end_s)
        return Trace(
            name=self.name,
            initial_count=initial,
            times_s=self.times_s[inside] - start_s,
            added=self.added[inside],
            removed=self.removed[inside],
            end_s=end_s - start_s,
            price_usd_per_hour=self.price_usd_per_hour,
        )

    def ready_after(self, startup_s: float) -> Trace:
        """The instances that can train: each one ``startup_s`` after the cloud gives it (boot,
        starting the process, importing the framework, building the job), those at time 0
        included. An instance removed counts as one that had started (a cloud preempts its
        older instances as often as its newer ones, and most are older), so the count ready at
        ``t`` is ``max(0, count(t) - added in (t - startup_s, t])``, with the initial ones added
        at 0."""
        if not startup_s >= 0:
            raise LiveputError(f"trace {self.name}: start-up time must be >= 0, got {startup_s}")
        if startup_s == 0:
            return self
        # Every change of the ready count happens at a change time or startup_s after one.
        arrivals = np.concatenate([[0.0], self.times_s[self.added > 0]])
        times = np.unique(np.concatenate([[0.0], self.times_s, arrivals + startup_s]))
        times = times[times <= self.end_s]
        added_at = np.concatenate([[0.0], self.times_s])
        added = np.concatenate([[self.initial_count], self.added]).astype(np.int64)
        cumulative = np.cumsum(added)
        # added in (t - startup_s, t]: everything added by t minus everything added by t - s.
        # t - s is taken with a tolerance: for t = a + s, (a + s) - s may round below a, and
        # the instance that came at a would then never be ready.
        by_now = cumulative[np.searchsorted(added_at, times, side="right") - 1]
        before = (
            np.searchsorted(
                added_at, times - startup_s + 1e-9 * np.maximum(times, 1.0), side="right"
            )
            - 1
        )
        by_then = np.where(before >= 0, cumulative[np.maximum(before, 0)], 0)
        ready = np.maximum(self.count_at(times) - (by_now - by_then), 0)
        shifted = Trace.from_counts(
            f"{self.name} (ready {startup_s:g} s after)",
            times,
            ready,
            self.end_s,
            self.price_usd_per_hour,
        )
        return shifted

    def resample(self, interval_s: float = DEFAULT_INTERVAL_S) -> IntervalTrace:
        """Cut the trace into intervals of ``interval_s`` (the last one may be partial)."""
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise LiveputError(f"interval must be a finite number > 0, got {interval_s}")
        num_intervals = max(1, math.ceil(self.end_s / interval_s - 1e-9))
        if num_intervals > MAX_INTERVALS:
            raise LiveputError(
                f"{self.name}: {self.hours:.4g} h in {interval_s:g}-s intervals is "
                f"{num_intervals:,} intervals, more than {MAX_INTERVALS:,}: use a longer "
                "--interval, or --start-hour/--end-hour"
            )
        # Interval i covers (i*I, (i+1)*I]; a change at exactly 0 is part of the initial state.
        which = np.ceil(self.times_s / interval_s - 1e-9).astype(np.int64) - 1
        which = np.clip(which, 0, num_intervals - 1)
        at_zero = self.times_s <= 0
        initial = self.initial_count + int((self.added[at_zero] - self.removed[at_zero]).sum())
        allocated = np.bincount(which[~at_zero], self.added[~at_zero], num_intervals)
        preempted = np.bincount(which[~at_zero], self.removed[~at_zero], num_intervals)
        allocated = allocated.astype(np.int64)
        preempted = preempted.astype(np.int64)
        count = initial + np.concatenate(([0], np.cumsum(allocated - preempted)[:-1]))
        return IntervalTrace(
            name=self.name,
            interval_s=float(interval_s),
            count=count,
            preempted=preempted,
            allocated=allocated,
            price_usd_per_hour=self.price_usd_per_hour,
        )

    @classmethod
    def from_counts(
        cls,
        name: str,
        times_s: np.ndarray,
        counts: np.ndarray,
        end_s: float,
        price_usd_per_hour: float | None = None,
    ) -> Trace:
        """A trace from counts sampled at increasing times (count ``counts[k]`` from
        ``times_s[k]`` on). Changes become net additions or removals."""
        times = np.asarray(times_s, dtype=float)
        values = np.asarray(counts, dtype=np.int64)
        if len(times) == 0:
            raise LiveputError(f"trace {name}: no samples")
        deltas = np.diff(values)
        changed = deltas != 0
        base = times[0]
        return cls(
            name=name,
            initial_count=int(values[0]),
            times_s=times[1:][changed] - base,
            added=np.maximum(deltas[changed], 0),
            removed=np.maximum(-deltas[changed], 0),
            end_s=float(end_s) - base,
            price_usd_per_hour=price_usd_per_hour,
        )


@dataclass(frozen=True)
class IntervalTrace:
    """A trace cut into fixed intervals: the form predictors, policies and the simulator use."""

    name: str
    """Where the trace came from."""
    interval_s: float
    """Length of one interval in seconds."""
    count: np.ndarray
    """Instances available at the start of each interval (int, >= 0)."""
    preempted: np.ndarray
    """Instances removed during each interval (int, >= 0)."""
    allocated: np.ndarray
    """Instances added during each interval (int, >= 0)."""
    price_usd_per_hour: float | None = None
    """Spot price per instance-hour, when the source gives one."""

    def __post_init__(self) -> None:
        for attr in ("count", "preempted", "allocated"):
            object.__setattr__(self, attr, _frozen(getattr(self, attr), np.int64))
        if not (self.count.shape == self.preempted.shape == self.allocated.shape):
            raise LiveputError(f"trace {self.name}: per-interval arrays differ in length")
        if (self.count < 0).any() or (self.preempted < 0).any() or (self.allocated < 0).any():
            raise LiveputError(f"trace {self.name}: negative per-interval count")
        if len(self.count) > 1:
            flow = self.count[:-1] + self.allocated[:-1] - self.preempted[:-1]
            if (flow != self.count[1:]).any():
                where = int(np.argmax(flow != self.count[1:]))
                raise LiveputError(
                    f"trace {self.name}: interval {where} does not balance "
                    "(count + allocated - preempted != next count)"
                )

    def __len__(self) -> int:
        return len(self.count)

    @property
    def end_count(self) -> int:
        """Count at the end of the last interval."""
        if len(self) == 0:
            return 0
        return int(self.count[-1] + self.allocated[-1] - self.preempted[-1])

    @property
    def hours(self) -> float:
        return len(self) * self.interval_s / 3600.0

    @property
    def max_count(self) -> int:
        return int(max(self.count.max(initial=0), self.end_count))

    def window(self, start: int, stop: int | None = None) -> IntervalTrace:
        """Intervals ``start..stop-1`` (a history or a look at the future)."""
        stop = len(self) if stop is None else stop
        # Views of this trace's read-only arrays, not checked again: a run of a valid trace is
        # valid, and a policy's history is cut at every interval (the copies and checks took a
        # few hundredths of a simulation).
        window = object.__new__(IntervalTrace)
        window.__dict__.update(self.__dict__)
        for attr in ("count", "preempted", "allocated"):
            window.__dict__[attr] = self.__dict__[attr][start:stop]
        return window

    def head(self, num_intervals: int) -> IntervalTrace:
        """The first ``num_intervals`` intervals: the history seen at interval
        ``num_intervals - 1``."""
        return self.window(0, num_intervals)
