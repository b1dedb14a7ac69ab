"""The watchdog of a running generation: aborts its communication once the generation is over
for reasons that no connection would tell this rank about in time (see :class:`Watchdog`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from liveput.errors import LiveputError
from liveput.runtime import keys, protocol
from liveput.runtime.comm import Groups
from liveput.runtime.store import Store

# The engine's logger: its lines keep the name they were logged under before the watchdog had a
# module of its own (agents' logs and their filters go by it).
LOG = logging.getLogger("liveput.runtime.engine")
WATCH_S = 0.2
"""How often a running generation checks the store for a failed peer or a newer plan, seconds."""

ENDED_WITH_THE_JOB = "ended with the job"
"""The reason of a watchdog that saw the job fail."""
FAILED_ELSEWHERE = "failed elsewhere"
"""The reason of a watchdog that saw another instance report the generation failed."""


class Watchdog(threading.Thread):
    """Aborts a generation's communication once it is over: a peer reported a failure, the
    coordinator fenced the step this rank is at, or a newer plan is out.

    A rank whose peer died usually sees its connection close; one blocked on a frozen or cut-off
    peer (or in a collective whose other members already gave up) would wait, in C++, for the
    whole communication timeout. The abort ends that wait at once (:meth:`Groups.abort`).

    It watches from before the generation's groups exist: their rendezvous blocks in C++ too, for
    the whole timeout, on a peer that arrived and died before it joined. :attr:`over` tells the
    rank building them to give up (:func:`liveput.runtime.comm.build_unless`); groups attached
    after it is set are aborted as they are attached."""

    def __init__(
        self,
        store: Store,
        generation: int,
        instance: int,
        current_step: Callable[[], int | None],
    ) -> None:
        super().__init__(name=f"liveput-watch-{generation}", daemon=True)
        self.store = store
        self.generation = generation
        self.instance = instance
        self.current_step = current_step
        self.done = threading.Event()
        self.over = threading.Event()
        """Set once the generation is over (:attr:`reason` says why)."""
        self.reason = ""
        """Why it aborted the groups (empty: it did not)."""
        self._groups: Groups | None = None
        self._lock = threading.Lock()

    def attach(self, groups: Groups) -> None:
        """The generation's groups, once built: aborted now if the generation is already over."""
        with self._lock:
            self._groups = groups
            over = self.over.is_set()
        if over:
            groups.abort()

    def _over(self) -> str:
        if self.store.get(keys.job_error()) is not None:
            return ENDED_WITH_THE_JOB
        if self.store.get(keys.failed(self.generation)) is not None:
            return FAILED_ELSEWHERE
        step = self.current_step()
        if (
            step is not None
            and protocol.step_outcome(self.store, self.generation, step) == protocol.ABORTED
        ):
            return f"was fenced at step {step}"
        return "was superseded" if protocol.superseded(self.store, self.generation) else ""

    def run(self) -> None:
        while not self.done.wait(WATCH_S):
            try:
                reason = self._over()
            except LiveputError:
                continue  # the store is restarting; look again
            if reason and not self.done.is_set():
                self.reason = reason
                LOG.info(
                    "instance %d: generation %d %s; aborting its communication",
                    self.instance,
                    self.generation,
                    reason,
                )
                with self._lock:
                    self.over.set()
                    groups = self._groups
                if groups is not None:
                    groups.abort()
                return
