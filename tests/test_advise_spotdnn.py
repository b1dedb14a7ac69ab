"""spotDNN: the equations' values, fits, and SLO provisioning against exact search."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from liveput.advise import SLOConfig, SLOProblem, advise_slo, load_catalog, problem_from_catalog
from liveput.advise.slo import search
from liveput.advise.spotdnn import (
    SpotDNNParams,
    WorkerType,
    fit_contention,
    fit_loss,
    iterations_to_loss,
    loss_after,
    predict,
    worker_times,
)
from liveput.errors import LiveputError
from liveput.perf import load_profile

A = WorkerType("a", 0.5, 32, 1, 10.0, 0.4)
B = WorkerType("b", 1.0, 64, 2, 5.0, 0.7)
PARAMS = SpotDNNParams(
    model_gb=0.1,
    ps_bandwidth_gbps=10.0,
    pcie_gbps=100.0,
    a1=0.2,
    b1=0.1,
    g=(50.0, -0.5, 400.0, 2.0, 0.3),
)


def _by_hand(counts: dict[WorkerType, int]) -> dict[str, float]:
    """The equations of systems.md section 4, one worker at a time, in plain Python."""
    workers = [t for t, k in counts.items() for _ in range(k)]
    n = len(workers)
    p = min(PARAMS.a1 * math.sqrt(n) + PARAMS.b1, 1.0)
    times = []
    for w in workers:
        share = PARAMS.ps_bandwidth_gbps / n
        bandwidth = (
            p * share + (1 - p) * w.bandwidth_gbps if w.bandwidth_gbps > share else w.bandwidth_gbps
        )
        size = 8 * PARAMS.model_gb
        times.append(w.compute_s + 2 * size / bandwidth + 2 * w.gpus * size / PARAMS.pcie_gbps)
    t_exp = 1 / sum(1 / t for t in times)
    v = sum(w.batch / t for w, t in zip(workers, times))
    shares = sorted(((w.batch / t) / v for w, t in zip(workers, times)), reverse=True)
    r = math.sqrt(sum((s - (1.0 if i == 0 else 0.0)) ** 2 for i, s in enumerate(shares)))
    g1, g2, g3, g4, g5 = PARAMS.g
    b_w = v * t_exp
    loss_1000 = (g2 * b_w + g3) * math.sqrt((r + g4) * n) / (1000 + g1) + g5
    return {"t_exp": t_exp, "b_w": b_w, "r": r, "loss_1000": loss_1000, "time_a": times[0]}


@pytest.mark.parametrize("mix", [(1, 0), (0, 1), (1, 2), (3, 1), (4, 4)])
def test_model_reproduces_the_equations(mix: tuple[int, int]) -> None:
    expected = _by_hand({A: mix[0], B: mix[1]})
    prediction = predict(np.array([mix]), [A, B], PARAMS)
    assert prediction.iteration_s[0] == pytest.approx(expected["t_exp"], rel=1e-12)
    assert prediction.weighted_batch[0] == pytest.approx(expected["b_w"], rel=1e-12)
    assert prediction.convergence_r[0] == pytest.approx(expected["r"], rel=1e-9, abs=1e-12)
    assert loss_after(np.array([1000.0]), prediction, PARAMS)[0] == pytest.approx(
        expected["loss_1000"], rel=1e-12
    )
    j = iterations_to_loss(expected["loss_1000"], prediction, PARAMS)[0]
    assert j == pytest.approx(1000.0, rel=1e-9)


def test_model_invariants() -> None:
    # Equal workers: R = sqrt((n - 1) / n); one worker: R = 0 and b_w = its batch.
    for n in range(1, 9):
        prediction = predict(np.array([[n, 0]]), [A, B], PARAMS)
        assert prediction.convergence_r[0] == pytest.approx(math.sqrt((n - 1) / n), abs=1e-12)
    assert predict(np.array([[1, 0]]), [A, B], PARAMS).weighted_batch[0] == pytest.approx(32)
    # Uncontended: B_req <= B_ps / n keeps the worker's own bandwidth.
    slow = WorkerType("slow", 0.5, 32, 1, 2.0, 0.1)
    times = worker_times(np.array([[2]]), [slow], PARAMS)
    assert times[0, 0] == pytest.approx(0.5 + 2 * 0.8 / 2.0 + 2 * 0.8 / 100.0)
    # Contention only slows each worker as n grows; once P(n) = 1 the PS's bandwidth bounds the
    # cluster: T_exp >= 2 * 8S / B_ps, however many workers.
    counts = np.array([[k, 0] for k in range(1, 40)])
    assert np.all(np.diff(worker_times(counts, [A, B], PARAMS)[:, 0]) > 0)
    saturated = counts[:, 0] >= ((1 - PARAMS.b1) / PARAMS.a1) ** 2
    iteration = predict(counts, [A, B], PARAMS).iteration_s
    assert saturated.any()
    assert np.all(iteration[saturated] >= 2 * 8 * PARAMS.model_gb / PARAMS.ps_bandwidth_gbps)


def test_asynchronous_iterations_follow_t_exp() -> None:
    """Event simulation of asynchronous workers: the j-th update lands at about j T_exp."""
    counts = np.array([[2, 3]])
    times = worker_times(counts, [A, B], PARAMS)[0]
    period = [times[0]] * 2 + [times[1]] * 3
    t_exp = predict(counts, [A, B], PARAMS).iteration_s[0]
    events = [(p, i) for i, p in enumerate(period)]
    heapq.heapify(events)
    clock = 0.0
    for _ in range(20000):
        clock, worker = heapq.heappop(events)
        heapq.heappush(events, (clock + period[worker], worker))
    assert clock == pytest.approx(20000 * t_exp, rel=2e-3)


def test_fits_recover_parameters() -> None:
    rng = np.random.default_rng(3)
    n = np.arange(2, 17, dtype=float)
    truth = SpotDNNParams(model_gb=0.1, ps_bandwidth_gbps=10.0, a1=0.15, b1=0.05)
    p = np.minimum(truth.a1 * np.sqrt(n) + truth.b1, 1)
    share = 10.0 / n
    measured = p * share + (1 - p) * 25.0
    a1, b1 = fit_contention(n, measured, 25.0, 10.0)
    assert (a1, b1) == (pytest.approx(0.15, abs=1e-6), pytest.approx(0.05, abs=1e-6))
    # Loss curves of four clusters, 1 % noise.
    rows = []
    for bw, r, workers in ((32, 0.0, 1), (64, 0.7, 2), (128, 0.87, 4), (96, 0.8, 3)):
        for j in np.linspace(0, 5000, 15):
            rows.append((j, bw, r, workers))
    j, bw, r, workers = (np.array(c, dtype=float) for c in zip(*rows))
    g = (100.0, 0.5, 300.0, 1.5, 0.2)
    loss = (g[1] * bw + g[2]) * np.sqrt((r + g[3]) * workers) / (j + g[0]) + g[4]
    fitted = fit_loss(j, loss * (1 + rng.normal(0, 0.01, loss.size)), bw, r, workers)
    prediction = (fitted[1] * bw + fitted[2]) * np.sqrt((r + fitted[3]) * workers) / (
        j + fitted[0]
    ) + fitted[4]
    assert np.max(np.abs(prediction - loss) / loss) < 0.05
    assert fitted[4] == pytest.approx(0.2, abs=0.05)


def _random_problem(rng: np.random.Generator, num_types: int) -> SLOProblem:
    types = tuple(
        WorkerType(
            f"w{k}",
            float(rng.uniform(0.1, 1.5)),
            int(rng.choice([16, 32, 64])),
            int(rng.choice([1, 2, 4])),
            float(rng.uniform(2, 25)),
            float(rng.uniform(0.1, 2.0)),
            int(rng.choice([4, 8, 16])),
            str(rng.choice(["G", "P"])),
        )
        for k in range(num_types)
    )
    params = SpotDNNParams(
        model_gb=float(rng.uniform(0.05, 0.5)),
        ps_bandwidth_gbps=float(rng.uniform(5, 25)),
        a1=float(rng.uniform(0, 0.3)),
        b1=float(rng.uniform(0, 0.2)),
        g=(
            float(rng.uniform(10, 500)),
            float(rng.uniform(-1, 1)),
            float(rng.uniform(500, 3000)),
            float(rng.uniform(0.5, 10)),
            0.1,
        ),
    )
    quota = {"G": int(rng.integers(8, 64))} if rng.random() < 0.5 else {}
    return SLOProblem(types, params, quota)


def test_window_search_equals_exact_search_on_small_cases() -> None:
    rng = np.random.default_rng(5)
    compared = 0
    for case in range(40):
        problem = _random_problem(rng, int(rng.integers(1, 4)))
        deadline = float(rng.uniform(0.05, 3.0))
        common = dict(
            target_loss=float(rng.uniform(0.3, 1.0)),
            deadline_hours=deadline,
            max_workers_per_type=3,
            max_workers=6,
            ps_usd_per_hour=0.2,
        )
        try:
            exact = advise_slo(problem, SLOConfig(**common, search="exact")).plans[0]
        except LiveputError as error:
            assert "closest" in str(error)
            with pytest.raises(LiveputError, match="no plan reaches"):
                advise_slo(problem, SLOConfig(**common, search="window"))
            continue
        window = advise_slo(problem, SLOConfig(**common, search="window")).plans[0]
        assert window.value <= exact.value * (1 + 1e-12), case
        assert window.value == pytest.approx(exact.value, rel=1e-12)
        assert window.metrics["hours_to_target"] <= deadline + 1e-12
        compared += 1
    assert compared >= 15


def test_narrow_window_plans_meet_the_slo_and_cost_no_less_than_exact() -> None:
    rng = np.random.default_rng(8)
    gaps = []
    for _ in range(15):
        problem = _random_problem(rng, 5)
        common = dict(
            target_loss=0.6,
            deadline_hours=2.0,
            max_workers_per_type=2,
            max_workers=6,
            ps_usd_per_hour=0.2,
        )
        visited = search(problem, SLOConfig(**common, search="exact"))
        if not any(np.isfinite(s.cost) for s in visited):
            continue
        exact = advise_slo(problem, SLOConfig(**common, search="exact")).plans[0]
        try:
            window = advise_slo(problem, SLOConfig(**common, window_types=2)).plans[0]
        except LiveputError:
            continue
        assert window.value >= exact.value * (1 - 1e-12)
        assert window.metrics["hours_to_target"] <= 2.0 + 1e-12
        gaps.append(window.value / exact.value - 1)
    assert gaps


def test_slo_on_the_catalog_meets_its_targets() -> None:
    catalog = load_catalog("aws")
    problem, ps = problem_from_catalog(catalog, load_profile("resnet152"), "c5n.xlarge")
    config = SLOConfig(0.5, 0.5, ps_usd_per_hour=ps.on_demand_usd_per_hour)
    best = advise_slo(problem, config, ps.name).plans[0]
    assert best.metrics["hours_to_target"] <= 0.5
    counts = {i.type: i.count for i in best.instances if i.role == "worker"}
    types = [t for t in problem.types if t.name in counts]
    prediction = predict(np.array([[counts[t.name] for t in types]]), types, problem.params)
    iterations = 0.5 * 3600 / prediction.iteration_s
    assert loss_after(iterations, prediction, problem.params)[0] <= 0.5
    assert best.instances[-1].role == "ps" and best.instances[-1].type == "c5n.xlarge"
    # GPT-1.5B's 23.6 GB of training state fits the 24-GB A10G and up, not the T4 or the V100.
    gpt, _ = problem_from_catalog(catalog, load_profile("gpt-1.5b"), "c5n.xlarge")
    assert {catalog.get(t.name).gpu for t in gpt.types} == {"A10G", "A100", "H100"}


def test_impossible_slos_name_the_closest_plan() -> None:
    catalog = load_catalog("aws")
    problem, ps = problem_from_catalog(catalog, load_profile("resnet152"), "c5n.xlarge")
    with pytest.raises(
        LiveputError,
        match=r"no plan reaches loss 0.5 within 0.01 h; closest: "
        r".* needs [0-9.]+ h",
    ):
        advise_slo(problem, SLOConfig(0.5, 0.01), ps.name)
    with pytest.raises(LiveputError, match="floor"):
        advise_slo(problem, SLOConfig(0.05, 1.0), ps.name)
