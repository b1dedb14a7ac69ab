"""Provisioning advisor: DeepVM's published plan, agreement with brute force, and the answer time
of every advise command on a 100-type catalog (target: under 1 s each)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from liveput.advise import (
    Catalog,
    DeepVMConfig,
    MixedConfig,
    SLOConfig,
    advise_deepvm,
    advise_mixed,
    advise_slo,
    enumerate_deepvm,
    load_catalog,
    problem_from_catalog,
)
from liveput.perf import load_profile

TARGET_S = 1.0


def catalog_of(size: int, seed: int = 0) -> Catalog:
    """``size`` types: the built-in catalog's types, then jittered copies of them (prices +-30 %,
    FLOPS +-20 %), GPU and CPU in the built-in proportion."""
    base = load_catalog("aws")
    rng = np.random.default_rng(seed)
    specs = list(base.instances)
    while len(specs) < size:
        spec = base.instances[len(specs) % len(base.instances)]
        jitter = float(rng.uniform(0.7, 1.3))
        specs.append(
            replace(
                spec,
                name=f"{spec.name}-v{len(specs)}",
                spot_usd_per_hour=spec.spot_usd_per_hour * jitter,
                on_demand_usd_per_hour=spec.on_demand_usd_per_hour * jitter,
                relative_flops=spec.relative_flops * float(rng.uniform(0.8, 1.2)),
            )
        )
    return replace(base, name=f"synthetic-{size}", instances=tuple(specs[:size]))


def _timed(call, repeat: int = 5) -> float:
    call()
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        runs.append(time.perf_counter() - start)
    return float(np.median(runs))


def _agreement() -> None:
    from tests.test_advise_deepvm import _mixed_brute_force, _random_catalog

    rng = np.random.default_rng(2026)
    same = total = 0
    for _ in range(200):
        catalog = _random_catalog(rng, int(rng.integers(1, 5)), int(rng.integers(1, 3)))
        config = DeepVMConfig(
            float(rng.uniform(0.3, 3.0)), checkpoint_gb=float(rng.choice([0.0, 1.0, 8.0]))
        )
        cheapest = min(
            min(s.spot_usd_per_hour, s.on_demand_usd_per_hour) for s in catalog.instances
        )
        reference = enumerate_deepvm(
            catalog, config, int(config.budget_usd_per_hour / cheapest) + 2
        )
        if reference is None:
            continue
        total += 1
        same += (
            abs(advise_deepvm(catalog, config).plans[0].value - reference.value)
            <= 1e-9 * reference.value
        )
    print(f"DeepVM exact vs exhaustive enumeration: {same}/{total} random catalogs agree")
    same = total = 0
    for _ in range(40):
        catalog = _random_catalog(rng, int(rng.integers(2, 4)), int(rng.integers(1, 3)))
        config = DeepVMConfig(float(rng.uniform(0.4, 2.0)), checkpoint_gb=1.0)
        value, _cost = _mixed_brute_force(catalog, config)
        if value < 0:
            continue
        total += 1
        same += (
            abs(advise_mixed(catalog, MixedConfig(config)).plans[0].value - value) <= 1e-6 * value
        )
    print(f"mixed-type MILP vs brute force: {same}/{total} random catalogs agree")


def main() -> None:
    published = advise_deepvm(load_catalog("deepvm-aws"), DeepVMConfig(3.0)).plans[0]
    expected = "17 x g4dn.xlarge spot + 1 x c5.xlarge ondemand"
    print(
        f"DeepVM catalog, $3/h: {published.describe()} ({published.architecture}), "
        f"${published.usd_per_hour:.4f}/h; published: {expected} "
        f"({'reproduced' if published.describe() == expected else 'DIFFERS'})"
    )
    _agreement()
    catalog = catalog_of(100)
    print(
        f"catalog of {len(catalog.instances)} types ({len(catalog.gpu_types)} GPU, "
        f"{len(catalog.cpu_types)} CPU):"
    )
    profile = load_profile("resnet152")
    problem, ps = problem_from_catalog(catalog, profile, "c5n.xlarge")
    timings = {
        "deepvm $3/h": lambda: advise_deepvm(catalog, DeepVMConfig(3.0)),
        "deepvm $30/h": lambda: advise_deepvm(catalog, DeepVMConfig(30.0)),
        "mixed MILP $3/h": lambda: advise_mixed(catalog, MixedConfig(DeepVMConfig(3.0))),
        "mixed MILP $30/h": lambda: advise_mixed(catalog, MixedConfig(DeepVMConfig(30.0))),
        "slo window (spotDNN)": lambda: advise_slo(
            problem, SLOConfig(0.5, 1.0, ps_usd_per_hour=ps.on_demand_usd_per_hour), ps.name
        ),
    }
    for name, call in timings.items():
        seconds = _timed(call)
        print(
            f"  {name:22s} {seconds * 1e3:8.1f} ms (target {TARGET_S:g} s, ratio "
            f"{seconds / TARGET_S:.3f})"
        )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "catalog.json"
        path.write_text(
            json.dumps(
                {
                    "instances": [
                        {
                            "name": s.name,
                            "type": s.family,
                            "vCPU": s.vcpus,
                            "memory": s.memory_gb,
                            "network_bandwidth": s.network_gbps,
                            "ondemand_price": s.on_demand_usd_per_hour,
                            "spot_price": s.spot_usd_per_hour,
                            "flops": s.relative_flops,
                            "gpus": s.gpus,
                            "gpu": s.gpu,
                            "gpu_memory_gb": s.gpu_memory_gb,
                        }
                        for s in catalog.instances
                    ]
                }
            )
        )
        for label, argv in (
            (
                "CLI deepvm --mixed",
                [
                    "advise",
                    "deepvm",
                    "--budget-usd-per-hour",
                    "3",
                    "--mixed",
                    "--catalog",
                    str(path),
                    "--json",
                ],
            ),
            (
                "CLI slo",
                [
                    "advise",
                    "slo",
                    "--model",
                    "resnet152",
                    "--target-loss",
                    "0.5",
                    "--deadline-hours",
                    "1",
                    "--catalog",
                    str(path),
                    "--json",
                ],
            ),
        ):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "liveput.cli.main", *argv], check=True, capture_output=True
            )
            seconds = time.perf_counter() - start
            print(
                f"  {label:22s} {seconds * 1e3:8.1f} ms whole process incl. imports "
                f"(ratio {seconds / TARGET_S:.3f})"
            )
    _pool()


def _pool() -> None:
    from liveput.advise.pool import PoolConfig, advise_pool
    from liveput.sim import default_trace

    trace = default_trace().head(60)
    profile = load_profile("gpt-1.5b")
    start = time.perf_counter()
    advice = advise_pool(trace, profile, PoolConfig(1e5, 2.0, anchors=(0, 1, 2, 4)))
    seconds = time.perf_counter() - start
    print(
        f"  pool, 4 candidates on a 1-h 32-node trace (gpt-1.5b): {seconds:.2f} s "
        f"({seconds / 4:.2f} s per simulated candidate; ratio {seconds / TARGET_S:.2f}); "
        f"best {advice.plans[0].describe()}"
    )
