"""Time, injected: a real monotonic clock for the runtime and a manual one for tests.

Decision logic never reads time itself; whatever needs "now" or a pause takes a :class:`Clock`.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from liveput.errors import LiveputError

__all__ = ["Clock", "MonotonicClock", "ManualClock"]


class Clock(ABC):
    """A source of seconds that never go backwards, and a way to wait for them to pass."""

    @abstractmethod
    def now_s(self) -> float:
        """Seconds since an arbitrary fixed origin."""

    @abstractmethod
    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass (a real clock blocks; a manual one just advances)."""


class MonotonicClock(Clock):
    """The system's monotonic clock (``time.monotonic``), shared by all processes on a machine."""

    def now_s(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock(Clock):
    """A fake clock that moves only when told: ``advance`` (or ``sleep``, which advances)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def advance(self, seconds: float) -> float:
        """Move time forward by ``seconds`` (>= 0); the new time."""
        if seconds < 0:
            raise LiveputError(f"a clock cannot go back: advance({seconds})")
        with self._lock:
            self._now_s += seconds
            return self._now_s

    def set(self, now_s: float) -> None:
        """Jump to ``now_s`` (not earlier than the current time)."""
        with self._lock:
            if now_s < self._now_s:
                raise LiveputError(f"a clock cannot go back: {now_s} < {self._now_s}")
            self._now_s = float(now_s)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
