"""Trace formats: detection, parsing, round trips, resampling invariants and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.traces import Trace, read_trace, trace_stats, write_trace


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    initial = draw(st.integers(0, 12))
    steps = draw(
        st.lists(st.tuples(st.integers(1, 600), st.integers(0, 4), st.integers(0, 4)), max_size=40)
    )
    count, time_s = initial, 0
    times, added, removed = [], [], []
    for gap, add, remove in steps:
        remove = min(remove, count)
        if add == 0 and remove == 0:
            continue
        time_s += gap
        times.append(float(time_s))
        added.append(add)
        removed.append(remove)
        count += add - remove
    end_s = time_s + draw(st.integers(0, 900))
    return Trace("h", initial, times, added, removed, end_s=max(end_s, 1))


@settings(max_examples=60, deadline=None)
@given(trace=traces(), interval_s=st.sampled_from([30.0, 60.0, 97.0, 300.0]))
def test_resampling_invariants(trace: Trace, interval_s: float) -> None:
    resampled = trace.resample(interval_s)
    assert (resampled.count >= 0).all()
    flow = resampled.count[:-1] + resampled.allocated[:-1] - resampled.preempted[:-1]
    assert (flow == resampled.count[1:]).all()
    assert resampled.allocated.sum() == trace.added.sum()
    assert resampled.preempted.sum() == trace.removed.sum()
    assert resampled.end_count == trace.count_at(trace.end_s)
    grid = np.arange(len(resampled)) * interval_s
    assert (resampled.count == trace.count_at(grid)).all()


@settings(max_examples=40, deadline=None)
@given(trace=traces())
def test_events_round_trip(tmp_path_factory: pytest.TempPathFactory, trace: Trace) -> None:
    path = tmp_path_factory.mktemp("rt") / "trace.csv"
    write_trace(trace, path)
    back = read_trace(path)
    assert back.initial_count == trace.initial_count
    np.testing.assert_allclose(back.times_s, trace.times_s)
    assert back.added.tolist() == trace.added.tolist()
    assert back.removed.tolist() == trace.removed.tolist()


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=50))
def test_count_json_round_trip(tmp_path_factory: pytest.TempPathFactory, counts: list[int]) -> None:
    path = tmp_path_factory.mktemp("rt") / "trace.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": counts}))
    trace = read_trace(path)
    assert trace.hours == pytest.approx(len(counts) * 300 / 3600)
    out = path.with_name("again.json")
    write_trace(trace, out, gap_s=300)
    assert json.loads(out.read_text())["data"] == counts
    assert trace.mean_count() == pytest.approx(np.mean(counts))


def test_all_four_formats_give_the_same_trace(tmp_path: Path) -> None:
    counts = [3, 3, 5, 2, 2, 4]
    (tmp_path / "a.json").write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": counts}))
    (tmp_path / "b.csv").write_text(
        "time,count\n" + "".join(f"{60 * i},{c}\n" for i, c in enumerate(counts))
    )
    (tmp_path / "c.csv").write_text(
        "time,instance_count\n"
        + "".join(f"2024-05-01T10:{i:02d}:00,{c}\n" for i, c in enumerate(counts))
    )
    (tmp_path / "d.txt").write_text(
        "".join(f"2024-05-01, 10:{i:02d}:00, {c}\n" for i, c in enumerate(counts))
    )
    write_trace(read_trace(tmp_path / "a.json"), tmp_path / "e.csv")
    expected = [3, 3, 5, 2, 2, 4]
    for name in ("a.json", "b.csv", "c.csv", "d.txt"):
        resampled = read_trace(tmp_path / name).resample(60)
        assert resampled.count.tolist() == expected, name
    # The events form ends at its last change (t = 300 s), so it has one interval less.
    assert read_trace(tmp_path / "e.csv").resample(60).count.tolist() == expected[:-1]


def test_slicing_works_on_every_format(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text(
        "2024-05-01, 10:00:00, 4\n2024-05-01, 11:00:00, 6\n2024-05-01, 12:00:00, 1\n"
    )
    part = read_trace(tmp_path / "t.txt").slice(1800, 5400)
    assert part.initial_count == 4
    assert part.mean_count() == pytest.approx(5.0)


def test_forced_format_overrides_detection(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0,add,a\n5000,add,b\n")
    with pytest.raises(LiveputError, match="expected header"):
        read_trace(path, fmt="csv")
    assert read_trace(path).counts.tolist() == [2]


def _independent_stats(path: Path) -> dict[str, float]:
    """Statistics computed from the raw file with plain Python, not with the library."""
    if path.suffix == ".json":
        document = json.loads(path.read_text())
        data, gap = document["data"], document["metadata"]["gap_seconds"]
        drops = sum(max(0, a - b) for a, b in zip(data, data[1:]))
        rises = sum(max(0, b - a) for a, b in zip(data, data[1:]))
        return {
            "hours": len(data) * gap / 3600,
            "mean_nodes": sum(data) / len(data),
            "min_nodes": min(data),
            "max_nodes": max(data),
            "preemptions": drops,
            "allocations": rises,
        }
    rows = [line.split(",") for line in path.read_text().split()]
    start, end = int(rows[0][0]), int(rows[-1][0])
    count, area, last, seen = 0, 0.0, start, []
    initial = sum(1 for r in rows if int(r[0]) == start and r[1] == "add")
    for stamp, kind, _node in rows:
        area += count * (int(stamp) - last)
        last = int(stamp)
        count += 1 if kind == "add" else -1
        seen.append(count)
    return {
        "hours": (end - start) / 3.6e6,
        "mean_nodes": area / (end - start),
        "min_nodes": min(seen[initial - 1 :]),
        "max_nodes": max(seen),
        "preemptions": sum(r[1] == "remove" for r in rows),
        "allocations": sum(r[1] == "add" for r in rows) - initial,
    }


@pytest.mark.parametrize("name", ["aws-p3-32node.events.csv", "aws-v100-16node-us-west-2a.json"])
def test_stats_of_real_traces_match_an_independent_computation(
    real_traces: Path, name: str
) -> None:
    figures = trace_stats(read_trace(real_traces / name))
    for key, value in _independent_stats(real_traces / name).items():
        assert figures[key] == pytest.approx(value, rel=1e-9), key
    assert figures["preemptions_per_hour"] == pytest.approx(
        figures["preemptions"] / figures["hours"]
    )


BAD_INPUTS = {
    "malformed.csv": ("0,add,a\n10,add\n", ":2:", "expected"),
    "negative.csv": ("time,count\n0,3\n60,-1\n", ":3:", "negative count"),
    "ghost.csv": ("0,add,a\n10,remove,b\n", ":2:", "not present"),
    "backwards.txt": ("2024-05-01, 10:00:00, 4\n2024-05-01, 09:00:00, 3\n", ":2:", "backwards"),
    "empty.csv": ("\n\n", "empty.csv", "empty"),
    "unknown.dat": ("hello world\n", ":1:", "unknown trace format"),
    "badjson.json": ('{"metadata": {"gap_seconds": 60}, "data": [1, -2]}', "data[1]", "count"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    content, where, what = BAD_INPUTS[name]
    path = tmp_path / name
    path.write_text(content)
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err
    assert where in err and what in err and name in err


def test_unknown_forced_format_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0,add,a\n")
    assert main(["trace", "stats", str(path), "--format", "yaml"]) == 2
    assert "unknown trace format 'yaml'" in capsys.readouterr().err
    assert main(["trace", "stats", str(tmp_path / "missing.csv")]) == 2
    assert "no such trace file" in capsys.readouterr().err
