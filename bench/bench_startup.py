"""Start-up: seconds from spawning the agents of one pipeline to its first step, and what each
agent spent building its job.

N fresh agent processes (one per stage of a 1 x N pipeline of JOB, layers cut evenly, no
checkpoint to read) share this machine's cores, as a job's instances boot together on a cloud;
the figure is the seconds from their spawn to the first step's start (the first commit less one
median step). Each agent builds the job without its weights and materializes only its stage's
layers where the job gives ``init_layer`` (``liveput.models.lazy``); its log says how long that
took. Target: the first step <= 15 s after the instances are up, at 8 instances (gpt2-small: 86 M
parameters, 14 layers).

Usage: ``python -m bench startup [--job gpt2-small] [--instances 8] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path

from bench.bench_runtime import _process_run
from liveput.models.jobs import resolve_job
from liveput.perf.configuration import Configuration

TARGET_S = 15.0
"""The first step at most this long after the instances are up (8 instances)."""
_BUILT = re.compile(r"built job \S+ in ([0-9.]+) s")


def even_bounds(num_layers: int, stages: int) -> list[int]:
    """Each stage's first layer, then the layer count: ``num_layers`` cut as evenly as can be."""
    if not 1 <= stages <= num_layers:
        raise SystemExit(f"bench startup: {stages} stages for {num_layers} layers")
    return [stage * num_layers // stages for stage in range(stages)] + [num_layers]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench startup")
    parser.add_argument("--job", default="gpt2-small", help="built-in job (default: %(default)s)")
    parser.add_argument("--instances", type=int, default=8, help="pipeline stages, one each")
    parser.add_argument("--repeats", type=int, default=2, help="runs, each with fresh agents")
    parser.add_argument("--steps", type=int, default=3, help="steps each run trains")
    args = parser.parse_args(argv)
    job = resolve_job(args.job)
    bounds = even_bounds(job.num_layers, args.instances)
    firsts_s, builds_s = [], []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as directory:
            first_s, _ = _process_run(
                args.job,
                Configuration(1, args.instances),
                args.steps,
                directory,
                bounds=bounds,
                verbose=True,
            )
            built = [
                float(m.group(1))
                for log in Path(directory).glob("agent-*.log")
                for m in _BUILT.finditer(log.read_text(errors="replace"))
            ]
        firsts_s.append(first_s)
        builds_s.extend(built)
        print(
            f"run {repeat + 1}: first step {first_s:.1f} s after spawning {args.instances} "
            f"agents of {args.job}; job built in "
            + (f"{statistics.median(built):.2f} s median per agent" if built else "(not logged)"),
            flush=True,
        )
    first_s = statistics.median(firsts_s)
    print(
        f"{args.job} on {args.instances} instances: first step {first_s:.1f} s (median of "
        f"{len(firsts_s)}), job built in "
        + (f"{statistics.median(builds_s):.2f} s median per agent" if builds_s else "-")
        + f"; target <= {TARGET_S:g} s: ratio {first_s / TARGET_S:.2f} "
        + ("(met)" if first_s <= TARGET_S else "(not met)")
    )
