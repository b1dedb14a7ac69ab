"""The emulated provider: spot follows the trace, on-demand comes late, the bill is exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from liveput.catalog import load_catalog
from liveput.cloud import (
    EmulatedProvider,
    EmulatedProviderConfig,
    InstanceState,
    Market,
    ProviderEventKind,
)
from liveput.cloud.processes import command_launcher
from liveput.errors import LiveputError
from liveput.runtime.clock import ManualClock
from liveput.runtime.notices import Notice, read_notice_file
from liveput.traces import Trace

SCALE = 30.0  # cloud seconds per clock second
START = 1000.0  # clock origin


def trace(initial: int, changes: list[tuple[float, int, int]], end_s: float) -> Trace:
    return Trace(
        name="test",
        initial_count=initial,
        times_s=np.array([c[0] for c in changes], dtype=float),
        added=np.array([c[1] for c in changes], dtype=np.int64),
        removed=np.array([c[2] for c in changes], dtype=np.int64),
        end_s=end_s,
    )


def at(clock: ManualClock, provider: EmulatedProvider, cloud_s: float) -> None:
    """Move to cloud time ``cloud_s`` (a multiple of SCALE: exact in floating point) and step."""
    clock.set(START + cloud_s / SCALE)
    provider.step()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_bill_is_exactly_what_ran_for_as_long_as_it_ran() -> None:
    # Spot capacity 2, down to 1 at 600 s, up to 2 at 900 s.
    clock = ManualClock(START)
    provider = EmulatedProvider(
        trace(2, [(600.0, 0, 1), (900.0, 1, 0)], 1800.0),
        clock,
        EmulatedProviderConfig(
            time_scale=SCALE, notice_lead_s=120.0, on_demand_delay_s=(60.0, 90.0), seed=1
        ),
    )
    spot = provider.request(3, "g4dn.xlarge", "spot")
    assert [r.state for r in spot.granted] == [
        InstanceState.RUNNING,
        InstanceState.RUNNING,
        InstanceState.PENDING,
    ]  # the third waits
    (od,) = provider.request(1, "g4dn.xlarge", Market.ON_DEMAND).granted
    assert od.state is InstanceState.PENDING
    at(clock, provider, 30.0)
    assert provider.instances()[3].state is InstanceState.PENDING  # 60-90 s launch delay
    at(clock, provider, 90.0)
    assert provider.instances()[3].launch_s == 90.0
    at(clock, provider, 450.0)
    assert not any(e.kind is ProviderEventKind.NOTICE for e in provider.events)
    at(clock, provider, 480.0)  # 600 - 120: the removal's notice
    (notice,) = [e for e in provider.events if e.kind is ProviderEventKind.NOTICE]
    victim = notice.instance_id
    assert victim in spot.instance_ids[:2]
    at(clock, provider, 600.0)
    records = {r.instance_id: r for r in provider.instances()}
    assert records[victim].preempted and records[victim].end_s == 600.0
    assert records[spot.instance_ids[2]].state is InstanceState.PENDING  # capacity 1, held 1
    at(clock, provider, 870.0)
    assert provider.instances()[2].state is InstanceState.PENDING
    at(clock, provider, 900.0)
    assert provider.instances()[2].launch_s == 900.0
    at(clock, provider, 1500.0)
    assert provider.release([r.instance_id for r in provider.instances()]) == [
        spot.instance_ids[i] for i in range(3) if spot.instance_ids[i] != victim
    ] + [od.instance_id]
    assert all(r.state is InstanceState.TERMINATED for r in provider.instances())
    at(clock, provider, 3000.0)  # later steps charge nothing more

    catalog = load_catalog("aws").get("g4dn.xlarge")
    spot_s = 1500.0 + 600.0 + (1500.0 - 900.0)
    od_s = 1500.0 - 90.0
    bill = provider.bill()
    assert bill.usd_spot == pytest.approx(catalog.spot_usd_per_hour * spot_s / 3600, rel=1e-12)
    assert bill.usd_on_demand == pytest.approx(
        catalog.on_demand_usd_per_hour * od_s / 3600, rel=1e-12
    )
    assert bill.on_demand_hours == pytest.approx(od_s / 3600, rel=1e-12)
    assert bill.spot_hours == pytest.approx(spot_s / 3600, rel=1e-12)
    assert bill.usd == pytest.approx(bill.usd_spot + bill.usd_on_demand, rel=1e-12)


def test_on_demand_delays_are_seeded_within_bounds() -> None:
    def launches(seed: int) -> list[float]:
        clock = ManualClock(START)
        provider = EmulatedProvider(
            trace(0, [], 600.0),
            clock,
            EmulatedProviderConfig(time_scale=1.0, seed=seed, on_demand_delay_s=(60.0, 90.0)),
        )
        provider.request(6, "c5.xlarge", "on-demand")
        for second in range(1, 100):
            clock.set(START + second)
            provider.step()
        return [r.launch_s for r in provider.instances()]

    first = launches(3)
    assert first == launches(3) and first != launches(4)
    assert all(60.0 <= t <= 90.0 for t in first) and len(set(first)) > 1


def test_a_spot_launch_never_starts_into_a_removal_it_cannot_be_noticed_of() -> None:
    # Capacity 1 until 300 s, 0 after: a spot request at 250 s would run 50 s with no notice.
    clock = ManualClock(START)
    provider = EmulatedProvider(
        trace(1, [(300.0, 0, 1), (600.0, 1, 0)], 900.0),
        clock,
        EmulatedProviderConfig(time_scale=SCALE, notice_lead_s=120.0),
    )
    at(clock, provider, 240.0)
    (record,) = provider.request(1, "c5.xlarge", "spot").granted
    assert record.state is InstanceState.PENDING
    at(clock, provider, 570.0)
    assert provider.instances()[0].state is InstanceState.PENDING
    at(clock, provider, 600.0)  # capacity is back
    assert provider.instances()[0].state is InstanceState.RUNNING
    assert provider.instances()[0].launch_s == 600.0
    assert not any(e.kind is ProviderEventKind.PREEMPT for e in provider.events)


def test_a_removal_of_capacity_the_job_does_not_hold_preempts_nothing() -> None:
    clock = ManualClock(START)
    provider = EmulatedProvider(
        trace(3, [(300.0, 0, 1)], 600.0), clock, EmulatedProviderConfig(time_scale=SCALE)
    )
    provider.request(2, "c5.xlarge", "spot")
    at(clock, provider, 600.0)
    assert all(r.state is InstanceState.RUNNING for r in provider.instances())
    assert not any(e.kind is ProviderEventKind.PREEMPT for e in provider.events)


@pytest.mark.process
def test_agent_processes_are_noticed_killed_and_stopped(tmp_path: Path) -> None:
    clock = ManualClock(START)
    provider = EmulatedProvider(
        trace(2, [(300.0, 0, 1)], 900.0),
        clock,
        EmulatedProviderConfig(time_scale=SCALE, notice_lead_s=120.0, on_demand_delay_s=(60, 60)),
        launcher=command_launcher(["sleep", "120"]),
        notice_dir=tmp_path,
        notice_signal=None,
    )
    try:
        spot = provider.request(2, "c5.xlarge", "spot")
        provider.request(1, "c5.xlarge", "on-demand")
        pids = provider.pids()
        assert set(pids) == set(spot.instance_ids) and all(alive(p) for p in pids.values())
        at(clock, provider, 60.0)
        assert len(provider.pids()) == 3
        at(clock, provider, 180.0)
        (notice,) = [e for e in provider.events if e.kind is ProviderEventKind.NOTICE]
        victim = notice.instance_id
        assert read_notice_file(tmp_path / f"{victim}.notice.json") == Notice(
            "emulator", "terminate", 4.0, victim
        )
        assert alive(pids[victim])
        at(clock, provider, 300.0)
        assert not alive(pids[victim]) and victim not in provider.pids()
        survivor = next(i for i in spot.instance_ids if i != victim)
        provider.release([survivor])
        assert not alive(pids[survivor])
        assert provider.release([survivor]) == []  # already terminated: a no-op
    finally:
        provider.close()
    assert provider.pids() == {}
    assert all(r.end_s is not None for r in provider.instances())


def test_a_request_beyond_the_quota_is_granted_in_part_and_accounted_exactly() -> None:
    clock = ManualClock(START)
    provider = EmulatedProvider(trace(0, [], 600.0), clock)
    # The aws catalog's G family has 32 on-demand vCPUs: 8 g4dn.xlarge (4 vCPUs each).
    first = provider.request(5, "g4dn.xlarge", "on-demand")
    assert (len(first.granted), first.failed) == (5, 0)
    second = provider.request(6, "g4dn.xlarge", "on-demand")
    assert (len(second.granted), second.failed) == (3, 3)
    (failure,) = second.failures
    assert failure.code == "VcpuLimitExceeded" and failure.attempts == 1
    with pytest.raises(
        LiveputError, match="3 of 6 on-demand instance.s. granted; 3 failed: VcpuLimitExceeded"
    ):
        second.check()
    assert len(provider.instances()) == 8
    provider.release(first.instance_ids[:1])  # frees 4 vCPUs: one more fits
    third = provider.request(2, "g4dn.xlarge", "on-demand")
    assert (len(third.granted), third.failed) == (1, 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda p: p.request(1, "g9.huge", "spot"),
            "emulated: unknown instance type.s. g9.huge; known: ",
        ),
        (
            lambda p: p.request(1, "c5.xlarge", "spot", ["mars-1a"]),
            "emulated: unknown zone.s. mars-1a",
        ),
        (
            lambda p: p.request(1, "c5.xlarge", "reserved"),
            "unknown market 'reserved'; known: spot, on-demand",
        ),
        (lambda p: p.request(-1, "c5.xlarge", "spot"), "request count must be an integer >= 0"),
        (lambda p: p.release(["e-9999"]), "cannot release unknown instance.s. e-9999"),
        (lambda p: p.prices("g9.huge"), "unknown instance type.s. g9.huge"),
    ],
)
def test_bad_input_is_one_line(call, message: str) -> None:  # noqa: ANN001
    provider = EmulatedProvider(trace(1, [], 600.0), ManualClock())
    with pytest.raises(LiveputError, match=message) as raised:
        call(provider)
    assert "\n" not in str(raised.value)


def test_unknown_instance_type_in_the_config_is_one_line() -> None:
    with pytest.raises(LiveputError, match="unknown instance type 'g9.huge' in catalog"):
        EmulatedProvider(
            trace(1, [], 600.0),
            ManualClock(),
            EmulatedProviderConfig(instance_types=("c5.xlarge", "g9.huge")),
        )


def test_prices_come_from_the_catalog_per_zone() -> None:
    provider = EmulatedProvider(
        trace(1, [], 600.0), ManualClock(), EmulatedProviderConfig(zones=("z-a", "z-b"))
    )
    spec = load_catalog("aws").get("p3.2xlarge")
    quotes = provider.prices("p3.2xlarge")
    assert [(q.zone, q.spot_usd_per_hour, q.on_demand_usd_per_hour) for q in quotes] == [
        ("z-a", spec.spot_usd_per_hour, spec.on_demand_usd_per_hour),
        ("z-b", spec.spot_usd_per_hour, spec.on_demand_usd_per_hour),
    ]


def test_the_holder_replaces_preempted_spot_and_releases_surplus() -> None:
    from liveput.cloud.holding import InstanceHolder
    from liveput.policies.base import Provisioning

    clock = ManualClock(START)
    provider = EmulatedProvider(
        trace(3, [(300.0, 0, 1)], 900.0),
        clock,
        EmulatedProviderConfig(time_scale=SCALE, notice_lead_s=0.0, on_demand_delay_s=(60.0, 60.0)),
    )
    holder = InstanceHolder(provider, Provisioning(spot=3, on_demand=1), ["c5.xlarge"])
    first = holder.reconcile()
    assert first.alive == Provisioning(3, 1) and [len(r.granted) for r in first.requests] == [3, 1]
    at(clock, provider, 300.0)  # one spot preempted: capacity 2
    assert holder.reconcile().alive == Provisioning(3, 1)  # asked again, pending until capacity
    assert [r.state for r in provider.instances()].count(InstanceState.PENDING) == 1
    holder.target = Provisioning(spot=1, on_demand=0)
    done = holder.reconcile()
    assert done.alive == Provisioning(1, 0) and done.requests == ()
    pending = [r for r in provider.instances() if r.instance_id == "e-0004"]
    assert pending[0].state is InstanceState.TERMINATED and pending[0].launch_s is None
    assert len(done.released) == 3  # the pending spot first, then a running one, the on-demand
    alive = [r.instance_id for r in provider.instances() if r.end_s is None]
    assert len(alive) == 1 and holder.close() == alive
    assert all(r.end_s is not None for r in provider.instances())
