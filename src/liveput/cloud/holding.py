"""Holding a number of instances: the executor of a provisioning decision.

A policy decides *how many* spot and on-demand instances to hold next interval (a
:class:`~liveput.policies.base.Provisioning`); :meth:`InstanceHolder.reconcile` makes the
provider's instances match it:

1. instances alive (pending or running) are counted per market; preempted ones no longer count,
   so a lost spot instance is asked for again;
2. a market short of its target gets one request for the difference (what fails is reported in
   the request's result and asked for again at the next reconcile);
3. a market above its target releases the surplus, pending instances first (they cost nothing
   yet), then the most recently launched (the least work is lost with them).

``liveput coordinator --provider ...`` reconciles once per decision interval on a thread;
the deadline control loop sets :attr:`InstanceHolder.target` each interval instead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from liveput.cloud.provider import Provider
from liveput.cloud.types import InstanceRecord, InstanceState, Market, RequestResult
from liveput.errors import LiveputError
from liveput.policies.base import Provisioning

log = logging.getLogger(__name__)

__all__ = ["Reconciled", "InstanceHolder"]


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile did."""

    requests: tuple[RequestResult, ...]
    """Requests made (at most one per market)."""
    released: tuple[str, ...]
    """Instances released."""
    alive: Provisioning
    """Alive (pending or running) afterwards, per market."""


class InstanceHolder:
    """Keeps ``provider`` holding ``target`` instances of ``instance_types`` (see the module)."""

    def __init__(
        self,
        provider: Provider,
        target: Provisioning,
        instance_types: Sequence[str],
        zones: Sequence[str] | None = None,
    ) -> None:
        if not instance_types:
            raise LiveputError("holding instances needs at least one instance type")
        self.provider = provider
        self.target = target
        self.instance_types = tuple(instance_types)
        self.zones = None if zones is None else tuple(zones)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def alive(self) -> dict[Market, list[InstanceRecord]]:
        alive: dict[Market, list[InstanceRecord]] = {Market.SPOT: [], Market.ON_DEMAND: []}
        for record in self.provider.instances():
            if record.end_s is None:
                alive[record.market].append(record)
        return alive

    def reconcile(self) -> Reconciled:
        with self._lock:
            requests: list[RequestResult] = []
            released: list[str] = []
            alive = self.alive()
            for market in Market:
                held = alive[market]
                want = self.target.spot if market is Market.SPOT else self.target.on_demand
                if len(held) < want:
                    requests.append(
                        self.provider.request(
                            want - len(held), self.instance_types, market, self.zones
                        )
                    )
                elif len(held) > want:
                    # Pending first (not billed yet), then the newest (least work lost).
                    order = sorted(
                        held,
                        key=lambda r: (
                            r.state is not InstanceState.PENDING,
                            -(r.launch_s or 0.0),
                            r.instance_id,
                        ),
                    )
                    surplus = [r.instance_id for r in order[: len(held) - want]]
                    released.extend(self.provider.release(surplus))
            now = self.alive()
            result = Reconciled(
                tuple(requests),
                tuple(released),
                Provisioning(len(now[Market.SPOT]), len(now[Market.ON_DEMAND])),
            )
            for request in requests:
                (log.warning if request.failures else log.info)("holder: %s", request.describe())
            return result

    def start_background(self, interval_s: float) -> None:
        """Reconcile every ``interval_s`` wall seconds on a daemon thread until :meth:`close`
        (an executor's pacing: waiting on an event lets :meth:`close` end it at once)."""
        if not interval_s > 0:
            raise LiveputError(f"reconcile interval must be > 0 s, got {interval_s}")

        def run() -> None:
            while not self._stop.is_set():
                try:
                    self.reconcile()
                except LiveputError as error:  # a provider down for a while: try next interval
                    log.warning("holder: %s", error)
                except Exception:  # a dead thread would silently stop replacing instances
                    log.exception("holder: reconcile failed")
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=run, name="liveput-holder", daemon=True)
        self._thread.start()

    def close(self, release: bool = True) -> list[str]:
        """Stop reconciling; release every instance still alive (unless ``release`` is off)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if not release:
            return []
        with self._lock:
            ids = [r.instance_id for held in self.alive().values() for r in held]
            return self.provider.release(ids) if ids else []
