"""The liveput optimizer against brute force, and exact liveput against sampling."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from optimizer_cases import random_table
from seeds import for_each_seed

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.perf import MigrationCostModel, load_profile
from liveput.perf.configuration import Configuration
from liveput.perf.types import ConfigTable
from liveput.plan import (
    LiveputOptimizer,
    OptimizerConfig,
    expected_throughput_after_losses,
    migration_seconds,
)
from liveput.plan.liveput import monte_carlo_throughput_after_losses, on_demand_per_stage

PROFILE = load_profile("gpt-1.5b")
COSTS = MigrationCostModel()


def random_forecast(rng: np.random.Generator, steps: int, capacity: int) -> Forecast:
    pmf = rng.dirichlet(np.ones(capacity + 1) * 0.7, size=steps)
    point = pmf @ np.arange(capacity + 1)
    return Forecast(point, pmf, rng.uniform(0, 1.5, steps), rng.uniform(0, 1.5, steps))


def enumerated_after_losses(thr: np.ndarray, d: int, p: int, spares: int, lost: int) -> float:
    """E[thr(min survivors per stage)] by enumerating every set of lost instances."""
    owners = [s for _ in range(d) for s in range(p)] + [-1] * spares
    values = []
    for chosen in itertools.combinations(range(len(owners)), lost):
        losses = np.bincount([owners[i] for i in chosen if owners[i] >= 0], minlength=p)
        values.append(thr[int((d - losses).min())])
    return float(np.mean(values))


def brute_force(
    optimizer: LiveputOptimizer, current: Configuration | None, available: int, forecast: Forecast
) -> tuple[float, int]:
    """Best total over every sequence of candidates, rewards computed from first principles."""
    from scipy.stats import binom  # here: 0.3 s of every xdist worker's collection otherwise

    config = optimizer.config
    count = len(optimizer.sizes)
    capacity = max(available, forecast.capacity)
    migration = migration_seconds(
        PROFILE, COSTS, optimizer.data_parallel, optimizer.stages, available
    )
    grid = np.zeros((optimizer.capacity + 1, optimizer.capacity + 1))
    grid[optimizer.data_parallel, optimizer.stages] = optimizer.throughput
    rewards = np.zeros((config.horizon, count))
    for h in range(config.horizon):
        pmf = np.zeros(capacity + 1)
        if h == 0:
            pmf[available], point = 1.0, float(available)
        else:
            pmf[: forecast.capacity + 1] = forecast.pmf[h - 1]
            point = max(float(forecast.point[h - 1]), 1.0)
        step = min(h, forecast.horizon - 1)
        rate = min(max(forecast.expected_preempted[step] / max(point, 1.0), 0.0), 1.0)
        for c in range(1, count):
            d, p = int(optimizer.data_parallel[c]), int(optimizer.stages[c])
            thr = grid[: d + 1, p]
            total = 0.0
            for n in range(d * p, capacity + 1):
                if pmf[n] == 0:
                    continue
                expected = 0.0
                for k in range(n + 1):
                    weight = binom.pmf(k, n, rate)
                    if k == 0:
                        expected += weight * thr[d]
                    else:
                        after = enumerated_after_losses(thr, d, p, n - d * p, k)
                        expected += weight * (thr[d] + after) / 2
                total += pmf[n] * expected
            rewards[h, c] = config.interval_s * total
    start = (
        0 if current is None else optimizer._index[(current.data_parallel, current.pipeline_stages)]
    )
    keep = np.clip(config.interval_s - migration, 0, None) / config.interval_s
    best, best_first = -1.0, -1
    for sequence in itertools.product(range(count), repeat=config.horizon):
        previous = [start, *sequence[:-1]]
        value = sum(rewards[h, c] * keep[b, c] for h, (b, c) in enumerate(zip(previous, sequence)))
        if value > best + 1e-9:
            best, best_first = value, sequence[0]
    return best, best_first


def test_dynamic_program_equals_exhaustive_search() -> None:
    for_each_seed(range(6), _dynamic_program_equals_exhaustive_search)


def _dynamic_program_equals_exhaustive_search(seed: int) -> None:
    rng = np.random.default_rng(seed)
    max_nodes = int(rng.integers(3, 7))
    table = random_table(rng, max_nodes)
    horizon = int(rng.integers(2, 4))
    optimizer = LiveputOptimizer(
        PROFILE, table, COSTS, OptimizerConfig(horizon=horizon, interval_s=30.0)
    )
    forecast = random_forecast(rng, horizon - 1, max_nodes)
    available = int(rng.integers(1, max_nodes + 1))
    fitting = [
        Configuration(int(d), int(p))
        for d, p, f in zip(table.data_parallel, table.pipeline_stages, table.feasible)
        if f and d * p <= available
    ]
    current = fitting[int(rng.integers(len(fitting)))] if fitting else None
    decision = optimizer.decide(current, available, forecast)
    best, first = brute_force(optimizer, current, available, forecast)
    assert decision.alternatives[0].expected_samples == pytest.approx(best, rel=1e-9)
    assert decision.expected_samples == pytest.approx(best, rel=1e-9)
    chosen = (
        0
        if decision.configuration is None
        else optimizer._index[
            (decision.configuration.data_parallel, decision.configuration.pipeline_stages)
        ]
    )
    assert chosen == first


@pytest.mark.parametrize(
    "d, p, spares, lost, on_demand",
    [
        (4, 3, 2, 3, 0),
        (3, 4, 1, 5, 2),
        (2, 2, 0, 1, 0),
        (4, 8, 6, 7, 3),
        (5, 2, 3, 4, 0),
    ],
)
def test_exact_liveput_equals_monte_carlo(
    d: int, p: int, spares: int, lost: int, on_demand: int
) -> None:
    thr = np.concatenate(([0.0], np.cumsum(np.linspace(10, 6, d))))
    exact = expected_throughput_after_losses(thr, d, p, spares, on_demand)[spares, lost]
    mean, error = monte_carlo_throughput_after_losses(
        thr, d, p, spares, lost, on_demand, samples=6000, seed=d * p
    )
    assert abs(exact - mean) <= 4 * error + 1e-9
    if on_demand == 0 and d * p + spares <= 12:
        assert exact == pytest.approx(enumerated_after_losses(thr, d, p, spares, lost))


def test_on_demand_instances_make_pipelines_robust() -> None:
    thr = np.arange(5, dtype=float) * 10
    plain = expected_throughput_after_losses(thr, 4, 4, 0, 0)[0, 4]
    anchored = expected_throughput_after_losses(thr, 4, 4, 0, 4)[0, 4]
    assert anchored > plain
    assert on_demand_per_stage(5, 4, 4).tolist() == [2, 1, 1, 1]
    # With a whole pipeline of on-demand instances, at least one pipeline always survives.
    assert expected_throughput_after_losses(thr, 4, 4, 0, 4)[0, 12] == pytest.approx(10.0)


def test_expected_preemptions_favour_shallower_pipelines() -> None:
    table = load_table()
    optimizer = LiveputOptimizer(PROFILE, table, COSTS, OptimizerConfig(horizon=4))
    counts = np.array([32, 32, 32])
    calm = Forecast.certain(counts, 32)
    stormy = Forecast(counts.astype(float), calm.pmf, np.full(3, 6.0), np.full(3, 6.0))
    best_d, best_p, _ = table.best_for(32)
    calm_decision = optimizer.decide(Configuration(4, 8), 32, calm)
    assert calm_decision.configuration == Configuration(best_d, best_p)
    stormy_decision = optimizer.decide(Configuration(4, 8), 32, stormy)
    assert stormy_decision.configuration.pipeline_stages < best_p
    assert stormy_decision.expected_samples < calm_decision.expected_samples


def load_table() -> ConfigTable:
    from liveput.perf import estimate_configs

    return estimate_configs(PROFILE, 32)


def test_bad_input() -> None:
    optimizer = LiveputOptimizer(PROFILE, load_table(), COSTS, OptimizerConfig(horizon=5))
    with pytest.raises(LiveputError, match="forecast has 2 steps"):
        optimizer.decide(None, 20, Forecast.certain(np.array([20, 20]), 32))
    with pytest.raises(LiveputError, match="unknown objective"):
        OptimizerConfig(objective="speed")
    with pytest.raises(LiveputError, match="horizon"):
        OptimizerConfig(horizon=0)


def test_cli_plan_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    forecast = "30,29,28,28"
    assert (
        main(
            [
                "plan",
                "--nodes",
                "32",
                "--current",
                "4x8",
                "--forecast",
                forecast,
                "--horizon",
                "5",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert set(result) >= {"decision", "migration", "expected_samples", "alternatives", "solve_ms"}
    assert result["alternatives"][0]["expected_samples"] == pytest.approx(
        result["expected_samples"]
    )
    assert (
        main(
            ["plan", "--nodes", "20", "--current", "4x8", "--forecast", forecast, "--horizon", "5"]
        )
        == 2
    )
    assert "uses 32 instances but only 20" in capsys.readouterr().err
    assert (
        main(
            ["plan", "--model", "gpt-9", "--nodes", "8", "--forecast", "8,8,8,8", "--horizon", "5"]
        )
        == 2
    )
    assert "unknown model" in capsys.readouterr().err
    assert main(["plan", "--nodes", "8", "--forecast", "8,8", "--horizon", "5"]) == 2
    assert "needs 4" in capsys.readouterr().err


def test_cli_plan_takes_a_longer_forecast_and_says_what_it_ignores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    forecast = "30,29,28,28"
    assert (
        main(
            [
                "plan",
                "--nodes",
                "32",
                "--current",
                "4x8",
                "--forecast",
                forecast,
                "--horizon",
                "5",
                "--json",
            ]
        )
        == 0
    )
    exact = json.loads(capsys.readouterr().out)
    # H values (one per interval of the horizon) or more, as --help says: the first H - 1 count.
    assert (
        main(
            [
                "plan",
                "--nodes",
                "32",
                "--current",
                "4x8",
                "--forecast",
                forecast + ",5,5",
                "--horizon",
                "5",
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    longer = json.loads(captured.out)
    assert longer["decision"] == exact["decision"]
    assert longer["expected_samples"] == pytest.approx(exact["expected_samples"])
    assert "uses the first 4" in captured.err and "ignores 2" in captured.err
