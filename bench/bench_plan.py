"""Liveput optimizer: decisions for N = 64 (gpt-1.5b) and N = 1024 (gpt-6.7b) instances, H = 12,
full forecast distributions.

N = 1024 targets: first decision (optimizer construction and its first ``decide``)
under 2 s and under 500 MB, steady decisions under 50 ms at p95. The first decision runs in a
fresh child process (spawned), so its memory is that process's peak resident set
(``ru_maxrss``: interpreter, numpy and scipy included) and, besides, the growth of the resident
set over the first decision and the peak of Python allocations (``tracemalloc``, in a second
child: tracing slows the run it measures).
"""

from __future__ import annotations

import multiprocessing
import resource
import time
import tracemalloc

import numpy as np

from liveput.forecast.base import Forecast
from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.plan import LiveputOptimizer, OptimizerConfig

LARGE_NODES = 1024
LARGE_MODEL = "gpt-6.7b"
LARGE_RUNNING = Configuration(32, 16)
FIRST_TARGET_S = 2.0
MEMORY_TARGET_MB = 500.0
STEADY_TARGET_MS = 50.0
STEADY_DECISIONS = 40


def _forecast(rng: np.random.Generator, nodes: int, max_preempted: float) -> Forecast:
    pmf = rng.dirichlet(np.ones(nodes + 1), size=11)
    return Forecast(
        pmf @ np.arange(nodes + 1),
        pmf,
        rng.uniform(0, max_preempted, 11),
        rng.uniform(0, max_preempted, 11),
    )


def _rss_mb() -> float:
    """Resident set now (Linux: /proc/self/statm), MB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _first_decision(traced: bool) -> dict[str, float]:
    """In a fresh process: the table, then the optimizer and its first decision."""
    rng = np.random.default_rng(1)
    profile = load_profile(LARGE_MODEL)
    start = time.perf_counter()
    table = estimate_configs(profile, LARGE_NODES)
    table_s = time.perf_counter() - start
    forecast = _forecast(rng, LARGE_NODES, 30.0)
    before_mb = _rss_mb()
    if traced:
        tracemalloc.start()
    start = time.perf_counter()
    optimizer = LiveputOptimizer(
        profile, table, MigrationCostModel.from_profile(profile), OptimizerConfig(horizon=12)
    )
    optimizer.decide(LARGE_RUNNING, LARGE_NODES, forecast)
    first_s = time.perf_counter() - start
    result = {
        "table_s": table_s,
        "first_s": first_s,
        "rss_before_mb": before_mb,
        "rss_after_mb": _rss_mb(),
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if traced:
        result["traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return result


def _in_child(traced: bool) -> dict[str, float]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_first_decision, (traced,))


def _steady(
    nodes: int, model: str, running: Configuration, max_preempted: float, low: int
) -> tuple[float, np.ndarray]:
    """First-decision seconds (in this process) and the seconds of later decisions."""
    rng = np.random.default_rng(0)
    profile = load_profile(model)
    table = estimate_configs(profile, nodes)
    start = time.perf_counter()
    optimizer = LiveputOptimizer(
        profile, table, MigrationCostModel.from_profile(profile), OptimizerConfig(horizon=12)
    )
    optimizer.decide(running, nodes, _forecast(rng, nodes, max_preempted))
    first_s = time.perf_counter() - start
    runs = []
    for _ in range(STEADY_DECISIONS):
        forecast = _forecast(rng, nodes, max_preempted)
        available = int(rng.integers(low, nodes + 1))
        begin = time.perf_counter()
        optimizer.decide(running, available, forecast)
        runs.append(time.perf_counter() - begin)
    return first_s, np.array(runs)


def main() -> None:
    warm_s, runs = _steady(64, "gpt-1.5b", Configuration(4, 8), 3.0, 32)
    median_ms = float(np.median(runs) * 1e3)
    print(f"first decision N=64 (optimizer + first decide): {warm_s * 1e3:.0f} ms (once per job)")
    print(
        f"decision N=64 H=12: median {median_ms:.1f} ms, p90 {np.percentile(runs, 90) * 1e3:.1f}"
        f" ms (target 50 ms, ratio {median_ms / 50:.2f}; {median_ms / 600:.3f}% of a 60-s "
        "interval)"
    )

    first = _in_child(traced=False)
    traced = _in_child(traced=True)
    peak_mb = first["peak_rss_mb"]
    print(
        f"N={LARGE_NODES} {LARGE_MODEL} H=12, first decision (optimizer + first decide, fresh "
        f"process): {first['first_s']:.2f} s (target {FIRST_TARGET_S:.0f} s, ratio "
        f"{first['first_s'] / FIRST_TARGET_S:.2f}); the configuration table before it "
        f"{first['table_s']:.2f} s"
    )
    print(
        f"  memory: process peak RSS {peak_mb:.0f} MB (target {MEMORY_TARGET_MB:.0f} MB, ratio "
        f"{peak_mb / MEMORY_TARGET_MB:.2f}); RSS {first['rss_before_mb']:.0f} -> "
        f"{first['rss_after_mb']:.0f} MB over the first decision; Python allocations' peak "
        f"during it {traced['traced_peak_mb']:.1f} MB (tracemalloc)"
    )
    _, runs = _steady(LARGE_NODES, LARGE_MODEL, LARGE_RUNNING, 30.0, LARGE_NODES // 2)
    p95_ms = float(np.percentile(runs, 95) * 1e3)
    print(
        f"  steady decisions ({len(runs)}, random full forecasts and counts): median "
        f"{np.median(runs) * 1e3:.1f} ms, p95 {p95_ms:.1f} ms (target {STEADY_TARGET_MS:.0f} "
        f"ms, ratio {p95_ms / STEADY_TARGET_MS:.2f})"
    )


if __name__ == "__main__":
    main()
