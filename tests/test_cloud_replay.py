"""The emulated provider replays traces as a job's instances against real processes, on a manual
clock (and one real run)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from liveput.cloud import EmulatedProvider, EmulatedProviderConfig, ProviderEventKind, SpotModel
from liveput.cloud.processes import Launcher, LaunchSpec, command_launcher
from liveput.errors import LiveputError
from liveput.runtime.clock import Clock, ManualClock, MonotonicClock
from liveput.runtime.instance_env import INSTANCE_ID_ENV, MARKET_ENV, NOTICE_FILE_ENV
from liveput.runtime.notices import AWS_NOTICE_LEAD_S, GCP_NOTICE_LEAD_S, Notice, read_notice_file
from liveput.runtime.store import MemoryStore, Store
from liveput.traces import IntervalTrace, Trace

SLEEPER = command_launcher(["sleep", "120"])
LAUNCH, NOTICE, KILL, EXIT = (
    ProviderEventKind.LAUNCH,
    ProviderEventKind.NOTICE,
    ProviderEventKind.PREEMPT,
    ProviderEventKind.EXIT,
)


def replaying(
    trace: Trace | IntervalTrace,
    launcher: Launcher,
    clock: Clock,
    notice_dir: Path,
    *,
    time_scale: float = 30.0,
    notice_lead_s: float = AWS_NOTICE_LEAD_S,
    seed: int = 0,
    notice_signal: int | None = signal.SIGUSR1,
    store: Store | None = None,
    on_event=None,
) -> EmulatedProvider:  # type: ignore[no-untyped-def]
    """The emulated provider replaying ``trace`` as the job's instances (``liveput train``'s)."""
    return EmulatedProvider(
        trace,
        clock,
        EmulatedProviderConfig(
            time_scale=time_scale, notice_lead_s=notice_lead_s, seed=seed, spot=SpotModel.REPLAY
        ),
        launcher=launcher,
        notice_dir=notice_dir,
        notice_signal=notice_signal,
        store=store,
        on_event=on_event,
    )


def make_trace(initial: int, changes: list[tuple[float, int, int]], end_s: float) -> Trace:
    """A trace from (time_s, added, removed) changes."""
    return Trace(
        name="test",
        initial_count=initial,
        times_s=np.array([c[0] for c in changes], dtype=float),
        added=np.array([c[1] for c in changes], dtype=np.int64),
        removed=np.array([c[2] for c in changes], dtype=np.int64),
        end_s=end_s,
    )


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def clouds(process_tier: None) -> Iterator[list[EmulatedProvider]]:
    """Clouds a test creates; closed (every process killed) afterwards."""
    made: list[EmulatedProvider] = []
    yield made
    for cloud in made:
        cloud.close()


def test_notice_lead_then_kill_then_launch_on_manual_clock(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    clock = ManualClock(1000.0)
    store = MemoryStore()
    trace = make_trace(2, [(300.0, 0, 1), (600.0, 1, 0)], end_s=900.0)
    cloud = replaying(
        trace,
        SLEEPER,
        clock,
        tmp_path,
        time_scale=30,
        notice_lead_s=120,
        seed=3,
        notice_signal=None,
        store=store,
    )
    clouds.append(cloud)
    cloud.start()
    launched = cloud.events
    assert [(e.kind, e.initial, e.instance_id) for e in launched] == [
        (LAUNCH, True, "i-0000"),
        (LAUNCH, True, "i-0001"),
    ]
    pids = cloud.pids()
    assert all(alive(pid) for pid in pids.values())

    clock.set(1000.0 + 5.99)  # notice due at trace 180 s = clock +6 s
    assert cloud.step() == []
    clock.set(1006.0)
    (notice,) = cloud.step()
    assert notice.kind is NOTICE and notice.time_s == pytest.approx(180.0)
    assert notice.lead_s == pytest.approx(4.0)  # 120 trace s at x30
    victim = notice.instance_id
    assert read_notice_file(tmp_path / f"{victim}.notice.json") == Notice(
        "emulator", "terminate", 4.0, victim
    )
    assert Notice.from_json(store.get(f"notices/{victim}").decode(), "store") == Notice(
        "emulator", "terminate", 4.0, victim
    )
    assert alive(pids[victim]), "a notice must come before the kill, not with it"

    clock.set(1009.99)
    assert cloud.step() == []
    clock.set(1010.0)
    (kill,) = cloud.step()
    assert (kill.kind, kill.instance_id, kill.time_s) == (KILL, victim, 300.0)
    assert kill.clock_s - notice.clock_s == pytest.approx(4.0)
    assert not alive(pids[victim])
    survivor = next(iid for iid in pids if iid != victim)
    assert set(cloud.pids()) == {survivor} and alive(pids[survivor])

    clock.set(1020.0)
    (launch,) = cloud.step()
    assert (launch.kind, launch.instance_id, launch.initial) == (LAUNCH, "i-0002", False)
    assert (cloud.preemptions, cloud.allocations) == (1, 1)
    assert not cloud.done
    clock.set(1030.0)
    cloud.step()
    assert cloud.done
    cloud.close()
    assert cloud.pids() == {}
    assert not alive(pids[survivor])


def test_victims_are_seeded(tmp_path: Path, clouds: list[EmulatedProvider]) -> None:
    trace = make_trace(6, [(100.0, 0, 2), (200.0, 0, 3)], end_s=300.0)

    def victims(seed: int) -> list[str]:
        clock = ManualClock()
        cloud = replaying(
            trace,
            SLEEPER,
            clock,
            tmp_path,
            time_scale=100,
            notice_lead_s=0,
            seed=seed,
            notice_signal=None,
        )
        clouds.append(cloud)
        cloud.start()
        clock.advance(3.0)
        kills = [e.instance_id for e in cloud.step() if e.kind is KILL]
        cloud.close()
        return kills

    first = victims(7)
    assert len(first) == 5 and len(set(first)) == 5
    assert victims(7) == first
    assert victims(8) != first


def test_interval_trace_spreads_changes_inside_intervals(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    trace = IntervalTrace(
        name="intervals",
        interval_s=60.0,
        count=np.array([3, 1, 3]),
        preempted=np.array([2, 0, 0]),
        allocated=np.array([0, 2, 0]),
    )
    clock = ManualClock()
    cloud = replaying(
        trace, SLEEPER, clock, tmp_path, time_scale=60, notice_lead_s=10, notice_signal=None
    )
    clouds.append(cloud)
    cloud.start()
    assert cloud.next_action_s() == pytest.approx(10.0)  # removal at 20 s, noticed 10 s before
    clock.advance(3.0)  # the whole trace (180 trace s)
    events = cloud.step()
    timeline = [(e.kind, round(e.time_s, 6)) for e in events]
    assert timeline == [
        (NOTICE, 10.0),
        (KILL, 20.0),
        (NOTICE, 30.0),
        (KILL, 40.0),
        (LAUNCH, 80.0),
        (LAUNCH, 100.0),
    ]
    assert len(cloud.pids()) == 3 and cloud.done


def test_notice_waits_for_an_instance_when_none_is_there(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    # Empty at first; one instance arrives at 100 s and the trace removes it at 150 s: the notice
    # (due at 30 s) goes to it when it arrives, with the lead that is left.
    trace = make_trace(0, [(100.0, 1, 0), (150.0, 0, 1)], end_s=200.0)
    clock = ManualClock()
    cloud = replaying(
        trace, SLEEPER, clock, tmp_path, time_scale=10, notice_lead_s=120, notice_signal=None
    )
    clouds.append(cloud)
    cloud.start()
    clock.set(10.0)
    events = cloud.step()
    assert [(e.kind, e.instance_id) for e in events] == [(LAUNCH, "i-0000"), (NOTICE, "i-0000")]
    assert events[1].lead_s == pytest.approx(5.0)  # 50 trace s left at x10
    clock.set(15.0)
    assert [e.kind for e in cloud.step()] == [KILL]


def _instances_that_exited(
    tmp_path: Path, clouds: list[EmulatedProvider], notice_lead_s: float
) -> tuple[EmulatedProvider, ManualClock]:
    """Two instances, replaying a removal at 100 s and an arrival at 150 s (x10), whose
    processes have exited by themselves (code 3) by the time this returns."""
    launcher = command_launcher([sys.executable, "-c", "import sys; sys.exit(3)"])
    trace = make_trace(2, [(100.0, 0, 1), (150.0, 1, 0)], end_s=200.0)
    clock = ManualClock()
    cloud = replaying(
        trace,
        launcher,
        clock,
        tmp_path,
        time_scale=10,
        notice_lead_s=notice_lead_s,
        notice_signal=None,
    )
    clouds.append(cloud)
    cloud.start()
    deadline = time.monotonic() + 20
    while len(cloud.pids()) and time.monotonic() < deadline:
        cloud.step()
        time.sleep(0.02)
    return cloud, clock


def test_processes_that_exit_by_themselves_are_recorded_and_not_preempted(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    cloud, clock = _instances_that_exited(tmp_path, clouds, notice_lead_s=0)
    exits = [e for e in cloud.events if e.kind is EXIT]
    assert sorted(e.detail for e in exits) == ["i-0000 exit code 3", "i-0001 exit code 3"]
    clock.set(12.0)
    cloud.step()  # the removal at 100 s finds nobody: void, not carried over to the next launch
    clock.set(15.0)
    assert [e.kind for e in cloud.step()] == [LAUNCH]
    clock.set(20.0)
    assert [e for e in cloud.step() if e.kind in (NOTICE, KILL)] == []
    assert cloud.preemptions == 0


def test_a_removal_whose_time_passed_unnoticed_is_void_at_the_next_launch(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    """The removal at 100 s is due its notice at 50 s, when every instance has exited by
    itself; the next instance comes at 150 s, after the removal's time: it is not its victim
    (preempted before it was launched, the provider's record refused it)."""
    cloud, clock = _instances_that_exited(tmp_path, clouds, notice_lead_s=50)
    assert len([e for e in cloud.events if e.kind is EXIT]) == 2
    clock.set(6.0)
    assert cloud.step() == []  # the notice's time: nobody to notice, the removal waits
    clock.set(15.0)
    assert [e.kind for e in cloud.step()] == [LAUNCH]
    clock.set(20.0)
    cloud.step()
    assert [e for e in cloud.events if e.kind in (NOTICE, KILL)] == []
    assert cloud.preemptions == 0


AGENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from liveput.runtime.notices import EmulatorNoticeWatcher, NoticeMonitor
    out = Path(sys.argv[1]) / (os.environ["LIVEPUT_INSTANCE_ID"] + ".out")
    def on_notice(notice):
        out.write_text(out.read_text() + "notice " + notice.to_json() + "\\n")
    watcher = EmulatorNoticeWatcher(Path(os.environ["LIVEPUT_NOTICE_FILE"]))
    NoticeMonitor([watcher], on_notice, interval_s=30.0).start()
    out.write_text("ready\\n")
    time.sleep(120)
    """
)


def test_real_agents_get_the_signalled_notice_before_sigkill(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    launcher = command_launcher([sys.executable, "-c", AGENT, str(tmp_path)], log_dir=tmp_path)
    trace = make_trace(2, [(60.0, 0, 1)], end_s=120.0)
    clock = ManualClock()
    cloud = replaying(
        trace, launcher, clock, tmp_path, time_scale=10, notice_lead_s=GCP_NOTICE_LEAD_S, seed=1
    )
    clouds.append(cloud)
    cloud.start()

    def output(instance_id: str) -> str:
        path = tmp_path / f"{instance_id}.out"
        return path.read_text() if path.exists() else ""

    def wait_until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    wait_until(
        lambda: all(output(i).startswith("ready") for i in ("i-0000", "i-0001")), "agents to start"
    )
    pids = cloud.pids()
    clock.set(3.0)  # notice at trace 30 s
    (notice,) = cloud.step()
    victim = notice.instance_id
    # The agent's monitor polls every 30 s: only the signal can make it see the notice this soon.
    wait_until(lambda: "notice" in output(victim), "the victim to see its notice")
    seen = Notice.from_json(output(victim).splitlines()[1].removeprefix("notice "), "agent output")
    # The lead left when the agent read it (counted from the notice file's mtime).
    assert dataclasses.replace(seen, lead_s=3.0) == Notice("emulator", "terminate", 3.0, victim)
    assert seen.lead_s is not None and 2.0 < seen.lead_s <= 3.0
    assert alive(pids[victim])
    clock.set(6.0)
    (kill,) = cloud.step()
    assert kill.kind is KILL and kill.instance_id == victim
    other = next(i for i in pids if i != victim)
    assert output(other) == "ready\n" and alive(pids[other])


def test_a_notice_is_stamped_at_the_instant_its_lead_counts_from(tmp_path: Path) -> None:
    """On a loaded machine time passes between two reads of the clock: here 1 ms at every
    read. The notice's clock time plus its lead is the instant its kill is due, so the kill is
    never recorded less than the lead after the notice (stamped at a later read, a CI run saw
    the kill 50 us early)."""

    class Ticking(ManualClock):
        def now_s(self) -> float:
            return self.advance(0.001)

    clock = Ticking()
    trace = make_trace(1, [(60.0, 0, 1)], end_s=120.0)
    cloud = EmulatedProvider(
        trace,
        clock,
        EmulatedProviderConfig(time_scale=1.0, notice_lead_s=30.0, spot=SpotModel.REPLAY),
        notice_dir=tmp_path,
        notice_signal=None,
    )
    cloud.start()
    started_s = cloud._start_clock_s  # the clock time of trace time 0
    assert started_s is not None
    clock.set(started_s + 45.0)
    (notice,) = cloud.step()
    assert notice.kind is NOTICE and notice.lead_s is not None
    assert notice.clock_s + notice.lead_s == pytest.approx(started_s + 60.0, abs=1e-9)


def test_background_replay_in_real_time(tmp_path: Path, clouds: list[EmulatedProvider]) -> None:
    seen: list[ProviderEventKind] = []
    trace = make_trace(1, [(60.0, 0, 1), (120.0, 2, 0)], end_s=180.0)
    cloud = replaying(
        trace, SLEEPER, MonotonicClock(), tmp_path, time_scale=600, notice_lead_s=30,
        notice_signal=None, on_event=lambda e: seen.append(e.kind),
    )  # fmt: skip
    clouds.append(cloud)
    started = time.monotonic()
    cloud.start_background(poll_s=0.01)
    deadline = time.monotonic() + 10
    while not cloud.done:
        assert time.monotonic() < deadline, f"replay stuck at trace {cloud.now_s():.1f} s"
        time.sleep(0.01)
    assert time.monotonic() - started >= 0.3 - 0.01  # 180 trace s at x600
    assert seen == [LAUNCH, NOTICE, KILL, LAUNCH, LAUNCH]
    notice, kill = cloud.events[1], cloud.events[2]
    assert notice.lead_s is not None and 0 < notice.lead_s <= 0.05 + 1e-9  # 30 s at x600
    assert (
        kill.clock_s - notice.clock_s >= notice.lead_s - 1e-6
    )  # never killed before the lead is up
    pids = list(cloud.pids().values())
    assert len(pids) == 2
    cloud.close()
    assert not any(alive(pid) for pid in pids)


@pytest.mark.process
def test_launcher_fills_template_and_environment(tmp_path: Path) -> None:
    launcher = command_launcher(
        [
            sys.executable,
            "-c",
            "import os,sys; print(sys.argv[1], os.environ['LIVEPUT_INSTANCE_ID'],"
            " os.environ['LIVEPUT_NOTICE_FILE'])",
            "{instance_id}:{notice_file}",
        ],
        log_dir=tmp_path,
    )  # fmt: skip
    spec = LaunchSpec("i-0042", tmp_path / "n.json")
    assert spec.env == {
        INSTANCE_ID_ENV: "i-0042",
        NOTICE_FILE_ENV: str(tmp_path / "n.json"),
        MARKET_ENV: "spot",
    }
    assert launcher(spec).wait(timeout=30) == 0
    assert (tmp_path / "i-0042.log").read_text().split() == [
        f"i-0042:{tmp_path / 'n.json'}",
        "i-0042",
        str(tmp_path / "n.json"),
    ]
    with pytest.raises(LiveputError, match="bad placeholder"):
        command_launcher(["agent", "{nope}"])(spec)
    with pytest.raises(LiveputError, match="empty"):
        command_launcher([])


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    trace = make_trace(1, [], end_s=10.0)
    with pytest.raises(LiveputError, match="time_scale"):
        replaying(trace, SLEEPER, ManualClock(), tmp_path, time_scale=0)
    with pytest.raises(LiveputError, match="notice_lead_s"):
        replaying(trace, SLEEPER, ManualClock(), tmp_path, notice_lead_s=-1)
    with pytest.raises(LiveputError, match="does not exist"):
        replaying(trace, SLEEPER, ManualClock(), tmp_path / "missing")
    cloud = replaying(trace, SLEEPER, ManualClock(), tmp_path)
    with pytest.raises(LiveputError, match="start"):
        cloud.step()
    clock = ManualClock(5.0)
    with pytest.raises(LiveputError, match="cannot go back"):
        clock.set(4.0)
    with pytest.raises(LiveputError, match="cannot go back"):
        clock.advance(-1.0)


@pytest.mark.process
def test_launch_failure_names_the_instance(tmp_path: Path) -> None:
    trace = make_trace(1, [], end_s=10.0)
    cloud = replaying(
        trace, command_launcher([str(tmp_path / "no-such-agent")]), ManualClock(), tmp_path
    )
    with pytest.raises(LiveputError, match="could not launch i-0000"):
        cloud.start()


def test_a_victim_that_dies_on_its_notice_still_counts_as_preempted(
    tmp_path: Path, clouds: list[EmulatedProvider]
) -> None:
    # The victim ends by itself after its notice (an agent leaving once its layers are
    # elsewhere, or one that crashed); the preemption is still recorded, at its time, not as
    # an exit. (The notice signal itself no longer ends a process that is still starting: the
    # cloud launches with it blocked, see tests/test_runtime_notices.py.)
    trace = make_trace(1, [(60.0, 0, 1)], end_s=120.0)
    clock = ManualClock()
    cloud = replaying(trace, SLEEPER, clock, tmp_path, time_scale=10, notice_lead_s=30)
    clouds.append(cloud)
    cloud.start()
    pid = cloud.pids()["i-0000"]
    clock.set(3.0)
    assert [e.kind for e in cloud.step()] == [NOTICE]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cloud.step() == [] and set(cloud.pids()) == {"i-0000"}
    clock.set(6.0)
    (kill,) = cloud.step()
    assert (kill.kind, kill.time_s, kill.detail) == (
        KILL,
        60.0,
        f"i-0000 (its agent had exited, code {-signal.SIGTERM})",
    )
    assert cloud.preemptions == 1 and not [e for e in cloud.events if e.kind is EXIT]


def test_a_replay_grants_spot_only_from_its_trace_and_rents_on_demand_after_the_delay() -> None:
    """Without a launcher the replay only accounts: its spot instances are the trace's (a spot
    request is refused at once, not retried), on-demand ones start after their launch delay and
    bill at the catalog's price like any emulated instance."""
    clock = ManualClock()
    trace = make_trace(1, [(60.0, 1, 0)], end_s=120.0)
    provider = EmulatedProvider(
        trace,
        clock,
        EmulatedProviderConfig(
            instance_types=("c5.xlarge",),
            time_scale=1.0,
            notice_lead_s=0,
            spot=SpotModel.REPLAY,
            on_demand_delay_s=(10.0, 10.0),
        ),
    )
    provider.start()
    refused = provider.request(1, "c5.xlarge", "spot")
    assert refused.granted == () and refused.failures[0].code == "InsufficientInstanceCapacity"
    assert refused.failures[0].attempts == 1
    (od,) = provider.request(1, "c5.xlarge", "on-demand").granted
    clock.set(9.0)
    provider.step()
    assert [r.state.value for r in provider.instances() if r.instance_id == od.instance_id] == [
        "pending"
    ]
    clock.set(10.0)
    provider.step()
    clock.set(60.0)
    provider.step()
    records = {r.instance_id: r for r in provider.instances()}
    assert records[od.instance_id].launch_s == 10.0 and od.instance_id.startswith("e-")
    assert sorted(i for i, r in records.items() if r.market.value == "spot") == ["i-0000", "i-0002"]
    assert (provider.preemptions, provider.allocations) == (0, 2)  # the addition and on-demand
    clock.set(120.0)
    provider.step()
    assert provider.done
    provider.close()
    spec = provider.catalog.get("c5.xlarge")
    bill = provider.bill()
    assert bill.usd_spot == pytest.approx((120.0 + 60.0) / 3600 * spec.spot_usd_per_hour)
    assert bill.usd_on_demand == pytest.approx(110.0 / 3600 * spec.on_demand_usd_per_hour)
