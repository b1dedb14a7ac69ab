"""Predictors: cost of one forecast on a 12-hour history, and a whole 12-hour backtest.

Target: fit/update plus predict at most 20 ms per interval for a 12-hour history, so a
12-hour walk-forward backtest of every method runs in seconds (the cost is quoted at 64 nodes, the
p3-like trace below). Also prints each method's MAE and CRPS relative to persistence on the real
traces committed in ``data/traces/`` and on generated ones (default, volatile, v100-like,
p3-like regimes).
"""

from __future__ import annotations

import time

from bench.inputs import P3_TRACE, V100_TRACE, real_trace
from liveput.forecast import PREDICTORS
from liveput.forecast.backtest import backtest
from liveput.traces import generate_trace, read_trace

TARGET_MS = 20.0


def _scores(name: str, trace, warmup: int = 60) -> None:
    methods = PREDICTORS.names()
    start = time.perf_counter()
    scores = backtest(trace, methods, horizon=12, warmup=warmup)
    wall_s = time.perf_counter() - start
    base = scores["persistence"]
    print(
        f"{name}: {len(trace)} intervals of {trace.interval_s:g} s, all methods in {wall_s:.1f} s"
    )
    for method, score in scores.items():
        print(
            f"  {method:12s} mae_mean {score.mae_mean:.4f} (x{score.mae_mean / base.mae_mean:.3f})"
            f"  crps_mean {score.crps_mean:.4f} (x{score.crps_mean / base.crps_mean:.3f})"
            f"  {score.ms_per_forecast:.2f} ms/forecast (target {TARGET_MS:.0f} ms, ratio "
            f"{score.ms_per_forecast / TARGET_MS:.2f})"
        )


def main() -> None:
    p3_path, v100_path = real_trace(P3_TRACE), real_trace(V100_TRACE)
    _scores("generated default 32 nodes 12 h", generate_trace(32, 12, seed=0).resample(60))
    _scores(
        "generated volatile 32 nodes 12 h",
        generate_trace(32, 12, seed=0, regime="volatile").resample(60),
    )
    # Rare zone-wide wipe-outs and refills (the hardest case for beating persistence's CRPS).
    _scores(
        "generated v100-like 16 nodes 12 h",
        generate_trace(16, 12, seed=0, regime="v100-like").resample(60),
    )
    # 64 nodes: the size at which the cost target (ms/forecast) is stated.
    _scores(
        "generated p3-like 64 nodes 12 h",
        generate_trace(64, 12, seed=0, regime="p3-like").resample(60),
    )
    _scores("aws-p3-32node (60 s)", read_trace(p3_path).resample(60))
    v100 = read_trace(v100_path)
    _scores("aws-v100-16node first 48 h (60 s)", v100.slice(0, 48 * 3600).resample(60))


if __name__ == "__main__":
    main()
