"""The loss signal delay: the emulated provider's list reports an instance the cloud ended only
``loss_signal_delay_s`` trace seconds after its end (never, with None), as a real provider's API
reports it late; its processes die and its bill stops at the end all the same."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from liveput.cloud import EmulatedProvider, EmulatedProviderConfig, InstanceState, SpotModel
from liveput.cloud.loss_report import as_reported, report_s
from liveput.cloud.processes import command_launcher
from liveput.cloud.types import InstanceRecord, Market
from liveput.errors import LiveputError
from liveput.launch.cloud import LocalCloud
from liveput.launch.local import LocalTrainingConfig
from liveput.runtime.clock import ManualClock
from liveput.traces import Trace

SCALE = 30.0  # cloud seconds per clock second: whole cloud seconds are exact clock times
START = 1000.0
KILL_S = 300.0  # the trace's one removal (its notice at 180 s)


def one_removal() -> Trace:
    """Two instances from the start, one removed at ``KILL_S``."""
    return Trace(
        name="test",
        initial_count=2,
        times_s=np.array([KILL_S]),
        added=np.array([0], dtype=np.int64),
        removed=np.array([1], dtype=np.int64),
        end_s=900.0,
    )


def replay(clock: ManualClock, delay_s: float | None) -> EmulatedProvider:
    """A replay that only accounts (no launcher), started at ``START``."""
    provider = EmulatedProvider(
        one_removal(),
        clock,
        EmulatedProviderConfig(
            time_scale=SCALE,
            notice_lead_s=120.0,
            spot=SpotModel.REPLAY,
            loss_signal_delay_s=delay_s,
        ),
    )
    provider.start()
    return provider


def at(clock: ManualClock, provider: EmulatedProvider, cloud_s: float) -> None:
    clock.set(START + cloud_s / SCALE)
    provider.step()


def listed(provider: EmulatedProvider) -> dict[str, InstanceRecord]:
    return {r.instance_id: r for r in provider.instances()}


def victim(provider: EmulatedProvider) -> str:
    (iid,) = [r.instance_id for r in provider.records() if r.end_s is not None]
    return iid


def test_an_end_is_reported_no_sooner_than_its_delay_and_then_at_once() -> None:
    clock = ManualClock(START)
    provider = replay(clock, delay_s=30.0)
    at(clock, provider, KILL_S)
    iid = victim(provider)
    killed = {r.instance_id: r for r in provider.records()}[iid]
    assert killed.state is InstanceState.TERMINATED and killed.end_s == KILL_S
    for now_s in (KILL_S, KILL_S + 29.0):
        at(clock, provider, now_s)
        shown = listed(provider)[iid]
        assert shown.state is InstanceState.RUNNING
        assert shown.end_s is None and not shown.preempted
    at(clock, provider, KILL_S + 30.0)
    shown = listed(provider)[iid]
    assert shown.state is InstanceState.TERMINATED
    assert shown.end_s == KILL_S and shown.preempted
    # Billed to its true end, not to its report.
    charge = {c.instance_id: c for c in provider.bill().charges}[iid]
    assert charge.run_s == KILL_S


def test_without_a_delay_the_end_is_reported_at_once() -> None:
    clock = ManualClock(START)
    provider = replay(clock, delay_s=0.0)
    at(clock, provider, KILL_S)
    assert listed(provider)[victim(provider)].state is InstanceState.TERMINATED
    assert EmulatedProviderConfig().loss_signal_delay_s == 0.0  # the product's default


def test_with_none_the_end_is_never_reported_unless_released() -> None:
    clock = ManualClock(START)
    provider = replay(clock, delay_s=None)
    at(clock, provider, KILL_S)
    iid = victim(provider)
    at(clock, provider, 100_000.0)
    assert listed(provider)[iid].state is InstanceState.RUNNING
    assert provider.bill().usd == pytest.approx(
        sum(r.price_usd_per_hour * (r.run_s(100_000.0)) / 3600 for r in provider.records())
    )
    # Terminating it asks the API about it: its answer says the instance is gone.
    provider.release([iid])
    assert listed(provider)[iid].state is InstanceState.TERMINATED


def test_the_report_is_pure_in_the_end_the_delay_and_now() -> None:
    assert report_s(100.0, 30.0) == 130.0 and report_s(100.0, None) is None
    ended = InstanceRecord(
        "i-0001", "g4dn.xlarge", Market.SPOT, "z", InstanceState.TERMINATED, 0.0, 1.0, 0.0, 100.0
    )
    assert as_reported(ended, 130.0, 129.9).state is InstanceState.RUNNING
    assert as_reported(ended, 130.0, 130.0) is ended
    assert as_reported(ended, None, 1e9).state is InstanceState.RUNNING


@pytest.mark.parametrize("delay_s", [-1.0, float("nan")])
def test_a_negative_delay_is_refused(delay_s: float) -> None:
    with pytest.raises(ValueError, match="loss signal delay must be >= 0"):
        EmulatedProviderConfig(loss_signal_delay_s=delay_s)
    with pytest.raises(LiveputError, match="train: the loss signal delay"):
        LocalTrainingConfig(loss_signal_delay_s=delay_s)
    assert LocalTrainingConfig(loss_signal_delay_s=None).loss_signal_delay_s is None


@pytest.fixture
def local_cloud(process_tier: None, tmp_path: Path) -> Iterator[tuple[LocalCloud, ManualClock]]:
    clock = ManualClock(START)
    cloud = LocalCloud(
        one_removal(),
        command_launcher(["sleep", "120"]),
        clock,
        tmp_path,
        workers=2,
        time_scale=SCALE,
        notice_lead_s=120.0,
        seed=0,
        loss_signal_delay_s=30.0,
    )
    yield cloud, clock
    cloud.close()


def test_the_local_clouds_ended_instances_follow_the_providers_report(
    local_cloud: tuple[LocalCloud, ManualClock],
) -> None:
    cloud, clock = local_cloud
    cloud.provider.start()
    at(clock, cloud.provider, KILL_S)
    iid = victim(cloud.provider)
    assert iid not in cloud.provider.pids()  # SIGKILLed at its end, as before
    assert cloud.ended_instances() == []  # but not reported yet
    at(clock, cloud.provider, KILL_S + 30.0)
    assert cloud.ended_instances() == [int(iid.split("-")[1])]
