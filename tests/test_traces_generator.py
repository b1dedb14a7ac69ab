"""The trace generator: reproducible, valid, and calibrated to the measured traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.traces import generate_trace, read_trace, trace_stats

# Calibration targets: statistics of the real traces at 60-s intervals (docs/traces.md).
P3 = {
    "mean_fraction": 0.751,
    "preemptions_per_instance_hour": 0.611,
    "fraction_of_intervals_with_preemption": 0.116,
    "mean_preemption_burst": 2.11,
}
V100 = {
    "mean_fraction": 0.431,
    "preemptions_per_instance_hour": 0.541,
    "fraction_of_time_empty": 0.554,
}


def _mean_stats(regime: str, nodes: int, hours: float, seeds: range) -> dict[str, float]:
    runs = [trace_stats(generate_trace(nodes, hours, seed, regime)) for seed in seeds]
    merged = {
        key: float(np.mean([run[key] for run in runs]))
        for key in runs[0]
        if isinstance(runs[0][key], (int, float))
    }
    merged["mean_fraction"] = merged["mean_nodes"] / nodes
    return merged


def test_p3_like_regime_matches_the_p3_trace() -> None:
    generated = _mean_stats("p3-like", 32, 12, range(6))
    for key, target in P3.items():
        assert generated[key] == pytest.approx(target, rel=0.2), key


def test_v100_like_regime_matches_the_v100_trace() -> None:
    generated = _mean_stats("v100-like", 16, 200, range(4))
    for key, target in V100.items():
        assert generated[key] == pytest.approx(target, rel=0.35), key


@pytest.mark.parametrize("nodes", [32, 2000])
def test_preemption_rate_per_instance_holds_from_32_to_2000_nodes(nodes: int) -> None:
    # One burst process for the whole capacity would make 2,000-node traces calm (0.0095
    # preemptions per instance-hour against 0.63 at 32 nodes); zones keep the calibrated rate.
    generated = _mean_stats("p3-like", nodes, 12, range(6))
    assert generated["preemptions_per_instance_hour"] == pytest.approx(
        P3["preemptions_per_instance_hour"], rel=0.2
    )
    assert generated["mean_fraction"] == pytest.approx(P3["mean_fraction"], rel=0.1)
    if nodes > 32:  # losses of many zones in one interval are one larger event
        assert generated["mean_preemption_burst"] > 2 * P3["mean_preemption_burst"]


def test_v100_like_rate_per_instance_holds_at_2000_nodes() -> None:
    generated = _mean_stats("v100-like", 2000, 100, range(2))
    assert generated["preemptions_per_instance_hour"] == pytest.approx(
        V100["preemptions_per_instance_hour"], rel=0.35
    )
    assert generated["mean_fraction"] == pytest.approx(V100["mean_fraction"], rel=0.35)


def test_many_zones_over_a_long_span_is_refused_before_drawing() -> None:
    with pytest.raises(LiveputError, match=r"3,125 zones x 8,760 intervals.*--nodes or --hours"):
        generate_trace(100_000, 146, 0)


def test_calibration_targets_are_the_real_traces_statistics(real_traces: Path) -> None:
    p3 = trace_stats(read_trace(real_traces / "aws-p3-32node.events.csv"))
    assert p3["mean_nodes"] / 32 == pytest.approx(P3["mean_fraction"], abs=1e-3)
    assert p3["preemptions_per_instance_hour"] == pytest.approx(
        P3["preemptions_per_instance_hour"], abs=1e-3
    )
    v100 = trace_stats(read_trace(real_traces / "aws-v100-16node-us-west-2a.json"))
    assert v100["fraction_of_time_empty"] == pytest.approx(V100["fraction_of_time_empty"], abs=1e-3)


def test_same_seed_same_trace_and_capacity_respected() -> None:
    first = generate_trace(16, 6, seed=3)
    again = generate_trace(16, 6, seed=3)
    other = generate_trace(16, 6, seed=4)
    assert first.times_s.tolist() == again.times_s.tolist()
    assert first.times_s.tolist() != other.times_s.tolist()
    assert first.max_count() <= 16 and first.min_count() >= 0
    assert first.hours == pytest.approx(6)


def test_unknown_regime_and_bad_sizes() -> None:
    with pytest.raises(LiveputError, match="unknown trace regime 'stormy'"):
        generate_trace(8, 1, 0, regime="stormy")
    with pytest.raises(LiveputError, match="--nodes"):
        generate_trace(0, 1, 0)


def test_cli_generate_stats_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace_file = tmp_path / "g.json"
    assert (
        main(
            [
                "trace",
                "generate",
                "--nodes",
                "8",
                "--hours",
                "2",
                "--seed",
                "1",
                "-o",
                str(trace_file),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["trace", "stats", str(trace_file), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["hours"] == pytest.approx(2.0)
    assert figures["intervals"] == 120 and figures["max_nodes"] <= 8
    png = tmp_path / "g.png"
    assert main(["trace", "plot", str(trace_file), "-o", str(png), "--end-hour", "1"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failed_generate_keeps_the_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.csv"
    target.write_text("0,add,a\n")
    assert main(["trace", "generate", "--nodes", "0", "-o", str(target)]) == 2
    assert target.read_text() == "0,add,a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.csv"]
