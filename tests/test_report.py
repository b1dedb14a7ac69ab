"""`liveput simulate`: the JSON schema, the self-contained report, the sweep and bad input."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from liveput.cli.main import main
from liveput.perf import load_profile
from liveput.report import FIGURES, write_report
from liveput.sim import SimulationConfig, simulate
from liveput.traces import generate_trace, write_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traces") / "small.csv"
    write_trace(generate_trace(24, 1.0, seed=4, regime="volatile"), path)
    return path


def test_report_is_one_self_contained_page_plus_the_pngs(tmp_path: Path) -> None:
    trace = generate_trace(20, 0.5, seed=1).resample(60)
    result = simulate(
        trace,
        load_profile("gpt-1.5b"),
        ["reactive", "ideal"],
        SimulationConfig(predictor="persistence"),
    )
    page = write_report(result, tmp_path / "report")
    text = page.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(images) == len(FIGURES) == 4
    for name, encoded in zip(FIGURES, images, strict=True):
        png = (tmp_path / "report" / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC)
        assert base64.b64decode(encoded) == png
    assert 'src="http' not in text and "<script" not in text
    assert "reactive" in text and f"{result.runs['reactive'].samples:,.0f}" in text
    assert "on every change of the count" in text  # each policy's model, in one line


def test_cli_json_schema(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "result.json"
    code = main(
        [
            "simulate",
            "--trace",
            str(small_trace),
            "--policies",
            "reactive,ideal,liveput",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert set(document) == {"trace", "model", "interval_s", "hours", "policies"}
    assert document["model"] == "gpt-1.5b" and document["interval_s"] == 60
    assert document["hours"] == pytest.approx(1.0)
    assert list(document["policies"]) == ["reactive", "ideal", "liveput"]
    for figures in document["policies"].values():
        assert set(figures) == {
            "samples",
            "cost_usd",
            "usd_per_1k_samples",
            "reconfigurations",
            "downtime_s",
            "fraction_of_ideal",
        }
    assert document["policies"]["ideal"]["fraction_of_ideal"] == pytest.approx(1.0)
    reactive = document["policies"]["reactive"]
    assert reactive["fraction_of_ideal"] == pytest.approx(
        reactive["samples"] / document["policies"]["ideal"]["samples"]
    )
    assert "reactive" in capsys.readouterr().out  # the table
    # --json means one thing in every command: one JSON object on stdout, no table.
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(small_trace),
                "--policies",
                "reactive,ideal,liveput",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == document


def test_cli_sweep_is_relative_to_reactive_and_ideal(
    small_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep.json"
    code = main(
        [
            "simulate",
            "--sweep",
            "--trace",
            str(small_trace),
            "--trace",
            str(small_trace),
            "--model",
            "gpt-1.5b,bert-large",
            "--policies",
            "reactive,bamboo,ideal",
            "--end-hour",
            "0.5",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 3
    for row in rows:
        if row["policy"] == "reactive":
            assert row["vs_reactive"] == pytest.approx(1.0)
        if row["policy"] == "ideal":
            assert row["vs_ideal"] == pytest.approx(1.0)
    assert "relative to reactive" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt-99b"], "unknown model 'gpt-99b'"),
        (["--policies", "reactive,varuna"], "unknown policy 'varuna'"),
        (["--trace", "/nonexistent/trace.csv"], "no such"),
        (["--objective", "speed"], "unknown objective"),
        (["--start-hour", "1"], "need a --trace"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error and "Traceback" not in error


def test_cli_empty_trace_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("time,count\n")
    assert main(["simulate", "--trace", str(path)]) == 2
    assert "error:" in capsys.readouterr().err


def test_cli_says_when_the_trace_is_too_small_and_still_simulates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "four.csv"
    path.write_text("time,count\n0,4\n600,4\n")
    out = tmp_path / "result.json"
    assert (
        main(["simulate", "--trace", str(path), "--policies", "reactive,liveput", "-o", str(out)])
        == 0
    )
    assert "needs 6 instances at least (the trace has at most 4)" in capsys.readouterr().err
    document = json.loads(out.read_text())
    assert document["policies"]["liveput"]["samples"] == 0
    assert document["policies"]["reactive"]["cost_usd"] > 0
