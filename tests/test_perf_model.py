"""The performance model: fit to the measured table, memory limits, invariants, CLI."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.perf import MigrationCostModel, estimate_configs, load_profile, partition_layers
from liveput.perf.measured import measured_table
from liveput.perf.partition import partition_table
from liveput.perf.profiler import profile_model, tiny_gpt_target


def _fit(model: str) -> tuple[float, int, int]:
    measured = measured_table()[model]
    table = estimate_configs(load_profile(model), 32)
    lookup = {(int(d), int(p)): s for d, p, s in
              zip(table.data_parallel, table.pipeline_stages, table.samples_per_s)}
    predicted = np.array([lookup[(int(d), int(p))] for d, p in
                          zip(measured.data_parallel, measured.pipeline_stages)])
    mape = float(np.mean(np.abs(predicted - measured.samples_per_s) / measured.samples_per_s))
    truth = {(int(d), int(p)): s for d, p, s in
             zip(measured.data_parallel, measured.pipeline_stages, measured.samples_per_s)}
    counts = sorted({d * p for d, p in truth})
    misses = 0
    for count in counts:
        options = [k for k in truth if k[0] * k[1] <= count]
        pick = max(options, key=lambda k: (lookup[k], -k[1]))
        misses += truth[pick] < 0.95 * max(truth[k] for k in options)
    return mape, misses, len(counts)


@pytest.mark.parametrize("model, max_mape, max_misses", [
    ("gpt-1.5b", 0.06, 3), ("gpt-6.7b", 0.10, 0), ("bert-large", 0.15, 2),
])
def test_estimator_reproduces_the_measured_table(model: str, max_mape: float,
                                                 max_misses: int) -> None:
    mape, misses, _ = _fit(model)
    assert mape <= max_mape
    assert misses <= max_misses


def test_published_minimum_depths_hold() -> None:
    for model, depth in (("gpt-1.5b", 6), ("gpt-6.7b", 12)):
        table = estimate_configs(load_profile(model), 32)
        assert int(table.pipeline_stages[table.feasible].min()) == depth
        shallow = (table.pipeline_stages < depth) & (table.data_parallel == 1)
        assert all(reason for reason in np.array(table.reason, dtype=object)[shallow])


def test_gpt15_out_of_memory_reason_below_six_stages() -> None:
    table = estimate_configs(load_profile("gpt-1.5b"), 8)
    index = int(np.flatnonzero((table.data_parallel == 1) & (table.pipeline_stages == 5))[0])
    assert not table.feasible[index]
    assert table.reason[index].startswith("out of memory")


@settings(max_examples=25, deadline=None)
@given(times=st.lists(st.floats(0.1, 10.0), min_size=2, max_size=14), depth=st.integers(1, 6))
def test_partition_is_optimal_against_brute_force(times: list[float], depth: int) -> None:
    from itertools import combinations

    from liveput.perf.types import LayerProfile, ModelProfile

    depth = min(depth, len(times))
    layers = tuple(LayerProfile(f"l{i}", t, 0.0, 0.0, 1, 1, 1) for i, t in enumerate(times))
    profile = ModelProfile("x", load_profile("gpt-1.5b").instance_type, layers, 8, 1)
    bounds = partition_layers(profile, depth)
    assert bounds[0] == 0 and bounds[-1] == len(times) and (np.diff(bounds) >= 1).all()
    prefix = np.concatenate(([0.0], np.cumsum(times)))

    def worst(cuts: tuple[int, ...]) -> float:
        edges = (0, *cuts, len(times))
        return max(prefix[b] - prefix[a] for a, b in zip(edges, edges[1:]))

    best = min(worst(c) for c in combinations(range(1, len(times)), depth - 1))
    assert worst(tuple(bounds[1:-1])) == pytest.approx(best)
    table = partition_table(profile, depth)
    assert table.max_stage_time_s[depth] == pytest.approx(best)


def test_more_pipelines_never_lose_throughput_for_gpt() -> None:
    table = estimate_configs(load_profile("gpt-1.5b"), 32)
    grid = table.throughput_grid(32)
    for stages in range(6, 17):
        row = grid[1:, stages][grid[1:, stages] > 0]
        assert (np.diff(row) > 0).all()


def test_estimating_every_config_up_to_64_is_vectorized_and_cheap() -> None:
    profile = load_profile("gpt-1.5b")
    estimate_configs(profile, 64)
    start = time.perf_counter()
    table = estimate_configs(profile, 64)
    assert len(table.data_parallel) == sum(min(64 // d, 48) for d in range(1, 65))
    assert time.perf_counter() - start < 1.0  # the bench holds the 10 ms target


def test_cost_model_matches_the_published_figures() -> None:
    costs = MigrationCostModel()
    assert costs.transfer_s(2**30) == pytest.approx(1.198, rel=0.01)
    assert costs.transfer_s(3 * 2**20) == pytest.approx(0.0045, rel=0.3)
    assert costs.restart_s(8) == pytest.approx(40.882)
    assert 33.5 < costs.restart_s(3) < 36.2
    state_bytes = load_profile("gpt-1.5b").num_params * 12
    assert costs.checkpoint_save_s(state_bytes) + costs.checkpoint_load_s(state_bytes) == \
        pytest.approx(14.0, rel=0.15)
    assert MigrationCostModel(network_gbps=20).transfer_s(2**30) == pytest.approx(0.599, rel=0.01)


def test_profiler_predicts_a_plain_training_loop() -> None:
    target = tiny_gpt_target()
    profile = profile_model(target, micro_batch_size=8, repeats=2)
    assert profile.num_params == sum(p.numel() for layer in target.layers
                                     for p in layer.parameters())
    predicted = estimate_configs(profile, 1).samples_per_s[0]
    # A plain single-process loop of the same model and batch (4 micro-batches of 8, then Adam).
    import torch

    model = torch.nn.Sequential(*target.layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    inputs, targets = target.make_batch(profile.global_batch_size)
    timings = []
    for _ in range(4):
        start = time.perf_counter()
        for chunk in range(0, len(inputs), 8):
            loss = target.loss_fn(model(inputs[chunk:chunk + 8]), targets[chunk:chunk + 8])
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        timings.append(time.perf_counter() - start)
    measured = profile.global_batch_size / np.median(timings[1:])
    assert predicted == pytest.approx(measured, rel=0.35)


def test_cli_perf_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["perf", "gpt-6.7b", "--nodes", "24", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["instance_type"] == "p3.2xlarge"
    assert result["best"]["11"] is None and result["best"]["24"] == [2, 12]
    infeasible = [c for c in result["configs"] if not c["feasible"]]
    assert infeasible and all(c["reason"] for c in infeasible)
    assert main(["perf", "gpt-99b"]) == 2
    assert "unknown model 'gpt-99b'" in capsys.readouterr().err
    with pytest.raises(LiveputError):
        load_profile("gpt-99b")


def test_cli_profile_round_trip(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.json"
    assert main(["profile", "--model", "tiny-gpt", "--micro-batch", "4", "--repeats", "1",
                 "-o", str(path)]) == 0
    loaded = load_profile(str(path))
    assert loaded.micro_batch_size == 4 and loaded.num_layers == 6
    assert estimate_configs(loaded, 4).feasible.any()
