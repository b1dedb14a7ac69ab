"""Simulator: every policy on a 12-hour trace (target under 20 s), every registered policy on a
12-hour trace of 1,024 instances (target under 60 s in all), and the fractions of ideal on the p3
trace (committed in ``data/traces/``) against the figures of Parcae's artifact."""

from __future__ import annotations

import time

from bench.inputs import P3_TRACE, real_trace
from liveput.perf import load_profile
from liveput.policies import POLICIES
from liveput.sim import DEFAULT_POLICIES, SimulationConfig, default_trace, simulate, simulate_policy
from liveput.sim.engine import DEFAULT_MODEL, make_context
from liveput.traces import generate_trace, read_trace

TARGET_S = 20.0
LARGE_NODES = 1024
LARGE_TARGET_S = 60.0
# Parcae's artifact on the p3 trace (60-s intervals): (predictor, truth, reactive) of ideal.
PARCAE = {"gpt-1.5b": (None, 0.866, 0.939, 0.778), "gpt-6.7b": (8.47, 0.854, 0.921, 0.487)}


def _fractions(trace, model: str) -> dict[str, float]:
    result = simulate(trace, load_profile(model), list(DEFAULT_POLICIES))
    return {name: result.fraction_of_ideal(name) or 0.0 for name in result.runs}


def _thousand_instances() -> None:
    """Every registered policy on a generated 12-hour trace of 1,024 instances (the default
    model), one after the other as ``liveput simulate`` runs them."""
    trace = generate_trace(LARGE_NODES, 12.0, seed=0).resample(60.0)
    profile = load_profile(DEFAULT_MODEL)
    config = SimulationConfig()
    start = time.perf_counter()
    context = make_context(trace, profile, config)
    times = {"(context)": time.perf_counter() - start}
    for name in POLICIES.names():
        begin = time.perf_counter()
        simulate_policy(trace, profile, name, config, context)
        times[name] = time.perf_counter() - begin
    total = time.perf_counter() - start
    print(
        f"all {len(POLICIES.names())} registered policies, {DEFAULT_MODEL}, {trace.hours:.0f}-h "
        f"trace of {LARGE_NODES} instances ({len(trace)} intervals, {trace.max_count} at "
        f"most): {total:.1f} s (target {LARGE_TARGET_S:.0f} s, ratio "
        f"{total / LARGE_TARGET_S:.2f})"
    )
    print("  " + "  ".join(f"{name} {seconds:.1f} s" for name, seconds in times.items()))


def main() -> None:
    p3_path = real_trace(P3_TRACE)
    _thousand_instances()
    trace = default_trace()
    profile = load_profile("gpt-1.5b")
    start, start_cpu = time.perf_counter(), time.process_time()
    result = simulate(trace, profile, list(DEFAULT_POLICIES))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    print(
        f"all {len(DEFAULT_POLICIES)} policies, gpt-1.5b, {trace.hours:.0f}-h trace "
        f"({len(trace)} intervals): {elapsed:.1f} s wall, {cpu:.1f} s CPU (target "
        f"{TARGET_S:.0f} s, ratio {elapsed / TARGET_S:.2f})"
    )
    print("  " + "  ".join(f"{name}={result.fraction_of_ideal(name):.3f}" for name in result.runs))
    p3 = read_trace(p3_path)
    for model, (hours, predicted, truth, reactive) in PARCAE.items():
        part = p3 if hours is None else p3.slice(0, hours * 3600)
        ours = _fractions(part.resample(60), model)
        print(
            f"p3 trace, {model}, {part.hours:.2f} h: liveput {ours['liveput']:.3f} vs Parcae "
            f"{predicted} (ratio {ours['liveput'] / predicted:.3f}); oracle "
            f"{ours['liveput-oracle']:.3f} vs {truth}; liveput / oracle "
            f"{ours['liveput'] / ours['liveput-oracle']:.3f} (target 0.9); reactive "
            f"{ours['reactive']:.3f} vs {reactive} (|diff| "
            f"{abs(ours['reactive'] - reactive):.3f}, target <= 0.1); bamboo "
            f"{ours['bamboo']:.3f}, checkpoint {ours['checkpoint']:.3f}"
        )


if __name__ == "__main__":
    main()
