"""Why a system of ``bench peers`` trained nothing, or stopped before its window ended: read
from that system's own logs and progress, never guessed.

A run *stopped* when its last step came more than :data:`STALL_S` (or five of its median step
gaps, whichever is longer) before the window's end. The reason given is what the run itself
left: the worker-group starts it counted, the last line of its logs that reads as an error (the
most recently written log that has one), and how many instances the trace held while it did
not train (fewer than the system trains on: the trace's gap, not the system's stop).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.peers_run import RunSettings, SystemRun
from liveput.traces import Trace

STALL_S = 10.0
"""Least wall seconds without a step before the window's end that count as a stop."""

ERROR_LINE = re.compile(
    r"error|exception|traceback|failed|refused|timed out|timeout|killed|abort", re.IGNORECASE
)
"""A log line that reads as an error (torch's, gloo's, torchft's, liveput's)."""

NOT_AN_ERROR = re.compile(r"\[INFO\]|\bINFO\b|\bDEBUG\b|^I\d{4} ")
"""A line logged at info or debug level (torchft's lighthouse reports its join timeout so;
torch's glog-style ``I1207 ...`` lines), whatever words it holds."""

WORKER_EXIT = re.compile(r"elastic/multiprocessing/api\.py:\d+\] failed \(exitcode")
"""torchrun's agent on a worker that exited with an error: the group restarts after it."""

MAX_LINE_CHARS = 240


@dataclass(frozen=True)
class Stop:
    """How a run ended short of its window (``stopped`` in the ``--json`` document)."""

    last_step_s: float | None
    """Wall seconds from the cloud's start to its last step (None: it never trained)."""
    restarts: int
    """Worker-group restarts or migrations it counted (its own progress), or the worker exits
    one torchrun agent logged where those are more (a group that fails again before its first
    step writes no progress)."""
    last_error: str | None
    """``<log file>: <line>``, the last error line of its most recently written log that has
    one (None: its logs have none)."""
    instances_after: int
    """Most instances the trace held after its last step, to the window's end (0: no instance
    to train on, so the stop is the trace's)."""
    held_after_s: float
    """Longest stretch (wall s) after its last step in which the trace held as many instances
    as the system trains on (``fewest_instances``): a system that restarts slower than this
    could not train again; one that stops with a long stretch held hung or crashed."""
    fewest_instances: int = 1
    """The fewest instances the system trains the job on (a pipeline's stages, a sharded
    job's shards): fewer held is the trace's gap, not the system's stop."""

    def as_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        when = (
            "never trained"
            if self.last_step_s is None
            else f"no step after {self.last_step_s:.0f} s"
        )
        needs = f" with the {self.fewest_instances} it needs" if self.fewest_instances > 1 else ""
        held = (
            f"up to {self.instances_after} instance(s) held after it, at most "
            f"{self.held_after_s:.0f} s on end{needs}"
        )
        error = f"; last error: {self.last_error}" if self.last_error else "; no error in its logs"
        return f"{when} ({held}, {self.restarts} restarts){error}"


def stop_of(
    run: SystemRun, trace: Trace, settings: RunSettings, logs: Path, fewest: int = 1
) -> Stop | None:
    """The run's :class:`Stop`, or None when it trained to its window's end (``fewest``: the
    fewest instances the system trains on)."""
    steps = [t for t, _ in run.steps()]
    if steps:
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        stall_s = max(STALL_S, 5 * statistics.median(gaps)) if gaps else STALL_S
        if settings.window_s - steps[-1] <= stall_s:
            return None
    last = steps[-1] if steps else None
    return Stop(
        last_step_s=None if last is None else round(last, 2),
        restarts=max(run.restarts, worker_exits(logs)),
        last_error=last_error(logs),
        fewest_instances=fewest,
        **_held_after(trace, (last or 0.0) * settings.time_scale, settings, fewest),
    )


def last_error(logs: Path) -> str | None:
    """``<file>: <line>``: the last error line of the most recently written log under ``logs``
    that has one."""
    if not logs.is_dir():
        return None
    files = sorted(
        (p for p in logs.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        for line in reversed(lines):
            if ERROR_LINE.search(line) and not NOT_AN_ERROR.search(line):
                return f"{path.relative_to(logs)}: {line.strip()[:MAX_LINE_CHARS]}"
    return None


def worker_exits(logs: Path) -> int:
    """The most worker exits one torchrun agent logged under ``logs`` (0: none, or not
    torchrun)."""
    if not logs.is_dir():
        return 0
    return max(
        (
            len(WORKER_EXIT.findall(p.read_text(errors="replace")))
            for p in logs.rglob("*")
            if p.is_file()
        ),
        default=0,
    )


def _held_after(trace: Trace, from_s: float, settings: RunSettings, fewest: int) -> dict:
    """``instances_after`` and ``held_after_s`` (stretches of ``fewest`` instances or more) from
    trace time ``from_s`` to the window's end (an instance killed right after ``from_s`` is not
    counted as held)."""
    end_s = min(trace.end_s, settings.window_s * settings.time_scale)
    changes = [t for t in trace.times_s if from_s < t < end_s]
    edges = [from_s, *changes, end_s]
    most, longest, run_s = 0, 0.0, 0.0
    for start, stop in zip(edges, edges[1:], strict=False):
        # The count from a change on (just past ``start``: a kill at it has happened).
        count = int(trace.count_at(start)) if start > from_s else int(trace.count_at(from_s))
        run_s = run_s + (stop - start) if count >= fewest else 0.0
        longest = max(longest, run_s)
        # Under a wall second held is no chance to train (a kill just after the last step).
        if (stop - start) / settings.time_scale >= 1.0:
            most = max(most, count)
    return {
        "instances_after": most,
        "held_after_s": round(longest / settings.time_scale, 2),
    }
