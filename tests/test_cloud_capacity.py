"""The spot market's capacity read from a trace, and the vCPU quota, against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from liveput.catalog import load_catalog
from liveput.cloud.capacity import CapacitySchedule, within_quota
from liveput.cloud.types import InstanceRecord, InstanceState, Market
from liveput.traces import Trace


def random_trace(rng: np.random.Generator) -> Trace:
    """Changes at random multiples of 30 s; never more removed than there are."""
    times = np.unique(rng.integers(1, 40, size=int(rng.integers(1, 12)))).astype(float) * 30.0
    count = int(rng.integers(0, 5))
    initial, added, removed = count, [], []
    for _ in times:
        added.append(int(rng.integers(0, 3)))
        removed.append(int(rng.integers(0, count + added[-1] + 1)))
        count += added[-1] - removed[-1]
    return Trace(
        name="random",
        initial_count=initial,
        times_s=times,
        added=np.array(added, dtype=np.int64),
        removed=np.array(removed, dtype=np.int64),
        end_s=1500.0,
    )


def count_at(trace: Trace, time_s: float) -> int:
    """C(t) by walking the trace's changes up to ``time_s``."""
    count = trace.initial_count
    for at_s, added, removed in zip(trace.times_s, trace.added, trace.removed, strict=True):
        if at_s <= time_s:
            count += int(added) - int(removed)
    return max(0, count)


@pytest.mark.parametrize("seed", range(20))
def test_capacity_is_the_trace_count_and_its_least_over_a_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    trace = random_trace(rng)
    capacity = CapacitySchedule(trace)
    grid = np.arange(0.0, 1500.0, 15.0)  # every change and every point between two
    for time_s in grid:
        assert capacity.at(time_s) == count_at(trace, time_s)
    for start_s, end_s in rng.integers(0, 100, size=(10, 2)) * 15.0:
        low, high = sorted((float(start_s), float(end_s)))
        inside = [t for t in grid if low <= t <= high]
        assert capacity.least(low, high) == min(count_at(trace, t) for t in inside)


def test_each_removal_is_due_once_in_order_when_its_notice_falls_due() -> None:
    trace = Trace(
        name="removals",
        initial_count=4,
        times_s=np.array([300.0, 600.0, 900.0]),
        added=np.array([0, 1, 0], dtype=np.int64),
        removed=np.array([2, 1, 1], dtype=np.int64),
        end_s=1200.0,
    )
    capacity = CapacitySchedule(trace)
    assert list(capacity.removals_due(100.0, 120.0)) == []
    assert list(capacity.removals_due(180.0, 120.0)) == [300.0, 300.0]
    assert list(capacity.removals_due(480.0, 120.0)) == [600.0]  # the 300-s ones are taken
    assert list(capacity.removals_due(2000.0, 120.0)) == [900.0]
    assert list(capacity.removals_due(2000.0, 120.0)) == []
    assert capacity.end_s == 1200.0


def record(iid: str, instance_type: str, market: Market, ended: bool) -> InstanceRecord:
    return InstanceRecord(
        iid,
        instance_type,
        market,
        "emulated-1a",
        InstanceState.TERMINATED if ended else InstanceState.RUNNING,
        0.0,
        1.0,
        end_s=5.0 if ended else None,
    )


def test_the_quota_counts_live_instances_of_the_family_and_market_only() -> None:
    catalog = load_catalog("aws")
    spec = catalog.get("g4dn.xlarge")  # family G: 32 on-demand vCPUs, 4 per instance
    quota = catalog.quota_vcpus(spec.family, Market.ON_DEMAND)
    assert quota == 32
    live = [record(f"e-{i}", spec.name, Market.ON_DEMAND, ended=False) for i in range(5)]
    others = [
        record("e-90", spec.name, Market.ON_DEMAND, ended=True),  # released: frees its vCPUs
        record("e-91", spec.name, Market.SPOT, ended=False),  # the other market's quota
    ]
    assert within_quota(catalog, spec, Market.ON_DEMAND, 3, live + others) == (3, None)
    allowed, error = within_quota(catalog, spec, Market.ON_DEMAND, 6, live + others)
    assert allowed == 3 and error is not None
    assert (error.code, error.retryable) == ("VcpuLimitExceeded", False)
    assert "on-demand vCPU quota of family G is 32, 20 in use" in str(error)
