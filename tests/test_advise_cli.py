"""`liveput advise ...`: JSON for scripts, tables for people, one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from liveput.cli.main import main
from liveput.traces import generate_trace, write_trace


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def test_deepvm_json_lists_plans_and_why_the_first_wins(capsys) -> None:
    out = _json(
        capsys,
        ["advise", "deepvm", "--budget-usd-per-hour", "3", "--catalog", "deepvm-aws", "--json"],
    )
    first = out["plans"][0]
    assert first["architecture"] == "tiering"
    assert first["instances"][0] == {
        "type": "g4dn.xlarge",
        "count": 17,
        "market": "spot",
        "role": "worker",
    }
    assert first["instances"][1]["market"] == "ondemand"
    assert first["usd_per_hour"] == pytest.approx(17 * 0.1578 + 0.17)  # + 1 c5.xlarge
    assert first["objective"] == "effective_flops" and first["value"] > out["plans"][1]["value"]
    assert "17 nodes" in out["reason"]


def test_deepvm_table_and_own_speedups(capsys, tmp_path: Path) -> None:
    assert main(["advise", "deepvm", "--budget-usd-per-hour", "3", "--catalog", "deepvm-aws"]) == 0
    table = capsys.readouterr().out
    assert "g4dn.xlarge" in table and "why #1" in table
    # Measured speedups that make g4dn.xlarge stop scaling beyond 2 nodes: another type wins.
    nodes = np.arange(1, 25)
    rows = ["type,nodes,speedup"] + [
        f"g4dn.xlarge,{n},{min(n, 2) * 0.5 + 0.01 * n:.4f}" for n in nodes
    ]
    path = tmp_path / "speedups.csv"
    path.write_text("\n".join(rows) + "\n")
    out = _json(
        capsys,
        [
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--catalog",
            "deepvm-aws",
            "--speedups",
            str(path),
            "--json",
        ],
    )
    assert out["plans"][0]["instances"][0]["type"] != "g4dn.xlarge"


def test_deepvm_mixed_plan_is_listed(capsys) -> None:
    out = _json(
        capsys,
        [
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--catalog",
            "deepvm-aws",
            "--mixed",
            "--json",
        ],
    )
    mixed = [p for p in out["plans"] if p["architecture"] == "mixed"]
    assert len(mixed) == 1 and mixed[0]["value"] >= out["plans"][1]["value"] - 1e-9


def test_bad_input_gets_one_line_and_exit_2(capsys, tmp_path: Path) -> None:
    line = _error(capsys, ["advise", "deepvm", "--budget-usd-per-hour", "0.2"])
    assert "below the cheapest plan" in line and "closest:" in line
    line = _error(
        capsys,
        ["advise", "deepvm", "--budget-usd-per-hour", "3", "--types", "g4dn.xlarge,h900.xlarge"],
    )
    assert "unknown instance type 'h900.xlarge'" in line
    line = _error(
        capsys,
        [
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "0.01",
        ],
    )
    assert "no plan reaches loss 0.5 within 0.01 h; closest:" in line
    line = _error(
        capsys,
        [
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--mixed",
            "--revocation",
            "gce-k80-us-east1",
        ],
    )
    assert "revocations" in line
    line = _error(
        capsys, ["advise", "deepvm", "--budget-usd-per-hour", "3", "--revocation", "nowhere"]
    )
    assert "not a published model" in line
    bad = tmp_path / "bad.csv"
    bad.write_text("type,nodes,speedup\ng4dn.xlarge,one,1\n")
    line = _error(
        capsys, ["advise", "deepvm", "--budget-usd-per-hour", "3", "--speedups", str(bad)]
    )
    assert "bad.csv:2" in line


def test_slo_json(capsys) -> None:
    out = _json(
        capsys,
        [
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "0.5",
            "--revocation",
            "gce-v100-europe-west4",
            "--json",
        ],
    )
    first = out["plans"][0]
    assert first["architecture"] == "parameter-server" and first["objective"] == "cost_usd"
    assert first["hours_to_target"] <= 0.5
    assert first["instances"][-1]["role"] == "ps"
    assert [p["value"] for p in out["plans"]] == sorted(p["value"] for p in out["plans"])


def test_pool_json_and_catalog(capsys, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    write_trace(generate_trace(6, 0.5, seed=3), path)
    out = _json(
        capsys,
        [
            "advise",
            "pool",
            "--model",
            "resnet152",
            "--deadline-hours",
            "2",
            "--trace",
            str(path),
            "--target-samples",
            "1e5",
            "--anchors",
            "0,1",
            "--hours",
            "0.25",
            "--json",
        ],
    )
    first = out["plans"][0]
    assert first["architecture"] == "pool" and first["hours_to_target"] <= 2
    assert {i["type"] for i in first["instances"]} == {"p3.2xlarge"}
    assert out["inputs"]["candidates"] == 2
    catalog = _json(capsys, ["advise", "catalog", "--json"])
    assert any(i["name"] == "p5.48xlarge" for i in catalog["instances"])
    assert "spotdnn" in catalog["sources"]
