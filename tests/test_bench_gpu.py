"""`python -m bench gpu --device cpu --quick`: every part runs the CUDA run's code on the CPU and
its figures say what the GPU run's must (so the command does not rot between GPU runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import bench_gpu, gpu_parts


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 1 CPU-minute; its parts' own limits bound a loaded machine
def test_the_quick_cpu_run_measures_every_part(tmp_path: Path) -> None:
    output = tmp_path / "gpu.json"
    code = bench_gpu.main(["--device", "cpu", "--quick", "-o", str(output)])
    document = json.loads(output.read_text())
    parts = document["parts"]
    assert list(parts) == list(bench_gpu.PARTS)
    assert {name: part["status"] for name, part in parts.items()} == dict.fromkeys(
        bench_gpu.PARTS, "ok"
    ), {n: p.get("error") for n, p in parts.items()}
    assert code == 0

    environment = parts["environment"]
    assert environment["device"] == "cpu" and environment["torch"]

    profiles = parts["profiles"]["results"]
    assert set(profiles) == {"tiny-gpt-small/fp32", "tiny-gpt-small/bf16"}
    for figures in profiles.values():
        assert "error" not in figures, figures["error"]
        assert figures["feasible"]
        assert figures["measured_step_s"] > 0 and figures["predicted_step_s"] > 0
        assert math.isfinite(figures["step_error"])
        assert figures["predicted_peak_gb"] > 0

    overhead = parts["overhead"]
    assert overhead["precision"] == "bf16"
    assert overhead["engine_samples_per_s"] > 0 and overhead["plain_samples_per_s"] > 0
    assert overhead["engine_one_micro_batch_samples_per_s"] > 0
    assert overhead["rounds"] == 1 and len(overhead["ratio_rounds"]) == 1  # --quick: one round
    assert overhead["ratio"] == pytest.approx(
        overhead["engine_one_micro_batch_samples_per_s"] / overhead["plain_samples_per_s"],
        rel=0.02,
    )
    assert overhead["ratio_job_micro_batches"] == pytest.approx(
        overhead["engine_samples_per_s"] / overhead["plain_samples_per_s"], rel=0.02
    )

    scripted = parts["runtime"]["scripted"]
    assert scripted["kinds"] == [
        "start",
        "intra-stage",
        "inter-stage",
        "pipeline",
        "checkpoint-restore",
    ]
    assert scripted["exactly_once"] and scripted["restores"] == 1
    assert scripted["steps_rolled_back"] == 2  # the steps after the restored checkpoint
    assert scripted["same_as_fault_free"], scripted["parameters_outside_tolerance"]
    assert scripted["max_abs_difference"] < gpu_parts.BF16_TOLERANCE["atol"] * 10
    train = parts["runtime"]["train"]
    assert train["exit_code"] == 0, train.get("stderr")
    assert train["exactly_once"] and train["steps_completed"] == 12
    assert train["devices"] and set(train["devices"].values()) == {"cpu"}

    nccl = parts["nccl"]
    assert nccl["backend"] == "gloo" and nccl["allreduce_correct"]
    assert nccl["call_after_abort"] == "CommAborted"
    assert nccl["next_generation_after_abort"] == "ok"
    assert nccl["environment"] == {
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    }
    assert nccl["not_run"]


def test_a_part_past_its_limit_is_killed_and_the_others_keep_their_figures(tmp_path: Path) -> None:
    """A part past its limit (here: still importing torch) is killed with its children."""
    part = bench_gpu.run_isolated("nccl", "cpu", True, 0.5, tmp_path)
    assert part["status"] == "timeout" and "limit of 0.5 s" in part["error"]
    assert part["wall_s"] < 30
    done = bench_gpu.run_isolated("environment", "cpu", True, 120, tmp_path)
    assert done["status"] == "ok" and done["device"] == "cpu"


def test_a_part_that_fails_records_its_error(tmp_path: Path, monkeypatch) -> None:
    """``--device cuda`` where no GPU is visible: the part says so in its figures."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    part = bench_gpu.run_isolated("environment", "cuda", True, 120, tmp_path)
    assert part["status"] == "error"
    assert "no CUDA device" in part["error"]
    assert part["torch"]  # the figures before the failure are kept
