"""A peer that trained nothing, or stopped before its window's end, is reported with what its
own logs and progress say, and a run that trained to the end is not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.peers_report import HUNG_S, MIN_STEPS, table, to_json_document, verdicts
from bench.peers_run import RunSettings, SystemRun
from bench.peers_stops import Stop, last_error, stop_of
from liveput.traces import Trace

SETTINGS = RunSettings(window_s=100.0, time_scale=2.0)
# 4 instances; 3 lost at 60 trace s (30 wall s); all lost at 150 (75 wall s), none after.
TRACE = Trace.from_counts("t", np.array([0.0, 60.0, 150.0]), np.array([4, 1, 0]), 200.0)


def _steps(until_s: float) -> list[tuple[float, int]]:
    return [(0.0, 0)] + [(float(t), 16 * t) for t in range(1, int(until_s) + 1)]


def test_a_run_that_trains_to_the_end_did_not_stop(tmp_path: Path) -> None:
    run = SystemRun("torchrun", 1_600, _steps(95), [30.0])
    assert stop_of(run, TRACE, SETTINGS, tmp_path) is None


def test_a_stop_gives_the_last_step_restarts_and_the_last_error_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "i-0000.log").write_text("step 1\nRuntimeError: older\nstep 2\n")
    (logs / "i-0003.log").write_text(
        "starting\n[E] gloo: connectFullMesh failed: Connection refused\nwaiting\n"
    )
    run = SystemRun("torchrun", 320, _steps(20), [30.0], restarts=3)
    stop = stop_of(run, TRACE, SETTINGS, logs)
    assert stop == Stop(
        last_step_s=20.0,
        restarts=3,
        last_error="i-0003.log: [E] gloo: connectFullMesh failed: Connection refused",
        instances_after=4,
        held_after_s=55.0,
    )
    described = stop.describe()
    assert "no step after 20 s (up to 4 instance(s) held after it, at most 55 s on end" in described
    # Shown in the table and the JSON.
    run.stopped = stop.as_json()
    document = to_json_document([("t", {"torchrun": run}, {})])
    assert document["traces"][0]["systems"]["torchrun"]["stopped"]["restarts"] == 3
    assert "torchrun stopped: no step after 20 s" in table(document)


def test_never_trained_and_the_traces_own_gap(tmp_path: Path) -> None:
    never = stop_of(SystemRun("torchft", 0, [(0.0, 0)], []), TRACE, SETTINGS, tmp_path)
    assert never is not None and never.last_step_s is None and never.last_error is None
    assert never.describe().startswith("never trained")
    # Steps until the trace's last instance went at 75 wall s: nothing held after 80.
    gap = stop_of(SystemRun("liveput", 0, _steps(80), []), TRACE, SETTINGS, tmp_path)
    assert gap is not None and (gap.instances_after, gap.held_after_s) == (0, 0.0)


def test_no_error_line_is_none(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_text(
        "all well\n"
        "2026-12-07T05:08:44.905 [INFO] [torchft::lighthouse] - waiting due to join timeout\n"
    )
    assert last_error(tmp_path) is None
    assert last_error(tmp_path / "missing") is None


def test_repeated_runs_give_the_median_its_spread_and_every_run() -> None:
    """Three runs per system: ``samples`` is the median, the spread and each run are kept,
    and the ratio divides medians; a run that could not run counts below every run that did."""

    def run(system: str, samples: int) -> SystemRun:
        return SystemRun(system, samples, [(0.0, 0), (10.0, samples)], [])

    document = to_json_document(
        [
            (
                "t",
                {
                    "liveput": [run("liveput", 900), run("liveput", 700), run("liveput", 800)],
                    "torchft": [run("torchft", 500), "RuntimeError: boom", run("torchft", 300)],
                },
                {},
            )
        ]
    )
    systems = document["traces"][0]["systems"]
    assert systems["liveput"]["samples"] == 800
    assert (systems["liveput"]["samples_min"], systems["liveput"]["samples_max"]) == (700, 900)
    assert [r["samples"] for r in systems["liveput"]["runs"]] == [900, 700, 800]
    assert systems["torchft"]["samples"] == 300 and systems["torchft"]["samples_min"] == 0
    assert systems["torchft"]["runs"][1] == {"samples": None, "error": "RuntimeError: boom"}
    assert systems["torchft"]["ratio_to_liveput"] == 0.375
    assert "700-900" in table(document)


def test_every_system_checkpoints_at_the_same_wall_interval() -> None:
    from bench.bench_peers import build_parser, steps_between_checkpoints

    # tiny-gpt (a batch of 16) at 96 samples/s: 2 s are 12 steps; a 10-s step checkpoints
    # every step at 5 s; an unmeasured rate keeps the 10 steps every system had.
    assert steps_between_checkpoints(2.0, 96.0, 16) == 12
    assert steps_between_checkpoints(5.0, 0.8, 8) == 1
    assert steps_between_checkpoints(2.0, None, 16) == RunSettings.checkpoint_every
    args = build_parser().parse_args(["--checkpoint-every-s", "30", "--repeats", "3"])
    assert (args.checkpoint_every_s, args.repeats) == (30.0, 3)


def test_no_ratio_is_drawn_from_a_run_that_crashed_or_hung() -> None:
    from bench.peers_report import broken

    hung = Stop(20.0, 0, "i-0001.log: failed (exitcode: 1)", 3, HUNG_S).as_json()
    slow = Stop(20.0, 1, None, 1, HUNG_S - 1).as_json()
    assert broken({"samples": 0}) == "trained nothing"
    assert broken({"samples": 400, "stopped": hung}).startswith("stopped: no step after 20 s")
    assert broken({"samples": 400, "stopped": slow}) == ""  # restarting slower than the gap
    assert broken({"samples": 400, "stopped": None}) == ""


def test_verdicts_pass_fail_and_withhold_a_ratio_to_a_broken_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    hung = {
        "last_step_s": 20.0,
        "restarts": 3,
        "last_error": "connectFullMesh failed",
        "instances_after": 2,
        "held_after_s": HUNG_S + 1,
    }
    document = {
        "traces": [
            {
                "trace": "t",
                "systems": {
                    "liveput": {"samples": 300},
                    "torchft": {"samples": 200},
                    "torchrun": {"samples": 250},
                    "torchrun-notice": {"samples": 100, "stopped": hung},
                },
                "simulated": {"liveput": 320},
                "bound_samples": 350,
            }
        ]
    }
    verdicts(document, (("torchft", 1.2), ("torchrun", 1.5), ("torchrun-notice", 2.0)))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "t: liveput / torchft = 1.50 (target >= 1.2): PASS"
    assert lines[1].startswith("t: liveput / torchrun = 1.20 (target >= 1.5): FAIL")
    assert "out of reach here" in lines[1]  # 1.5 x 250 > the bound of 350
    assert lines[2].startswith("t: liveput / torchrun-notice: NO VERDICT, torchrun-notice stopped")
    assert lines[3] == (
        "t: simulator / runtime for liveput = 320 / 300 (+7 %, target within 10 %): PASS"
    )


def test_the_table_names_systems_short_of_fifty_steps_in_a_window() -> None:
    def run(name: str, steps: int) -> SystemRun:
        timeline = [(float(i), 16 * i) for i in range(steps + 1)]
        return SystemRun(name, 16 * steps, timeline, [])

    runs = {
        "liveput": [run("liveput", 80), run("liveput", 90)],
        "torchrun": [run("torchrun", 60), run("torchrun", MIN_STEPS - 3)],
    }
    document = to_json_document([("t", runs, {})])
    assert [r["steps"] for r in document["traces"][0]["systems"]["torchrun"]["runs"]] == [60, 47]
    lines = [line for line in table(document).splitlines() if "fewer than" in line]
    assert lines == [
        f"  fewer than {MIN_STEPS} steps in a run's window (one step either way moves a ratio): "
        "torchrun 47"
    ]


def test_a_trace_short_of_what_the_system_trains_on_is_not_held(tmp_path: Path) -> None:
    """A pipeline of 4 stages that stops when the trace falls to 1 instance: only the 10 wall
    s it kept 4 after its last step count as held."""
    run = SystemRun("liveput", 320, _steps(20), [30.0])
    stop = stop_of(run, TRACE, SETTINGS, tmp_path, fewest=4)
    assert stop is not None and (stop.instances_after, stop.held_after_s) == (4, 10.0)
    assert "at most 10 s on end with the 4 it needs" in stop.describe()
    # One instance is enough for a data-parallel peer: 55 s held.
    assert stop_of(run, TRACE, SETTINGS, tmp_path).held_after_s == 55.0  # type: ignore[union-attr]


def test_a_rate_runs_from_the_first_step_whatever_the_start_up() -> None:
    """16 samples a second once training: a 20-s start-up in a 30-s run leaves it at 16, where
    a rate after a third of the run gave 8."""
    steps = [(float(t), 16 * (t - 20)) for t in range(21, 31)]
    run = SystemRun("liveput", 160, [(0.0, 0), (10.0, 0), (20.0, 0), *steps], [])
    assert run.rate() == pytest.approx(16.0)
    assert SystemRun("liveput", 0, [(0.0, 0), (30.0, 0)], []).rate() == 0.0


def test_restarts_count_the_worker_exits_a_torchrun_agent_logged(tmp_path: Path) -> None:
    """A group that failed twice after its last step wrote no progress of it: the agents' logs
    say so."""
    exit_line = (
        "E1207 08:00:47.042000 16495 .venv/lib/python3.11/site-packages/torch/distributed/"
        "elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 16514)\n"
    )
    (tmp_path / "i-0001.log").write_text(exit_line * 2)
    (tmp_path / "i-0004.log").write_text(exit_line)
    run = SystemRun("torchrun-pp", 320, _steps(20), [30.0], restarts=0)
    stop = stop_of(run, TRACE, SETTINGS, tmp_path)
    assert stop is not None and stop.restarts == 2
    assert "2 restarts" in stop.describe()
