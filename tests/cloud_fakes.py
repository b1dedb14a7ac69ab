"""An in-memory provider for tests (torch.elastic style): it grants what its script says.

Each try of a request (``_grant``) and of the other calls takes the next outcome of its script:
an integer grants that many (at most what is missing) and, short of all, answers with
``InsufficientInstanceCapacity``; a :class:`ProviderError` is raised as the cloud's answer.
With the script empty, everything asked is granted.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque

from liveput.cloud import (
    InstanceRecord,
    InstanceState,
    Market,
    PriceQuote,
    Provider,
    ProviderError,
    RetryPolicy,
)
from liveput.runtime.clock import Clock

__all__ = ["FakeProvider", "throttled", "no_capacity"]


def throttled() -> ProviderError:
    return ProviderError("RequestLimitExceeded", "Request limit exceeded.", retryable=True)


def no_capacity() -> ProviderError:
    return ProviderError(
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient capacity in the Availability Zone you requested.",
        retryable=True,
    )


class FakeProvider(Provider):
    name = "fake"

    def __init__(
        self,
        clock: Clock,
        retry: RetryPolicy | None = None,
        grants: list[int | ProviderError] | None = None,
        calls: list[ProviderError] | None = None,
    ) -> None:
        super().__init__(clock, retry)
        self.grants: deque[int | ProviderError] = deque(grants or [])
        self.calls: deque[ProviderError] = deque(calls or [])
        self.tries = 0
        self._ids = itertools.count()
        self._all: dict[str, InstanceRecord] = {}

    def now_s(self) -> float:
        return self.clock.now_s()

    @property
    def instance_types(self) -> tuple[str, ...]:
        return ("small", "large")

    @property
    def zones(self) -> tuple[str, ...]:
        return ("fake-1a", "fake-1b")

    def _grant(self, count, instance_types, market, zones):  # noqa: ANN001, ANN202
        self.tries += 1
        outcome = self.grants.popleft() if self.grants else count
        if isinstance(outcome, ProviderError):
            raise outcome
        got = []
        for _ in range(min(outcome, count)):
            iid = f"f-{next(self._ids)}"
            record = InstanceRecord(
                iid,
                instance_types[0],
                market,
                zones[0],
                InstanceState.RUNNING,
                self.now_s(),
                1.0 if market is Market.SPOT else 3.0,
                launch_s=self.now_s(),
            )
            self._all[iid] = record
            got.append(record)
        return got, (no_capacity() if len(got) < count else None)

    def _call(self) -> None:
        self.tries += 1
        if self.calls:
            raise self.calls.popleft()

    def _terminate(self, instance_ids: list[str]) -> None:
        self._call()
        for iid in instance_ids:
            self._all[iid] = dataclasses.replace(
                self._all[iid], state=InstanceState.TERMINATED, end_s=self.now_s()
            )

    def _list(self) -> list[InstanceRecord]:
        self._call()
        return list(self._all.values())

    def _quote(self, instance_type: str, zones: tuple[str, ...]) -> list[PriceQuote]:
        self._call()
        return [PriceQuote(instance_type, zone, 1.0, 3.0) for zone in zones]
