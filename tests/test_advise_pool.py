"""Pool advisor: capped traces, finishing times, and the cheapest simulated pool."""

from __future__ import annotations

import numpy as np
import pytest

from liveput.advise.pool import PoolConfig, advise_pool, cap_trace, finish, pool_candidates
from liveput.catalog import Market
from liveput.errors import LiveputError
from liveput.perf import load_profile
from liveput.sim import PolicyRun, SimulationConfig, simulate_policy
from liveput.traces import generate_trace


def test_capped_traces_balance_and_respect_the_cap() -> None:
    for seed in range(20):
        trace = generate_trace(12, 1.0, seed=seed, regime="default").resample(60.0)
        for cap in (0, 1, 5, 12, 20):
            capped = cap_trace(trace, cap)  # IntervalTrace checks the flow balances
            assert capped.count.max(initial=0) <= cap
            assert np.array_equal(capped.count, np.minimum(trace.count, cap))
            assert np.all(capped.preempted <= trace.preempted)


def _run(samples: list[float], dollars: list[float]) -> PolicyRun:
    n = len(samples)
    return PolicyRun(
        policy="x",
        samples=samples[-1],
        cost_usd=dollars[-1],
        usd_per_1k_samples=float("nan"),
        reconfigurations=0,
        downtime_s=0.0,
        interval_s=3600.0,
        available=np.ones(n, dtype=np.int64),
        cumulative_samples=np.array(samples),
        cumulative_cost_usd=np.array(dollars),
    )


def test_finish_interpolates_inside_and_extrapolates_past_the_replay() -> None:
    run = _run([100.0, 300.0, 400.0], [10.0, 20.0, 30.0])
    assert finish(run, 200.0) == (pytest.approx(1.5), pytest.approx(15.0))
    assert finish(run, 50.0) == (pytest.approx(0.5), pytest.approx(5.0))
    assert finish(run, 800.0) == (pytest.approx(6.0), pytest.approx(60.0))
    nothing = _run([0.0, 0.0], [1.0, 2.0])
    assert finish(nothing, 1.0) == (float("inf"), float("inf"))


@pytest.fixture(scope="module")
def short_trace():
    return generate_trace(8, 0.5, seed=4).resample(60.0)


@pytest.fixture(scope="module")
def profile():
    return load_profile("resnet152")


def test_pool_is_the_cheapest_candidate_that_meets_the_deadline(short_trace, profile) -> None:
    anchors, caps = (0, 2), (4, 8)
    runs = {}
    for a, k in pool_candidates(anchors, caps):
        config = SimulationConfig(
            spot_price_usd_per_hour=1.25, on_demand_price_usd_per_hour=3.06, num_on_demand=a
        )
        runs[(a, k)] = simulate_policy(cap_trace(short_trace, k), profile, "liveput", config)
    rates = {key: run.samples / run.hours for key, run in runs.items()}
    target = 0.5 * max(rates.values()) * 0.5  # reachable in 0.5 h by the faster pools only
    deadline = 0.5
    expected = {key: finish(run, target) for key, run in runs.items()}
    feasible = {key: cost for key, (hours, cost) in expected.items() if hours <= deadline}
    assert 1 < len(feasible) < len(expected)
    best_key = min(feasible, key=feasible.get)
    calls = []
    advice = advise_pool(
        short_trace,
        profile,
        PoolConfig(target, deadline, anchors=anchors, spot_caps=caps),
        on_candidate=lambda: calls.append(1),
    )
    best = advice.plans[0]
    assert len(calls) == 4
    assert best.value == pytest.approx(feasible[best_key])
    spot = sum(i.count for i in best.instances if i.market.value == "spot")
    on_demand = sum(i.count for i in best.instances if i.market is Market.ON_DEMAND)
    assert (on_demand, spot) == best_key
    assert best.metrics["hours_to_target"] <= deadline
    assert [p.value for p in advice.plans] == sorted(p.value for p in advice.plans)


def test_unreachable_deadline_names_the_fastest_pool(short_trace, profile) -> None:
    with pytest.raises(LiveputError, match=r"no pool trains .* within 0.01 h; closest: .* needs"):
        advise_pool(short_trace, profile, PoolConfig(1e7, 0.01, anchors=(0, 1)))
    with pytest.raises(LiveputError, match="deadline-hours"):
        PoolConfig(1.0, 0.0)
