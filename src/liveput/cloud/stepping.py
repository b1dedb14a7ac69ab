"""A provider's clock-driven stepping on a thread of its own: step, then sleep on the injected
clock until the next action or the poll, until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from liveput.errors import LiveputError
from liveput.runtime.clock import Clock

log = logging.getLogger(__name__)


class BackgroundStepper:
    """Calls ``step`` on a daemon thread every ``poll_s`` clock seconds, or sooner when
    ``next_action_s`` (cloud seconds, None: nothing scheduled) comes first; cloud seconds pass
    ``time_scale`` times as fast as the clock's."""

    def __init__(
        self,
        step: Callable[[], object],
        next_action_s: Callable[[], float | None],
        now_s: Callable[[], float],
        clock: Clock,
        time_scale: float,
    ) -> None:
        self._step, self._next_action_s, self._now_s = step, next_action_s, now_s
        self.clock, self.time_scale = clock, time_scale
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, poll_s: float) -> None:
        """A one-line error unless stepping can start at ``poll_s``."""
        if not poll_s > 0:
            raise LiveputError(f"poll_s must be positive, got {poll_s}")
        if self._thread is not None:
            raise LiveputError("the emulated provider is already stepping")

    def start(self, poll_s: float) -> None:
        self.check(poll_s)
        self._thread = threading.Thread(
            target=self._run, args=(poll_s,), name="liveput-provider", daemon=True
        )
        self._thread.start()

    def _run(self, poll_s: float) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception:  # a dead stepping thread would silently freeze the cloud
                log.exception("emulated provider step failed")
            upcoming = self._next_action_s()
            wait_s = poll_s
            if upcoming is not None:
                wait_s = min(poll_s, max(0.0, (upcoming - self._now_s()) / self.time_scale))
            self.clock.sleep(max(wait_s, 0.001))

    def stop(self) -> None:
        """Stop stepping (waiting for the thread, unless called from it)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
