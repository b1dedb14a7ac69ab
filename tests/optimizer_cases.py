"""Seeded optimizer cases whose decisions are pinned in ``tests/data/optimizer_reference.json``.

The reference was written by the optimizer as it was before it was restructured for a thousand
instances (commit 7aa8a2a: dense per-count tables over instances x configurations x losses), so
``test_plan_reference.py`` checks that the restructured one decides the same. To rewrite it
(only when the optimizer's *model* changes on purpose), run this file with the optimizer to pin
on the path: ``PYTHONPATH=<checkout>/src python tests/optimizer_cases.py
tests/data/optimizer_reference.json``.

Only stable interfaces are used here (profiles, config tables, forecasts, ``decide``,
``recover``), so the same cases run on both implementations.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from liveput.forecast.base import Forecast
from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.perf.configuration import Configuration
from liveput.perf.types import ConfigTable
from liveput.plan import LiveputOptimizer, OptimizerConfig

REFERENCE = Path(__file__).parent / "data" / "optimizer_reference.json"
RANDOM_CASES = 48
"""Cases on random tables (up to 4 stages, up to 12 instances)."""
PROFILE_CASES = (
    ("gpt-1.5b", 16),
    ("gpt-1.5b", 32),
    ("gpt-1.5b", 64),
    ("gpt-1.5b", 96),
    ("bert-large", 48),
    ("gpt-6.7b", 64),
    ("gpt-6.7b", 128),
    ("gpt-6.7b", 256),
)
"""(model, instances) of the cases on built-in profiles: what the old optimizer could do."""


@dataclass(frozen=True)
class Case:
    """One optimizer call: ``decide`` then ``recover`` from the same optimizer."""

    name: str
    profile: str
    table: ConfigTable
    config: OptimizerConfig
    current: Configuration | None
    num_available: int
    forecast: Forecast
    num_on_demand: int
    recover_start: Configuration | None
    recover_available: int
    recover_remaining_s: float
    salvage_stages: int | None

    def optimizer(self) -> LiveputOptimizer:
        profile = load_profile(self.profile)
        return LiveputOptimizer(
            profile, self.table, MigrationCostModel.from_profile(profile), self.config
        )


def random_table(rng: np.random.Generator, max_nodes: int) -> ConfigTable:
    """Random throughputs (about D^0.7..1 per depth) of (D, P <= 4), 80% feasible."""
    pairs = [(d, p) for d in range(1, max_nodes + 1) for p in range(1, 5) if d * p <= max_nodes]
    d = np.array([x[0] for x in pairs])
    p = np.array([x[1] for x in pairs])
    per_pipeline = rng.uniform(1, 10, size=5)
    samples = per_pipeline[p] * d ** rng.uniform(0.7, 1.0)
    feasible = rng.random(len(pairs)) < 0.8
    return ConfigTable(
        "random",
        "x",
        d,
        p,
        np.where(feasible, samples, 0.0),
        np.zeros(len(pairs)),
        feasible,
        tuple(None for _ in pairs),
    )


def random_forecast(
    rng: np.random.Generator, steps: int, capacity: int, max_rate: float
) -> Forecast:
    """A full (Dirichlet) distribution per step; expected preemptions up to ``max_rate`` x n."""
    pmf = rng.dirichlet(np.ones(capacity + 1) * rng.uniform(0.3, 2.0), size=steps)
    point = pmf @ np.arange(capacity + 1)
    preempted = rng.uniform(0, max_rate, steps) * np.maximum(point, 1.0)
    if rng.random() < 0.3:
        preempted[rng.random(steps) < 0.5] = 0.0  # calm steps: no loss expected
    return Forecast(point, pmf, preempted, rng.uniform(0, 2, steps))


def _fitting(
    table: ConfigTable,
    instances: int,
    rng: np.random.Generator,
) -> Configuration | None:
    fitting = [
        Configuration(int(d), int(p))
        for d, p, f in zip(table.data_parallel, table.pipeline_stages, table.feasible, strict=True)
        if f and d * p <= instances
    ]
    if not fitting or rng.random() < 0.15:
        return None
    return fitting[int(rng.integers(len(fitting)))]


def _case(
    name: str,
    profile: str,
    table: ConfigTable,
    nodes: int,
    horizon: int,
    rng: np.random.Generator,
    max_rate: float,
    min_available: int = 0,
) -> Case:
    on_demand = int(rng.choice([0, 0, 1, 2, 5]))
    available = int(rng.integers(min_available, nodes + 1))
    capacity = int(rng.integers(max(available, 1), nodes + 1))
    config = OptimizerConfig(
        horizon=horizon,
        interval_s=float(rng.choice([30.0, 60.0, 120.0])),
        objective=str(rng.choice(["throughput", "throughput", "cost"])),
    )
    forecast = random_forecast(rng, horizon - 1 + int(rng.integers(0, 2)), capacity, max_rate)
    lost = int(rng.integers(0, max(available, 1)))
    recover_start = _fitting(table, available - lost + on_demand, rng)
    salvage = None
    if recover_start is None and rng.random() < 0.5:
        depths = np.unique(table.pipeline_stages[table.feasible])
        salvage = int(rng.choice(depths)) if len(depths) else None
    return Case(
        name,
        profile,
        table,
        config,
        _fitting(table, available + on_demand, rng),
        available,
        forecast,
        on_demand,
        recover_start,
        available - lost,
        float(rng.uniform(0, config.interval_s)),
        salvage,
    )


def cases() -> Iterator[Case]:
    """Every pinned case, in a fixed order (each from its own seed)."""
    for seed in range(RANDOM_CASES):
        rng = np.random.default_rng([7, seed])
        nodes = int(rng.integers(3, 13))
        yield _case(
            f"random-{seed}",
            "gpt-1.5b",
            random_table(rng, nodes),
            nodes,
            int(rng.integers(2, 7)),
            rng,
            max_rate=0.6,
        )
    for index, (model, nodes) in enumerate(PROFILE_CASES):
        table = estimate_configs(load_profile(model), nodes + 5)
        for repeat in range(2):
            rng = np.random.default_rng([11, index, repeat])
            yield _case(
                f"{model}-{nodes}-{repeat}",
                model,
                table,
                nodes,
                12,
                rng,
                max_rate=0.1,
                min_available=nodes // 2,
            )


def _name(configuration: Configuration | None) -> str | None:
    return None if configuration is None else str(configuration)


def run(case: Case) -> dict:
    """The decisions of ``case`` as plain JSON."""
    optimizer = case.optimizer()
    decision = optimizer.decide(case.current, case.num_available, case.forecast, case.num_on_demand)
    recovered = optimizer.recover(
        case.recover_start,
        case.recover_available,
        case.recover_remaining_s,
        case.num_on_demand,
        case.salvage_stages,
    )
    return {
        "decide": {
            "configuration": _name(decision.configuration),
            "migration": decision.migration,
            "migration_s": decision.migration_s,
            "expected_samples": decision.expected_samples,
            "alternatives": [
                [_name(a.configuration), a.expected_samples, a.migration]
                for a in decision.alternatives
            ],
        },
        "recover": {
            "configuration": _name(recovered.configuration),
            "migration": recovered.migration,
            "migration_s": recovered.migration_s,
            "expected_samples": recovered.expected_samples,
        },
    }


def main(path: str) -> None:
    reference = {case.name: run(case) for case in cases()}
    Path(path).write_text(json.dumps(reference, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
