"""The two shortcuts that let the optimizer plan for a thousand instances, against the dense
forms they replace: the per-count expectation over losses (``plan.interval``) and the migration
matrix of the dynamic program (``plan.transitions``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optimizer_cases import random_table
from scipy.special import comb

from liveput.perf import MigrationCostModel, estimate_configs, load_profile
from liveput.plan import LiveputOptimizer, expected_throughput_after_losses, migration_seconds
from liveput.plan.interval import IntervalThroughput
from liveput.plan.transitions import Transitions

PROFILE = load_profile("gpt-1.5b")
COSTS = MigrationCostModel.from_profile(PROFILE)


def mixture_over_losses(
    thr: np.ndarray, d: int, p: int, spares: int, on_demand: int, rate: float
) -> float:
    """The per-count term as the dense optimizer computed it: sum_k Bin(k; n, q) (thr + E[thr
    after k uniformly placed losses]) / 2 over the n spot instances of (D, P) plus spares."""
    after = expected_throughput_after_losses(thr, d, p, spares, on_demand)[spares]
    spot = len(after) - 1
    lost = np.arange(spot + 1)
    weights = comb(spot, lost) * rate**lost * (1.0 - rate) ** (spot - lost)
    return float(weights[0] * thr[d] + np.sum(weights[1:] * (thr[d] + after[1:]) / 2))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    d=st.integers(1, 6),
    p=st.integers(1, 5),
    spares=st.integers(0, 6),
    on_demand=st.integers(0, 9),
    rate=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_per_candidate_equals_the_mixture_over_losses_for_every_spare_count(
    d: int, p: int, spares: int, on_demand: int, rate: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    grid = np.zeros((d + 1, p + 1))
    # Any throughputs, not only increasing ones (an infeasible width has throughput 0).
    grid[1:, p] = np.where(rng.random(d) < 0.8, rng.uniform(0.5, 10.0, d), 0.0)
    grid[d, p] = max(grid[d, p], 1.0)
    interval = IntervalThroughput(np.array([0, d]), np.array([0, p]), grid)
    value = interval.per_candidate(rate, on_demand)
    assert value[0] == 0.0
    thr = grid[:, p]
    assert value[1] == pytest.approx(
        mixture_over_losses(thr, d, p, spares, on_demand, rate), rel=1e-9, abs=1e-12
    )


def test_per_candidate_at_the_extremes() -> None:
    grid = np.zeros((5, 4))
    grid[1:, 3] = [2.0, 4.0, 5.0, 9.0]
    interval = IntervalThroughput(np.array([0, 4]), np.array([0, 3]), grid)
    assert interval.per_candidate(0.0, 0)[1] == pytest.approx(9.0)  # nothing lost
    assert interval.per_candidate(1.0, 0)[1] == pytest.approx(4.5)  # all lost halfway
    # A whole pipeline on on-demand instances survives anything: half at 9, half at 2.
    assert interval.per_candidate(1.0, 3)[1] == pytest.approx(5.5)


def _tables() -> list:
    rng = np.random.default_rng(3)
    return [random_table(rng, int(rng.integers(3, 13))) for _ in range(4)] + [
        estimate_configs(PROFILE, 40),
        estimate_configs(load_profile("bert-large"), 24),
    ]


@pytest.mark.parametrize(
    "table", _tables(), ids=lambda table: f"{table.model}-{len(table.data_parallel)}"
)
def test_migration_rows_and_dynamic_program_step_equal_the_dense_matrix(table) -> None:
    optimizer = LiveputOptimizer(PROFILE, table, COSTS)
    d, p = optimizer.data_parallel, optimizer.stages
    transitions = Transitions(PROFILE, COSTS, d, p, interval_s=60.0)
    rng = np.random.default_rng(len(d))
    for instances in (1, 7, int(optimizer.capacity)):
        dense = migration_seconds(PROFILE, COSTS, d, p, instances)
        for source in range(len(d)):
            # Bit for bit: the same floating-point expressions.
            assert np.array_equal(transitions.seconds_row(source, instances), dense[source])
        keep = np.clip(60.0 - dense, 0.0, None) / 60.0
        for _ in range(3):
            rewards = rng.uniform(0, 1000, len(d)) * (rng.random(len(d)) < 0.8)
            penalty = rng.uniform(0, 50, len(d)) * (rng.random() < 0.5)
            values = rng.uniform(0, 5000, len(d))
            step = transitions.step(rewards, penalty, values, instances)
            expected = (rewards[None, :] * keep - penalty[None, :] + values).max(axis=1)
            assert np.array_equal(step, expected)
