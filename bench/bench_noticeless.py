"""Losses without a notice: ``liveput train`` (real agent processes, the emulated cloud) on
traces of single, double and back-to-back losses, a wipe-out and arrivals, with
``--notice-lead 0`` and with the default 120-s lead.

Prints per trace and lead: runs completed exactly once, wall seconds; and per unannounced loss the
downtime (last commit before the kill to the first commit after), by kind: a replica lost (its
layers live on elsewhere), the last holder of a layer lost (the checkpoint restores it), all lost
(the job waits for new instances; not held to the target).

Targets: every run completes exactly once; downtime median < 5 s and p95 < 10 s for the
first two kinds; wall time with no notice within 1.5x of the run with the default notice.

``python -m bench noticeless`` runs 10 runs of each (about an hour on 2 cores);
``LIVEPUT_BENCH_RUNS=2`` (or ``--runs 2``) runs fewer; ``--traces wipe-out --leads 120`` runs only
the noticed wipe-out (its figure is the steps rolled back: redone after the restore).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from liveput.launch.local import LocalTrainingConfig, run_local_training
from liveput.traces import Trace

STEPS = 120
TIME_SCALE = 10.0
WORKERS = 6
FAILED_LOGS = "liveput-logs/bench-noticeless-failed"
"""Where the agents' logs of a run that failed are kept (the rest live in temporary folders)."""
LOGGERS = ("liveput.cloud.provider", "liveput.runtime.coordinator")
"""The in-process loggers the bench reads (kills, plans) and keeps with each run's logs."""


def _trace(
    name: str, initial: int, events: list[tuple[float, int, int]], end_s: float = 600.0
) -> Trace:
    """``events``: (trace second, added, removed)."""
    times, added, removed = zip(*events, strict=True)
    return Trace(
        name,
        initial,
        np.array(times, dtype=float),
        np.array(added, dtype=np.int64),
        np.array(removed, dtype=np.int64),
        end_s,
    )


TRACES = {
    "single-double": _trace("single-double", 6, [(150, 0, 1), (260, 0, 2), (330, 2, 0)]),
    "back-to-back": _trace(
        "back-to-back", 6, [(120, 0, 1), (135, 0, 1), (200, 3, 0), (212, 0, 2), (300, 0, 1)]
    ),
    "wipe-out": _trace("wipe-out", 4, [(150, 0, 4), (200, 3, 0), (300, 0, 1), (340, 2, 0)]),
}


class _Records(logging.Handler):
    """Kill and plan times, from the runtime's own log records (``record.created``: unix s)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kills: list[float] = []
        self.plans: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("emulated preempt "):
            self.kills.append(record.created)
        match = re.match(r"plan \d+ \((\w+)\): ([\w-]+) ", message)
        if match:
            self.plans.append((record.created, match.group(2)))


def _losses(records: _Records, commits: list[float], trace: Trace) -> list[tuple[str, float]]:
    """(kind, downtime s) of each group of kills (kills within 1 s are one loss)."""
    groups: list[list[float]] = []
    for kill in sorted(records.kills):
        if groups and kill - groups[-1][-1] < 1.0:
            groups[-1].append(kill)
        else:
            groups.append([kill])
    losses = []
    # (trace second, added, removed) in order: instances left after the n-th removal.
    schedule = sorted(zip(trace.times_s, trace.added, trace.removed, strict=True))
    removed_at = [t for t, _, r in schedule for _ in range(r)]
    killed = 0
    for group in groups:
        killed += len(group)
        before = [c for c in commits if c <= group[0]]
        after = [c for c in commits if c > group[0]]
        if not before or not after:
            continue
        last_removal_s = removed_at[min(killed, len(removed_at)) - 1]
        alive = trace.initial_count + sum(a - r for t, a, r in schedule if t <= last_removal_s)
        next_plan = next((kind for t, kind in records.plans if t > group[0]), "none")
        kind = (
            "all lost"
            if alive <= 0
            else "last holder lost"
            if next_plan == "checkpoint-restore"
            else "replica lost"
        )
        losses.append((kind, after[0] - before[-1]))
    return losses


def _run(trace: Trace, lead_s: float, seed: int, records: _Records) -> dict:
    records.kills.clear()
    records.plans.clear()
    with tempfile.TemporaryDirectory(prefix="bench-noticeless-") as directory:
        config = LocalTrainingConfig(
            model="tiny-gpt",
            workers=WORKERS,
            steps=STEPS,
            time_scale=TIME_SCALE,
            notice_lead_s=lead_s,
            checkpoint_dir=f"{directory}/ckpt",
            checkpoint_every=10,
            timeout_s=600.0,
            seed=seed,
            log_dir=f"{directory}/logs",
        )
        started = time.monotonic()
        Path(f"{directory}/logs").mkdir()
        runtime_log = logging.FileHandler(f"{directory}/logs/coordinator-and-cloud.log")
        runtime_log.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        for name in LOGGERS:
            logging.getLogger(name).addHandler(runtime_log)
        try:
            result = run_local_training(config, trace)
        except Exception as error:  # noqa: BLE001 - a run that fails is counted, not fatal
            # The agents' logs outlive the temporary folder, to find out why.
            kept = Path(FAILED_LOGS) / f"{trace.name}-lead{lead_s:g}-seed{seed}"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(f"{directory}/logs", kept, dirs_exist_ok=True)
            return {
                "ok": False,
                "wall_s": time.monotonic() - started,
                "error": f"{str(error)[:200]} (logs kept in {kept})",
                "losses": [],
            }
        finally:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(runtime_log)
            runtime_log.close()
    commits = sorted(r["committed_unix_s"] for r in result.steps)
    return {
        "ok": result.steps_completed == STEPS and result.exactly_once,
        "wall_s": result.wall_s,
        "losses": _losses(records, commits, trace),
        "rolled_back": result.steps_rolled_back,
    }


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench noticeless", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=int(os.environ.get("LIVEPUT_BENCH_RUNS", "10")),
        help="per trace and lead",
    )
    parser.add_argument("--traces", default=",".join(TRACES), help="comma-separated trace names")
    parser.add_argument(
        "--leads", default="0,120", help="comma-separated notice leads, trace seconds"
    )
    args = parser.parse_args(argv or [])
    names = [n for n in args.traces.split(",") if n]
    unknown = sorted(set(names) - set(TRACES))
    if unknown or not names or args.runs < 1:
        parser.error(f"--traces: one or more of {', '.join(TRACES)}; --runs >= 1")
    leads = [float(lead) for lead in args.leads.split(",") if lead]
    runs = args.runs
    records = _Records()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(records)
    print(
        f"{runs} runs per trace and lead; tiny-gpt, {STEPS} steps, {WORKERS} workers, "
        f"time scale {TIME_SCALE:g}",
        flush=True,
    )
    by_kind: dict[str, list[float]] = {}
    walls: dict[float, list[float]] = {lead_s: [] for lead_s in leads}
    for name in names:
        trace = TRACES[name]
        for lead_s in leads:
            outcomes = [_run(trace, lead_s, seed, records) for seed in range(runs)]
            done = sum(o["ok"] for o in outcomes)
            wall = [o["wall_s"] for o in outcomes]
            walls[lead_s] += wall
            print(
                f"{name:14s} lead {lead_s:5.0f} s: {done}/{runs} complete exactly once; wall "
                f"median {statistics.median(wall):.1f} s (max {max(wall):.1f}); rolled back "
                f"{sum(o.get('rolled_back', 0) for o in outcomes)} steps in all "
                f"({', '.join(str(o.get('rolled_back', '-')) for o in outcomes)})"
                + "".join(f"; failed: {o['error']}" for o in outcomes if "error" in o),
                flush=True,
            )
            if lead_s == 0.0:
                for kind, downtime in (loss for o in outcomes for loss in o["losses"]):
                    by_kind.setdefault(kind, []).append(downtime)
    print("downtime per unannounced loss (last commit before the kill -> first after):", flush=True)
    for kind, values in sorted(by_kind.items()):
        median, p95 = _percentile(values, 50), _percentile(values, 95)
        target = (
            ""
            if kind == "all lost"
            else f"  (targets 5 / 10 s: {median / 5:.2f}x / {p95 / 10:.2f}x)"
        )
        print(
            f"  {kind:17s} n={len(values):3d} median {median:5.2f} s  p95 {p95:5.2f} s{target}",
            flush=True,
        )
    if walls.get(0.0) and walls.get(120.0):
        ratio = statistics.median(walls[0.0]) / statistics.median(walls[120.0])
        print(f"wall time, no notice / default notice: {ratio:.2f}x (target <= 1.5x)", flush=True)
