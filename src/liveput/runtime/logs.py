"""Condensed logging of a failure that repeats: a line when it starts, then only counts.

An agent retrying an unreachable store fails every heartbeat (0.5 s); a line each time, with the
error's C++ stack frames, drowns whatever else its log says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RepeatFilter:
    """Logs a message's first line once; while the same message repeats, only how often.

    The count is logged as ``<message> (repeated N times)`` when another message comes, when
    :meth:`flush` says the failure is over, or on a repeat ``report_every_s`` after the last line
    of it. Safe to call from several threads.
    """

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        report_every_s: float = 30.0,
        now_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.level = level
        self.report_every_s = report_every_s
        self._now_s = now_s
        self._lock = threading.Lock()
        self._message: str | None = None
        self._repeats = 0  # of _message, not logged yet
        self._logged_at_s = 0.0

    def __call__(self, message: str) -> None:
        """Log ``message`` (its first line) unless it only repeats the previous one."""
        lines = message.strip().splitlines()
        message = lines[0] if lines else ""
        with self._lock:
            now_s = self._now_s()
            if message == self._message:
                self._repeats += 1
                if now_s - self._logged_at_s >= self.report_every_s:
                    self._report(now_s)
                return
            self._report(now_s)
            self._message, self._repeats, self._logged_at_s = message, 0, now_s
            self.logger.log(self.level, "%s", message)

    def flush(self) -> None:
        """The failure is over: log its uncounted repeats; the next message is logged anew."""
        with self._lock:
            self._report(self._now_s())
            self._message = None

    def _report(self, now_s: float) -> None:
        if self._message is not None and self._repeats:
            self.logger.log(self.level, "%s (repeated %d times)", self._message, self._repeats)
            self._repeats, self._logged_at_s = 0, now_s
