"""Every peer trains, and trains again after it loses an instance: each system of a regime run
on the regime's job at the most instances the regime's traces reach, one instance killed a
third into the window (after the notice lead), then checked for a step before the kill and a
step after it.

Usage: ``python -m bench peers-check [--regime data-parallel|pipeline] [--systems A,B]
[--window-s S] [--notice-lead S] [--work-dir DIR]``.

A system fails the check when it takes no step before the kill (it never trained) or none after
it (it did not come back); the line then says why, from its own logs
(:mod:`bench.peers_stops`). The window is wall seconds from the cloud's start, start-up
included (data-parallel 90 s: torchrun's 4 agents and 4 workers each import torch on two cores,
20-25 s before a step; pipeline 180 s: its 8 instances' first steps came at 20-45 s, after a
kill at 30 s none of the five systems had stepped, and a restart there takes a 30-s
process-group timeout and another start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from bench.peers_regime import REGIMES
from bench.peers_run import RunSettings, SystemRun
from bench.peers_stops import Stop
from bench.peers_systems import RUNNERS, run_system
from liveput.traces import Trace

CHECK_WINDOW_S = {"data-parallel": 90.0, "pipeline": 180.0}
"""Wall seconds each system runs in the check, by regime."""


def one_loss_trace(instances: int, window_s: float, time_scale: float) -> Trace:
    """``instances`` from the start, one lost a third into a window of ``window_s`` wall s."""
    span_s = window_s * time_scale
    return Trace.from_counts(
        f"one-loss-{instances}",
        np.array([0.0, span_s / 3]),
        np.array([instances, instances - 1]),
        span_s,
    )


def check(run: SystemRun | str, kill_s: float) -> tuple[bool, str]:
    """(passed, what happened) of one system's run with one kill at ``kill_s`` wall s.

    It trains again once its samples pass what it had reached by the kill and one median step
    gap after it: a step in flight when the kill came (the survivors' share of it) may still be
    written after the kill, and is not a restart."""
    if isinstance(run, str):
        return False, f"could not run: {run}"
    steps = run.steps()
    before = [t for t, _ in steps if t <= kill_s]
    why = "" if not run.stopped else f"; {Stop(**run.stopped).describe()}"
    if not before:
        return False, f"no step before the kill at {kill_s:.0f} s{why}"
    gaps = [b - a for a, b in zip(before, before[1:])]
    in_flight_s = kill_s + (statistics.median(gaps) if gaps else 0.0)
    reached = max(s for t, s in steps if t <= in_flight_s)
    after = [t for t, s in steps if t > in_flight_s and s > reached]
    if not after:
        return False, f"{len(before)} steps, none past them after the kill at {kill_s:.0f} s{why}"
    return True, (
        f"{len(before)} steps before the kill at {kill_s:.0f} s, past them again "
        f"{after[0] - kill_s:.1f} s after it ({len(after)} steps after)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench peers-check", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--regime", choices=sorted(REGIMES), default="data-parallel")
    parser.add_argument("--systems", default=None, help=f"comma-separated, of {', '.join(RUNNERS)}")
    parser.add_argument("--window-s", type=float, default=None, help="wall s per system")
    parser.add_argument("--notice-lead", type=float, default=RunSettings.notice_lead_s)
    parser.add_argument("--work-dir", default="", help="keep logs and checkpoints here")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv or [])
    regime = REGIMES[args.regime]
    systems = [s for s in (args.systems or ",".join(regime.systems)).split(",") if s]
    unknown = sorted(set(systems) - set(RUNNERS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(RUNNERS)}")
    window_s = args.window_s or CHECK_WINDOW_S[regime.name]
    settings = RunSettings(
        job=regime.job,
        time_scale=regime.time_scale,
        window_s=window_s,
        notice_margin_s=regime.notice_margin_s,
        notice_lead_s=args.notice_lead,
        work_dir=args.work_dir,
        instance_memory_gb=regime.instance_memory_gb,
        link_mbit=regime.link_mbit,
        object_store=regime.object_store,
    )
    trace = one_loss_trace(regime.workers, window_s, settings.time_scale)
    kill_s = window_s / 3
    print(
        f"{regime.name}: {regime.job} on {regime.workers} instances, one lost at "
        f"{kill_s:.0f} s of {window_s:.0f} s",
        flush=True,
    )
    results, failed = {}, 0
    for system in systems:
        run = run_system(system, trace, settings)
        passed, what = check(run, kill_s)
        failed += not passed
        results[system] = {
            "passed": passed,
            "what": what,
            # (wall s, samples) of each step: where it stopped and started again.
            "steps": [] if isinstance(run, str) else run.steps(),
        }
        print(f"  {system:<20}{'PASS' if passed else 'FAIL'}  {what}", flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"regime": regime.name, "systems": results}, indent=1) + "\n"
        )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
