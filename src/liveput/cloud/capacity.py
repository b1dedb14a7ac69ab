"""What the emulated cloud lets one job hold: the spot market's capacity, read from a trace,
and the account's vCPU quotas, read from the catalog.

Capacity (the emulated provider's :attr:`~liveput.cloud.emulated.SpotModel.CAPACITY`): the
trace's count at cloud time ``t`` is the spot capacity ``C(t)``, what the market would let this
job hold. A spot request is granted at once as *pending* instances, queued; a queued instance
starts running when the job's spot instances that are running and not noticed number fewer than
``min C`` over ``[now, now + notice lead]`` (so that no instance starts into a removal it could
not be noticed of). For each removal the trace makes at ``t`` the provider looks, at
``t - notice_lead_s``, whether the running, un-noticed spot instances outnumber ``C(t)``: if so
one of them (seeded choice) gets a notice then and is SIGKILLed at ``t``; a removal of capacity
the job does not hold preempts nothing. :class:`CapacitySchedule` answers the questions about
the trace, in trace seconds; the provider keeps the instances.

Quotas: the catalog's vCPU quota per (family, market) counts pending and running instances; a
request beyond it is granted in part, the rest failing with ``VcpuLimitExceeded`` (not retried:
only this job's releases free the emulator's quota).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from liveput.catalog import Catalog, InstanceSpec
from liveput.cloud.replay import trace_schedule
from liveput.cloud.retry import ProviderError
from liveput.cloud.types import InstanceRecord, Market
from liveput.traces import IntervalTrace, Trace

__all__ = ["CapacitySchedule", "within_quota"]


class CapacitySchedule:
    """The capacity ``C(t)`` that ``trace`` describes, and its removals noticed in order."""

    def __init__(self, trace: Trace | IntervalTrace) -> None:
        initial, removals, additions, self.end_s = trace_schedule(trace)
        self._initial = initial
        self._removals = sorted(removals)
        self._additions = sorted(additions)
        self._changes = sorted(set(self._removals) | set(self._additions))
        self._next_removal = 0  # index into _removals of the next removal to notice

    def at(self, time_s: float) -> int:
        """C(t): spot instances the trace offers at trace time ``time_s``."""
        added = bisect.bisect_right(self._additions, time_s)
        removed = bisect.bisect_right(self._removals, time_s)
        return max(0, self._initial + added - removed)

    def least(self, start_s: float, end_s: float) -> int:
        """The least capacity over ``[start_s, end_s]``."""
        low = bisect.bisect_right(self._changes, start_s)
        high = bisect.bisect_right(self._changes, end_s)
        return min([self.at(start_s), *(self.at(t) for t in self._changes[low:high])])

    def removals_due(self, now_s: float, lead_s: float) -> Iterator[float]:
        """The times of the removals whose notice (``lead_s`` before them) is due by ``now_s``,
        each once, in order; a removal counts as taken once it is yielded."""
        while (
            self._next_removal < len(self._removals)
            and self._removals[self._next_removal] - lead_s <= now_s
        ):
            kill_s = self._removals[self._next_removal]
            self._next_removal += 1
            yield kill_s


def within_quota(
    catalog: Catalog,
    spec: InstanceSpec,
    market: Market,
    count: int,
    records: Iterable[InstanceRecord],
) -> tuple[int, ProviderError | None]:
    """How many of ``count`` new ``spec`` instances of ``market`` the vCPU quota of their family
    allows beside the instances of ``records`` not yet ended; the error for the rest, if any."""
    quota = catalog.quota_vcpus(spec.family, market)
    if quota is None:
        return count, None
    used = sum(
        catalog.get(r.instance_type).vcpus
        for r in records
        if r.end_s is None
        and r.market is market
        and catalog.get(r.instance_type).family == spec.family
    )
    allowed = max(0, min(count, (quota - used) // max(spec.vcpus, 1)))
    if allowed == count:
        return allowed, None
    return allowed, ProviderError(
        "VcpuLimitExceeded",
        f"{market.value} vCPU quota of family {spec.family} "
        f"is {quota}, {used} in use; {spec.name} needs {spec.vcpus} each",
        retryable=False,
    )
