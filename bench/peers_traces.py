"""The traces ``bench peers`` runs: generated ones per seed, the real p3 trace's busiest five
minutes, or the user's, each cut and rescaled to the regime's instances."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.inputs import P3_TRACE, real_trace
from liveput.traces import IntervalTrace, Trace, generate_trace, read_trace


def p3_cut(workers: int, start_s: float = 3030.0, span_s: float = 300.0) -> Trace:
    """A ``span_s`` cut of the real p3 trace (the default: its 5 minutes with the most
    preemption events, 4), rescaled to ``workers``."""
    return cut_trace(read_trace(real_trace(P3_TRACE)), workers, start_s, span_s, "p3-cut")


def cut_trace(
    full: Trace | IntervalTrace, workers: int, start_s: float, span_s: float, name: str
) -> Trace:
    """``span_s`` seconds of ``full`` from ``start_s``, rescaled to ``workers``: the count scaled
    by ``workers / peak``, each change keeping at least one instance so that no preemption event
    vanishes in the rounding."""
    import numpy as np

    if isinstance(full, IntervalTrace):
        full = Trace.from_counts(
            full.name,
            np.arange(len(full.count)) * full.interval_s,
            np.asarray(full.count),
            len(full.count) * full.interval_s,
        )
    if not 0 <= start_s < full.end_s:
        sys.exit(
            f"bench peers: --trace-start {start_s:g} s is outside {full.name} "
            f"(0 to {full.end_s:g} s)"
        )
    ratio = workers / max(int(full.max_count()), 1)
    count = int(np.clip(round(int(full.count_at(start_s)) * ratio), 1, workers))
    times, counts = [0.0], [count]
    inside = (full.times_s > start_s) & (full.times_s < start_s + span_s)
    for time_s, added, removed in zip(
        full.times_s[inside], full.added[inside], full.removed[inside], strict=True
    ):
        delta = int(added) - int(removed)
        if delta:
            step = int(np.sign(delta)) * max(1, round(abs(delta) * ratio))
            count = int(np.clip(count + step, 0, workers))
            times.append(float(time_s - start_s))
            counts.append(count)
    span_s = min(span_s, full.end_s - start_s)
    return Trace.from_counts(f"{name}-{workers}", np.array(times), np.array(counts), span_s)


def user_traces(
    paths: list[str], start_s: float, span_s: float, workers: int
) -> list[tuple[str, Trace]]:
    """Traces the user names (any format the CLI reads), cut and rescaled to ``workers``; a
    missing or unreadable one ends the benchmark with a message (it never skips one)."""
    from liveput.errors import LiveputError

    chosen = []
    for path in paths:
        if not Path(path).is_file():
            sys.exit(f"bench peers: --trace {path}: no such file")
        try:
            full = read_trace(Path(path))
        except LiveputError as error:
            sys.exit(f"bench peers: --trace {path}: {error}")
        chosen.append((Path(path).stem, cut_trace(full, workers, start_s, span_s, Path(path).stem)))
    return chosen


def traces(quick: bool, seeds: list[int], workers: int) -> list[tuple[str, Trace, int]]:
    """(name, trace, seed): the generated 5-minute trace per seed, and the p3 cut."""
    chosen = [
        (f"generated-{workers}-seed{s}", generate_trace(workers, 5 / 60, s), s) for s in seeds
    ]
    if quick:
        return chosen[:1]
    chosen.append(("p3-cut", p3_cut(workers), seeds[0]))
    return chosen
