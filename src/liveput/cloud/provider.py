"""The provider contract: where instances come from, what they cost, how they go back.

A provider is the only place with effects on a cloud. Decision code (policies) says how many spot
and on-demand instances to hold; an executor turns that into :meth:`Provider.request` and
:meth:`Provider.release` calls. The contract:

1. ``request(count, instance_type, market, zones)`` grants instances or says why not: every one
   of the ``count`` is either in ``granted`` or counted in a ``failures`` entry (exact partial
   accounting, :class:`~liveput.cloud.types.RequestResult`). Granted instances may be pending.
2. ``release(instance_ids)`` terminates them (pending or running); releasing a terminated one is
   a no-op.
3. ``instances()`` lists every instance granted so far, with state, market, zone, times.
4. ``prices(instance_type, zones)`` quotes spot and on-demand USD per hour per zone.
5. ``bill()``: what the instances cost so far (:mod:`liveput.cloud.billing`).

Errors a cloud answers with (:class:`~liveput.cloud.retry.ProviderError`: throttling, capacity,
quotas) never escape as exceptions from ``request``: retryable ones are tried again with
exponential backoff (:class:`~liveput.cloud.retry.RetryPolicy`, sleeping on the injected clock),
each try is an event and a log line, and what is still missing after the last try is a failure in
the result. Other calls raise a one-line :class:`LiveputError` once their tries are spent. Bad
input (an unknown instance type, zone or market) is a one-line :class:`LiveputError` at once.

Subclasses implement ``_grant`` (one try, may grant part), ``_terminate``, ``_list``,
``_quote``, ``now_s`` and the ``instance_types``/``zones`` they accept.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TypeVar

from liveput.cloud.billing import Bill, BillingAccount
from liveput.cloud.retry import ProviderError, RetryPolicy
from liveput.cloud.types import (
    InstanceRecord,
    Market,
    PriceQuote,
    ProviderEvent,
    ProviderEventKind,
    RequestFailure,
    RequestResult,
)
from liveput.errors import LiveputError
from liveput.runtime.clock import Clock

log = logging.getLogger(__name__)

__all__ = ["Provider", "ProviderError"]

_T = TypeVar("_T")


class Provider(ABC):
    """Rents instances: request, release, list, price, bill (see the module's contract)."""

    name = "provider"
    """Short name, for messages."""

    def __init__(
        self,
        clock: Clock,
        retry: RetryPolicy | None = None,
        on_event: Callable[[ProviderEvent], None] | None = None,
    ) -> None:
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.on_event = on_event
        self._events: list[ProviderEvent] = []
        self._event_lock = threading.Lock()

    # -- what subclasses provide -------------------------------------------------------------

    @abstractmethod
    def now_s(self) -> float:
        """Cloud seconds since the provider started."""

    @property
    @abstractmethod
    def instance_types(self) -> tuple[str, ...]:
        """Instance types this provider can rent."""

    @property
    @abstractmethod
    def zones(self) -> tuple[str, ...]:
        """Zones this provider rents in (the default of a request)."""

    @abstractmethod
    def _grant(
        self, count: int, instance_types: tuple[str, ...], market: Market, zones: tuple[str, ...]
    ) -> tuple[list[InstanceRecord], ProviderError | None]:
        """One try: the instances granted (at most ``count``) and, if fewer, why."""

    @abstractmethod
    def _terminate(self, instance_ids: list[str]) -> None:
        """One try at terminating ``instance_ids`` (known, not yet terminated)."""

    @abstractmethod
    def _list(self) -> list[InstanceRecord]:
        """One try at listing every instance granted so far."""

    @abstractmethod
    def _quote(self, instance_type: str, zones: tuple[str, ...]) -> list[PriceQuote]:
        """One try at the prices of ``instance_type`` in ``zones``."""

    # -- the contract --------------------------------------------------------------------------

    def request(
        self,
        count: int,
        instance_type: str | Sequence[str],
        market: Market | str,
        zones: Sequence[str] | None = None,
    ) -> RequestResult:
        """Ask for ``count`` instances of ``instance_type`` (or any of several types) in
        ``market``, in any of ``zones`` (default: all of the provider's)."""
        market = Market.parse(market)
        types = self._check_types(instance_type)
        chosen_zones = self._check_zones(zones)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise LiveputError(f"{self.name}: request count must be an integer >= 0, got {count!r}")
        self._event(
            ProviderEventKind.REQUEST,
            f"{count} {market.value} {','.join(types)} in {','.join(chosen_zones)}",
        )
        granted: list[InstanceRecord] = []
        failures: list[RequestFailure] = []
        attempt = 0
        while len(granted) < count:
            attempt += 1
            missing = count - len(granted)
            try:
                got, error = self._grant(missing, types, market, chosen_zones)
            except ProviderError as raised:
                got, error = [], raised
            if len(got) > missing:
                raise LiveputError(f"{self.name}: granted {len(got)} instances for {missing} asked")
            granted.extend(got)
            if got:
                self._event(ProviderEventKind.GRANT, " ".join(r.instance_id for r in got))
            if len(granted) == count:
                break
            if error is None:
                error = ProviderError(
                    "Unfulfilled",
                    f"{self.name} granted {len(got)} of {missing} without saying why",
                    retryable=False,
                )
            if not error.retryable or attempt >= self.retry.max_attempts:
                failure = RequestFailure(count - len(granted), error.code, error.message, attempt)
                failures.append(failure)
                self._event(
                    ProviderEventKind.FAIL,
                    f"{failure.count} {market.value} "
                    f"instance(s) not granted: {error.code}: {error.message} "
                    f"(attempt {attempt})",
                    level=logging.WARNING,
                )
                break
            self._backoff(attempt, f"request {missing} {market.value}", error)
        return RequestResult(count, market, tuple(granted), tuple(failures))

    def release(self, instance_ids: Sequence[str]) -> list[str]:
        """Terminate ``instance_ids``; the ones that were still alive (the others were already
        terminated). An id this provider never granted is a one-line error."""
        known = {record.instance_id: record for record in self.instances()}
        unknown = [iid for iid in instance_ids if iid not in known]
        if unknown:
            raise LiveputError(
                f"{self.name}: cannot release unknown instance(s) {', '.join(unknown)}"
            )
        alive = [iid for iid in dict.fromkeys(instance_ids) if known[iid].end_s is None]
        if alive:
            self._retrying(lambda: self._terminate(alive), f"release {', '.join(alive)}")
            for iid in alive:
                self._event(ProviderEventKind.RELEASE, iid, instance_id=iid)
        return alive

    def instances(self) -> list[InstanceRecord]:
        """Every instance granted so far, in grant order."""
        return self._retrying(self._list, "list instances")

    def prices(self, instance_type: str, zones: Sequence[str] | None = None) -> list[PriceQuote]:
        """Spot and on-demand prices of ``instance_type`` in each of ``zones``."""
        (name,) = self._check_types(instance_type)
        chosen = self._check_zones(zones)
        return self._retrying(lambda: self._quote(name, chosen), f"prices of {name}")

    def records(self) -> list[InstanceRecord]:
        """Every instance as billing sees it: by default what the API lists (an emulator that
        reports ends late keeps the true ones here)."""
        return self.instances()

    def bill(self) -> Bill:
        """What every instance cost up to now: each charged until it really ended."""
        return BillingAccount.bill(self.records(), self.now_s())

    def close(self) -> None:
        """Stop any background work (instances stay as they are; release them first)."""

    @property
    def events(self) -> list[ProviderEvent]:
        """Everything the provider did or met, in order."""
        with self._event_lock:
            return list(self._events)

    # -- shared machinery ----------------------------------------------------------------------

    def _check_types(self, instance_type: str | Sequence[str]) -> tuple[str, ...]:
        types = (instance_type,) if isinstance(instance_type, str) else tuple(instance_type)
        if not types:
            raise LiveputError(f"{self.name}: no instance type given")
        unknown = [name for name in types if name not in self.instance_types]
        if unknown:
            raise LiveputError(
                f"{self.name}: unknown instance type(s) {', '.join(unknown)}; "
                f"known: {', '.join(self.instance_types)}"
            )
        return types

    def _check_zones(self, zones: Sequence[str] | None) -> tuple[str, ...]:
        if zones is None:
            return self.zones
        chosen = (zones,) if isinstance(zones, str) else tuple(zones)
        unknown = [zone for zone in chosen if zone not in self.zones]
        if unknown or not chosen:
            raise LiveputError(
                f"{self.name}: unknown zone(s) {', '.join(unknown) or '(none)'}; "
                f"known: {', '.join(self.zones)}"
            )
        return chosen

    def _backoff(self, attempt: int, what: str, error: ProviderError) -> None:
        delay_s = self.retry.delay_s(attempt)
        self._event(
            ProviderEventKind.RETRY,
            f"{what}: {error.code}: {error.message}; try "
            f"{attempt + 1} of {self.retry.max_attempts} in {delay_s:g} s",
            level=logging.WARNING,
        )
        self.clock.sleep(delay_s)

    def _retrying(self, call: Callable[[], _T], what: str) -> _T:
        """``call()``, tried again on retryable provider errors; a one-line error at the end."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except ProviderError as error:
                if not error.retryable or attempt >= self.retry.max_attempts:
                    self._event(
                        ProviderEventKind.FAIL,
                        f"{what}: {error.code}: {error.message}",
                        level=logging.WARNING,
                    )
                    raise LiveputError(
                        f"{self.name}: {what} failed after {attempt} attempt(s): "
                        f"{error.code}: {error.message}"
                    ) from None
                self._backoff(attempt, what, error)

    def _event(
        self,
        kind: ProviderEventKind,
        detail: str,
        *,
        instance_id: str = "",
        level: int = logging.INFO,
        time_s: float | None = None,
        pid: int | None = None,
        lead_s: float | None = None,
        initial: bool = False,
        clock_s: float | None = None,
    ) -> None:
        """Record and log an event, at cloud time ``time_s`` and clock time ``clock_s``
        (default: now)."""
        event = ProviderEvent(
            kind,
            self.now_s() if time_s is None else time_s,
            detail,
            instance_id,
            self.clock.now_s() if clock_s is None else clock_s,
            pid,
            lead_s,
            initial,
        )
        with self._event_lock:
            self._events.append(event)
        log.log(level, "%s %s at %.1f s: %s", self.name, kind.value, event.time_s, detail)
        if self.on_event is not None:
            self.on_event(event)
