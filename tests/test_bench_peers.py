"""Peers benchmark pieces: the torchrun peer resumes exactly; the JSON has its documented shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from bench.peers_ddp import DDPConfig, latest_checkpoint, train
from bench.peers_report import SYSTEMS, to_json_document
from bench.peers_run import RunSettings, SystemRun
from liveput.cloud.processes import command_launcher
from liveput.traces import Trace

JOB = "tiny-gpt-small"


@pytest.fixture
def world_of_one(tmp_path: Path, process_tier: None):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_ddp_peer_resumes_from_its_checkpoint_exactly(tmp_path: Path, world_of_one) -> None:
    straight = train(DDPConfig(str(tmp_path / "straight"), JOB, checkpoint_every=3, steps=10))
    # Killed after step 7 (steps 6 and 7 after the checkpoint at 6 are lost), then restarted.
    interrupted = tmp_path / "interrupted"
    train(DDPConfig(str(interrupted), JOB, checkpoint_every=3, steps=8))
    assert latest_checkpoint(interrupted).name == "step-0000000006.pt"
    progress = tmp_path / "progress.jsonl"
    resumed = train(
        DDPConfig(str(interrupted), JOB, checkpoint_every=3, steps=10, progress_file=str(progress))
    )
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert lines[0]["start"] == 6 and [r["step"] for r in lines[1:]] == [6, 7, 8, 9]
    # A run that restarted differs from one that did not resume (the check can fail).
    fresh = train(DDPConfig(str(tmp_path / "fresh"), JOB, checkpoint_every=3, steps=4))
    assert not all(
        torch.equal(a, b)
        for a, b in zip(straight.state_dict().values(), fresh.state_dict().values(), strict=True)
    )


def test_json_document_has_the_documented_shape() -> None:
    runs = {
        name: SystemRun(
            name, 160 * (i + 1), [(0.0, 0), (5.0, 160 * (i + 1))], [2.0], restarts=i, final_loss=3.0
        )
        for i, name in enumerate(SYSTEMS)
    }
    document = to_json_document(
        [("generated-4-seed20", runs, {"liveput": 700.0, "liveput-restart": 300.0})]
    )
    assert list(document) == ["traces"]
    (entry,) = document["traces"]
    assert entry["trace"] == "generated-4-seed20"
    assert list(entry["systems"]) == list(SYSTEMS)
    assert entry["systems"]["liveput"]["samples"] == 160
    assert entry["systems"]["torchrun"]["samples"] == 480
    assert entry["systems"]["torchrun"]["ratio_to_liveput"] == 3.0
    assert entry["simulated"] == {"liveput": 700, "liveput-restart": 300}
    json.dumps(document)  # plain JSON all through


def test_measured_table_puts_each_instance_count_at_its_measured_rate() -> None:
    """The simulator's throughput per instance count (bench peers, sim-to-real): the best
    configuration of ``n`` instances trains at the rate measured for ``n``, the others of ``n``
    keep their ratio to it, unmeasured counts and infeasible configurations are left alone."""
    import numpy as np

    from bench.peers_sim import measured_table
    from liveput.models.jobs import resolve_job
    from liveput.perf import estimate_configs
    from liveput.runtime.planning import profile_job

    table = estimate_configs(profile_job(resolve_job(JOB), repeats=1), 4)
    scaled = measured_table(table, {2: 90.0, 4: 95.0, 9: 50.0})
    used = table.data_parallel * table.pipeline_stages
    for count, rate in ((2, 90.0), (4, 95.0)):
        same = (used == count) & table.feasible
        assert scaled.samples_per_s[same].max() == pytest.approx(rate)
        np.testing.assert_allclose(
            scaled.samples_per_s[same] / rate,
            table.samples_per_s[same] / table.samples_per_s[same].max(),
        )
    untouched = ~np.isin(used, (2, 4)) | ~table.feasible
    np.testing.assert_array_equal(scaled.samples_per_s[untouched], table.samples_per_s[untouched])
    # Every count measured: the best of at most four instances is the best measured count.
    every = measured_table(table, {1: 55.0, 2: 97.0, 3: 92.0, 4: 88.0})
    assert every.best_for(4)[2] == pytest.approx(97.0)
    assert (every.best_for(4)[0] * every.best_for(4)[1]) == 2


def test_upper_bound_against_a_count_of_each_second() -> None:
    """The bound of bench peers: every instance present in an interval (ready its start-up
    after it came) trains at the best measured rate of at most that many; here against a
    direct sum over the trace's wall seconds."""
    import numpy as np

    from bench.peers_sim import upper_bound
    from liveput.traces import Trace

    rates = {1: 60.0, 2: 100.0, 3: 80.0, 4: 79.0}
    # 2 instances from 0 s, +2 at 20 s, -3 at 40 s, 0 from 50 to 70 s, +1 at 70 s (trace s).
    trace = Trace.from_counts(
        "t", np.array([0.0, 20.0, 40.0, 50.0, 70.0]), np.array([2, 4, 1, 0, 1]), 100.0
    )
    bound = upper_bound(trace, startup_s=2.0, samples_per_s_by_count=rates, time_scale=2.0)
    # Wall seconds at time scale 2: 2 ready from 2 s; 4 from 12 s; 1 from 20 s; 0 from 25 s;
    # 1 ready from 37 s (35 + 2 of start-up); the window ends at 50 s. The best of at most
    # 3 or 4 instances is 2's rate.
    expected = 10 * 100 + 8 * 100 + 5 * 60 + 13 * 60
    # An interval's arrivals count from its start (1 wall s here: the 2-s trace resolution),
    # so that it is never below: the first two arrive in [1, 2) s (one more second at 100),
    # the last in [36, 37) s (one more at 60); the +2 at 11 s adds nothing (2's rate is the
    # best of at most 4).
    assert bound == pytest.approx(expected + 100 + 60)
    assert upper_bound(trace, 2.0, {}, 2.0) == 0.0


def test_any_trace_is_cut_and_rescaled_to_the_benchmarks_instances(tmp_path: Path) -> None:
    import numpy as np

    from bench.bench_peers import main
    from bench.peers_regime import DATA_PARALLEL
    from bench.peers_traces import p3_cut, user_traces
    from liveput.traces import Trace, write_trace

    workers = DATA_PARALLEL.workers

    # The real p3 cut the benchmark runs: its 4 preemption events in 5 minutes, kept.
    p3 = p3_cut(workers)
    assert p3.initial_count == workers and list(p3.times_s) == [30.0, 150.0, 210.0, 270.0]
    assert list(p3.removed) == [1, 1, 1, 1]
    # A 16-instance trace of the user's: halved losses never vanish, the span is cut.
    own = Trace.from_counts(
        "own", np.array([0.0, 60.0, 120.0, 500.0]), np.array([16, 15, 8, 16]), 900.0
    )
    write_trace(own, tmp_path / "own.csv")
    [(name, cut)] = user_traces([str(tmp_path / "own.csv")], 0.0, 300.0, workers)
    assert name == "own" and cut.end_s == 300.0 and cut.initial_count == workers
    assert [cut.count_at(t) for t in (30.0, 90.0, 200.0)] == [4, 3, 1]
    with pytest.raises(SystemExit, match="--trace .*missing.csv: no such file"):
        main(["--trace", str(tmp_path / "missing.csv")])


def test_events_are_grouped_kills_and_arrivals_told_apart_by_what_is_left() -> None:
    from bench.peers_events import Event, trace_events

    # 2 instances: one lost; one added; both lost at once (0.3 s apart); one back, then another.
    events = trace_events(2, [10.0, 30.0, 30.3], [20.0, 40.0, 41.0])
    assert events == [
        Event("loss", 10.0),
        Event("arrival", 20.0),
        Event("total-loss", 30.0, back_s=40.0),
        Event("arrival", 41.0),
    ]
    # Kills 1 s apart are two events; a launch at a kill's moment comes after it.
    assert [e.kind for e in trace_events(3, [5.0, 6.0], [])] == ["loss", "loss"]
    assert trace_events(1, [5.0], [5.0]) == [Event("total-loss", 5.0, back_s=5.0)]
    assert trace_events(1, [5.0], []) == [Event("total-loss", 5.0, back_s=None)]


def test_downtime_per_event_kind_against_a_hand_made_timeline() -> None:
    from bench.peers_events import Event, by_kind, event_downtimes

    events = [
        Event("loss", 10.0),
        Event("arrival", 20.0),
        Event("total-loss", 30.0, back_s=40.0),
        Event("arrival", 50.0),
    ]
    # A step (10 samples) every second, sampled twice a second as liveput's ticks are.
    steps = (
        [(t, 10 * t) for t in range(1, 10)]  # steps at 1..9
        + [(t, 10 * (t - 4)) for t in range(13, 20)]  # again at 13 where it was: past 90 at 14
        + [(t, 10 * (t - 4)) for t in range(20, 31)]
        + [(41, 220)]  # one back at 40; restored at 41 (behind where it was)
        + [(t, 10 * (t - 20)) for t in range(43, 50)]  # trains again at 43
        + [(t, 10 * (t - 20)) for t in (50, 51, 55, 56, 57)]  # the arrival stops it 4 s
    )
    timeline = [(0.0, 0)]
    for t, samples in steps:
        timeline += [(t - 0.5, timeline[-1][1]), (float(t), samples)]
    downtimes = event_downtimes(events, timeline, end_s=58.0)
    assert downtimes == [14.0 - 9.0, 1.0, 43.0 - 40.0, 55.0 - 51.0]
    kinds = by_kind(events, downtimes)
    assert kinds["loss"] == {"events": 1, "median_s": 5.0, "p95_s": 5.0, "each_s": [5.0]}
    assert kinds["arrival"]["median_s"] == 2.5 and kinds["arrival"]["each_s"] == [1.0, 4.0]
    assert kinds["total-loss"]["each_s"] == [3.0]
    # Before the first step is start-up, not an event's downtime; nothing is measured without
    # steps, or after a total loss no instance came back from.
    assert event_downtimes([Event("loss", 0.5)], timeline, 58.0) == [None]
    assert event_downtimes(events, [(0.0, 0)], 58.0) == [None] * 4
    assert event_downtimes([Event("total-loss", 10.0)], timeline, 58.0) == [None]


def test_the_table_puts_each_systems_downtime_per_event_kind_side_by_side() -> None:
    from bench.peers_report import table

    def run(name: str, resumed_s: float) -> SystemRun:
        timeline = [(0.0, 0), (1.0, 10), (2.0, 20), (resumed_s, 30), (resumed_s + 1, 40)]
        return SystemRun(name, 40, timeline, [2.5], initial_instances=2)

    document = to_json_document(
        [("t", {"liveput": run("liveput", 4.0), "torchft": run("torchft", 6.0)}, {})]
    )
    figures = document["traces"][0]["systems"]
    assert figures["liveput"]["downtime_by_event_kind"]["loss"]["median_s"] == 2.0
    assert figures["torchft"]["downtime_by_event_kind"]["loss"]["median_s"] == 4.0
    lines = table(document).splitlines()
    assert lines[-2].split() == ["kind", "liveput", "torchft"]
    assert lines[-1].split() == ["loss", "2.0", "/", "2.0", "(1)", "4.0", "/", "4.0", "(1)"]


def test_a_sharded_peer_waits_for_the_fewest_instances_its_shards_fit() -> None:
    import random

    from bench.peers_regime import BYTES_PER_PARAMETER, sharded_minimum

    rng = random.Random(7)
    for _ in range(200):
        parameters = rng.randrange(1, 10**9)
        memory_gb = rng.uniform(0.01, 20.0)
        fewest = next(
            n for n in range(1, 10**6) if parameters * BYTES_PER_PARAMETER / n <= memory_gb * 1e9
        )
        assert sharded_minimum(parameters, memory_gb) == fewest
    assert sharded_minimum(86_000_000, None) == 1
    # gpt2-small's 86 M parameters (1.38 GB of state) on 0.9-GB instances: two.
    assert sharded_minimum(86_000_000, 0.9) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--regime", "pipeline", "--link-mbit", "0"], "--link-mbit must be > 0"),
        (["--regime", "sharded"], "invalid choice: 'sharded'"),
        (["--regime", "pipeline", "--systems", "liveput,fsdp"], "unknown systems ['fsdp']"),
    ],
)
def test_bad_benchmark_options_are_one_line_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.bench_peers import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_run_settings_refuse_a_memory_budget_or_link_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="memory and link rate must be positive"):
        RunSettings(instance_memory_gb=0.0)
    with pytest.raises(ValueError, match="memory and link rate must be positive"):
        RunSettings(link_mbit=-5.0)
    assert RunSettings(instance_memory_gb=0.9, link_mbit=50.0).link_mbit == 50.0
    # A run told to stop at a step before its first checkpoint could never stop.
    with pytest.raises(ValueError, match="a step to stop at >= the checkpoint interval"):
        RunSettings(checkpoint_every=4, stop_at_step=3)
    assert RunSettings(checkpoint_every=4, stop_at_step=4).stop_at_step == 4


def test_a_peers_progress_counts_the_steps_its_lines_say_it_committed(tmp_path: Path) -> None:
    from bench.peers_run import reached, steps_in

    progress = tmp_path / "progress.jsonl"
    assert steps_in(progress) == 0  # no line yet
    progress.write_text(
        '{"t": 1.0, "start": 0, "world": 2, "restart": 0}\n'
        '{"t": 2.0, "step": 0, "world": 2, "loss": 3.0}\n'
        '{"t": 3.0, "step": 1, "world": 2, "loss": 2.9}\n'
        '{"t": 4.0, "st'  # a line being written
    )
    assert steps_in(progress) == 2
    settings = RunSettings(checkpoint_every=2, stop_at_step=2)
    assert reached(settings, 2) and not reached(settings, 1)
    assert not reached(RunSettings(), 10**6)  # no step to stop at: the whole window


def test_agents_started_elsewhere_are_not_forked_here() -> None:
    from liveput.launch.local import LocalTrainingConfig, run_local_training

    with pytest.raises(ValueError, match="launcher_factory starts agents without forks"):
        run_local_training(
            LocalTrainingConfig(fork_agents=True),
            Trace("constant", 1, [], [], [], 60.0),
            launcher_factory=lambda template, env, log_dir: None,  # type: ignore[arg-type,return-value]
        )


def test_unmeasured_instance_counts_lie_on_the_line_between_measured_ones() -> None:
    from bench.peers_regime import interpolated

    rates = interpolated({3: 1.0, 8: 2.0}, range(2, 10))
    assert sorted(rates) == [3, 4, 5, 6, 7, 8]  # none below or above what was measured
    assert rates[3] == 1.0 and rates[8] == 2.0
    assert [round(rates[n], 6) for n in (4, 5, 6, 7)] == [1.2, 1.4, 1.6, 1.8]
    assert interpolated({4: 3.0}, range(1, 5)) == {4: 3.0}


def test_a_systems_scratch_is_removed_after_its_run_unless_a_work_dir_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run's logs and checkpoints go to a scratch folder: without ``--work-dir`` it is
    removed once the run is read (also when the system failed); with it, it stays there."""
    import tempfile

    from bench import peers_systems

    seen: list[Path] = []

    def writes(trace: Trace, settings: RunSettings, work: Path) -> str:
        (work / "checkpoint.pt").write_bytes(b"x" * 1024)
        seen.append(work)
        if settings.seed == 1:
            raise RuntimeError("the system broke")
        return "ran"

    monkeypatch.setitem(peers_systems.RUNNERS, "liveput", writes)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    trace = Trace.from_counts("t", [0.0], [1], end_s=10.0)
    assert peers_systems.run_system("liveput", trace, RunSettings()) == "ran"
    broke = peers_systems.run_system("liveput", trace, RunSettings(seed=1))
    assert isinstance(broke, str) and broke.startswith("RuntimeError")
    kept = RunSettings(work_dir=str(tmp_path / "kept"))
    assert peers_systems.run_system("liveput", trace, kept) == "ran"
    assert [path.exists() for path in seen] == [False, False, True]
    assert seen[2].parent == tmp_path / "kept" and (seen[2] / "checkpoint.pt").is_file()


def test_ddp_peer_saves_once_at_the_step_after_its_notice(
    tmp_path: Path, world_of_one, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun-notice: the instance's notice file is there from the start, so the first step
    boundary saves (step 1), and only it: K = 10 is never reached in 3 steps."""
    notice = tmp_path / "notice.json"
    notice.write_text("{}")
    monkeypatch.setenv("LIVEPUT_NOTICE_FILE", str(notice))
    noticed = tmp_path / "noticed"
    train(DDPConfig(str(noticed), JOB, checkpoint_every=10, steps=3, checkpoint_on_notice=True))
    assert [p.name for p in noticed.iterdir()] == ["step-0000000001.pt"]
    plain = tmp_path / "plain"
    train(DDPConfig(str(plain), JOB, checkpoint_every=10, steps=3))
    assert list(plain.iterdir()) == []


def test_the_loss_signal_delay_is_trace_seconds_or_none_and_never_negative(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.bench_peers import build_parser

    parser = build_parser()
    assert parser.parse_args(["--loss-signal-delay", "none"]).loss_signal_delay is None
    assert parser.parse_args(["--loss-signal-delay", "30"]).loss_signal_delay == 30.0
    assert parser.parse_args([]).loss_signal_delay == RunSettings.loss_signal_delay_s
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--loss-signal-delay", "-1"])
    assert exit_info.value.code == 2
    assert "must be >= 0 s or none" in capsys.readouterr().err
    with pytest.raises(ValueError, match="loss signal delay must be >= 0 s or none"):
        RunSettings(loss_signal_delay_s=-0.5)
    assert RunSettings(loss_signal_delay_s=None).loss_signal_delay_s is None


def test_every_system_meets_the_same_delayed_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import peers_run

    settings = RunSettings(loss_signal_delay_s=12.0)
    trace = Trace("constant", 2, [], [], [], 60.0)
    cloud = peers_run.replayed_cloud(trace, command_launcher(["true"]), tmp_path, settings)
    assert cloud.config.loss_signal_delay_s == 12.0
    told: list[float | None] = []
    monkeypatch.setattr(
        peers_run,
        "run_local_training",
        lambda config, *_, **__: told.append(config.loss_signal_delay_s),
    )
    peers_run._train_liveput(
        trace, settings, tmp_path, str(tmp_path), "liveput", lambda _: None, 2, None, None
    )
    assert told == [12.0]
