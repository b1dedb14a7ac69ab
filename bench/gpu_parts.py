"""The five parts of ``python -m bench gpu`` (:mod:`bench.bench_gpu`), each run in a process of
its own: ``python -m bench.bench_gpu --part NAME`` calls :func:`run_part`, which writes the part's
figures to a JSON file after every one, and its error string if it fails."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from liveput.models.job import Job

PARTS = ("environment", "profiles", "overhead", "runtime", "nccl")
LIMITS_S = {
    "full": {"environment": 40, "profiles": 110, "overhead": 80, "runtime": 200, "nccl": 45},
    "quick": {"environment": 60, "profiles": 120, "overhead": 120, "runtime": 240, "nccl": 60},
}
"""Each part's time limit, wall seconds: the full set sums to under 8 minutes; the quick one's
are safety nets, generous for a loaded CPU machine (unloaded, the whole quick run takes less
than 2 minutes)."""
OVERHEAD_TARGET = 0.9
"""The engine's samples/s over a plain loop's, at least."""
BF16_TOLERANCE = {"rtol": 1e-2, "atol": 1e-3}
"""A bf16 run against the fault-free one on the same device: replicas sum their gradients in
another order and compute half batches, so a weight may round to the next bf16 value (relative
step 2^-8) in a forward; the update carries that on."""
FP32_TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
RUNTIME_JOB = "tiny-gpt-small"
"""The job of the scripted migrations (small: the part checks paths, not speed)."""
_REPO = Path(__file__).resolve().parents[1]


def _models(quick: bool) -> tuple[str, ...]:
    return ("tiny-gpt-small",) if quick else ("gpt2-small", "llama-tiny")


def _overhead_model(quick: bool) -> str:
    return "tiny-gpt-small" if quick else "gpt2-small"


# --- one part, in its own process -------------------------------------------------------------
class PartRecord:
    """A part's figures, written to ``path`` after every one (a killed part leaves them)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = {"status": "running"}

    def put(self, key: str, value: object) -> None:
        self.data[key] = value
        self.flush()

    def flush(self) -> None:
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.data, indent=1, default=str))
        scratch.replace(self.path)


def _device(request: str) -> str:
    from liveput.runtime.device import resolve_device

    return resolve_device(request, "bench gpu")


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def part_environment(record: PartRecord, request: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    record.put("python", platform.python_version())
    record.put("torch", torch.__version__)
    record.put("cuda_build", torch.version.cuda)
    record.put("cuda_available", torch.cuda.is_available())
    record.put("cpu_count", os.cpu_count())
    record.put("nccl_available", dist.is_nccl_available())
    # The installed distribution's version, which transformers' own __version__ repeats:
    # importing the package for it took about 0.9 CPU-s of this part.
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        record.put("transformers", importlib.metadata.version("transformers"))
    device = _device(request)
    record.put("device", device)
    if device.startswith("cuda"):
        properties = torch.cuda.get_device_properties(torch.device(device))
        record.put("gpu", properties.name)
        record.put("gpu_memory_gb", round(properties.total_memory / 1e9, 2))
        record.put("gpu_count", torch.cuda.device_count())
        record.put("compute_capability", f"{properties.major}.{properties.minor}")
        record.put("bf16_supported", bool(torch.cuda.is_bf16_supported()))
        with contextlib.suppress(Exception):
            version = torch.cuda.nccl.version()
            record.put(
                "nccl", ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
            )
    else:
        record.put("cpu", platform.processor() or platform.machine())
        record.put("bf16_supported", True)  # autocast on the CPU (emulated where no AVX512)


def _catalog_entry(device: str) -> dict | None:
    """The catalog instance type with this GPU, as the estimator sees one GPU of it (memory
    per GPU); None on the CPU or for a GPU the catalog does not list."""
    if not device.startswith("cuda"):
        return None
    import torch

    from liveput.catalog import load_catalog

    name = torch.cuda.get_device_name(torch.device(device)).upper()
    matches = [
        spec
        for spec in load_catalog("aws").gpu_types
        if spec.gpu and spec.gpus and spec.gpu.upper() in name.split()
    ]
    if not matches:
        matches = [
            spec
            for spec in load_catalog("aws").gpu_types
            if spec.gpu and spec.gpus and spec.gpu.upper() in name
        ]
    if not matches:
        return None
    spec = min(matches, key=lambda s: s.gpus)
    return {
        "instance_type": spec.name,
        "gpu": spec.gpu,
        "gpus": spec.gpus,
        "memory_gb_per_gpu": spec.gpu_memory_gb / spec.gpus,
        "network_gbps": spec.network_gbps,
        "spot_usd_per_hour": spec.spot_usd_per_hour,
        "on_demand_usd_per_hour": spec.on_demand_usd_per_hour,
    }


def _with_precision(job: Job, precision: str) -> Job:
    return dataclasses.replace(job, training=dataclasses.replace(job.training, precision=precision))


def measure_step(job: Job, device: str, steps: int) -> tuple[float, float | None]:
    """(median seconds per step, peak allocated GB or None on the CPU) of one instance
    training ``job`` at (1, 1) through the engine's schedule and optimizer step."""
    import torch

    from liveput.runtime.layer_state import fresh_layer
    from liveput.runtime.optimizer_step import OptimizerStep
    from liveput.runtime.schedule import StagePosition, compute_gradients

    torch_device = torch.device(device)
    # Whatever the process still holds on the GPU (an earlier model) is not this step's.
    baseline = torch.cuda.memory_allocated(torch_device) if device.startswith("cuda") else 0
    layers = [fresh_layer(job, i, torch_device) for i in range(job.num_layers)]
    update = OptimizerStep(job.training)
    position = StagePosition(0, 0, 1, 1, None, None)
    times = []
    for step in range(steps + 2):
        if step == 2 and device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(torch_device)
        _sync(device)
        start = time.perf_counter()
        loss = compute_gradients(job, layers, position, None, step, update.loss_scale)
        update.apply(
            layers,
            step,
            update.decide(layers, job.num_layers, nonfinite_loss=not math.isfinite(loss)),
        )
        _sync(device)
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
    peak_gb = None
    if device.startswith("cuda"):
        peak_gb = (torch.cuda.max_memory_allocated(torch_device) - baseline) / 1e9
    del layers
    return _median(times), peak_gb


def _error(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return round((predicted - measured) / measured, 4)


def part_profiles(record: PartRecord, request: str, quick: bool) -> None:
    from liveput.cli.main import main as cli

    device = _device(request)
    entry = _catalog_entry(device)
    record.put("device", device)
    record.put("catalog_entry", entry)
    record.put("not_run", "(D, P) with D x P > 1: one GPU runs one instance alone")
    results: dict[str, dict] = {}
    record.put("results", results)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-profiles-") as scratch:
        for model in _models(quick):
            for precision in ("fp32", "bf16"):
                key = f"{model}/{precision}"
                try:
                    results[key] = _profile_against_estimate(
                        cli,
                        model,
                        precision,
                        device,
                        entry,
                        quick,
                        Path(scratch) / f"{model}-{precision}.json",
                    )
                except Exception as error:  # noqa: BLE001 - the next model still runs
                    results[key] = {"error": _describe(error)}
                record.flush()
                _free(device)


def _profile_against_estimate(
    cli: Callable[[list[str]], int],
    model: str,
    precision: str,
    device: str,
    entry: dict | None,
    quick: bool,
    path: Path,
) -> dict:
    """``liveput profile`` of ``model`` in ``precision``, the estimator's (1, 1) step time and
    memory from it, one instance's measured step time and peak memory."""
    from liveput.models.jobs import resolve_job
    from liveput.perf.estimator import Calibration, estimate_configs
    from liveput.perf.profile_io import read_profile
    from liveput.perf.types import InstanceType

    started = time.perf_counter()
    code = cli(
        [
            "--quiet",
            "profile",
            "--model",
            model,
            "--device",
            device,
            "--precision",
            precision,
            "--repeats",
            "1" if quick else "3",
            "-o",
            str(path),
        ]
    )
    if code != 0:
        return {"error": f"liveput profile exited {code}"}
    profile = dataclasses.replace(read_profile(path), activation_checkpointing="none")
    if entry is not None:
        profile = dataclasses.replace(
            profile,
            instance_type=InstanceType(
                entry["instance_type"],
                entry["memory_gb_per_gpu"],
                entry["network_gbps"],
                entry["spot_usd_per_hour"],
                entry["on_demand_usd_per_hour"],
            ),
        )
    profile_s = time.perf_counter() - started
    # The profile is this machine's measurement: no built-in calibration applies.
    table = estimate_configs(profile, 1, Calibration())
    rate = float(table.samples_per_s[0])
    predicted_s = profile.global_batch_size / rate if rate > 0 else None
    job = _with_precision(resolve_job(model), precision)
    measured_s, peak_gb = measure_step(job, device, 2 if quick else 8)
    predicted_gb = float(table.memory_gb[0])
    return {
        "profile_s": round(profile_s, 2),
        "layers": profile.num_layers,
        "params_m": round(profile.num_params / 1e6, 2),
        "global_batch": profile.global_batch_size,
        "micro_batch": profile.micro_batch_size,
        "feasible": bool(table.feasible[0]),
        "measured_step_s": round(measured_s, 5),
        "predicted_step_s": None if predicted_s is None else round(predicted_s, 5),
        "step_error": _error(predicted_s, measured_s),
        "measured_peak_gb": None if peak_gb is None else round(peak_gb, 3),
        "predicted_peak_gb": round(predicted_gb, 3),
        "memory_error": _error(predicted_gb, peak_gb),
    }


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _global_batch(job: Job, step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    batches = [job.micro_batch(step, j) for j in range(job.num_micro_batches)]
    return (
        torch.cat([b[0] for b in batches]).to(device),
        torch.cat([b[1] for b in batches]).to(device),
    )


def plain_loop(job: Job, device: str, steps: int, accumulate: bool = False) -> float:
    """Median seconds per step of a plain PyTorch loop: one model, one optimizer, the whole
    batch, the job's precision (autocast), the loss read every step as a training script
    logs it; ``accumulate``: the job's micro-batches one by one, their gradients accumulated
    (what the engine runs in bf16 at P = 1, so that every (D, P) computes the same)."""
    import torch
    from torch import nn

    from liveput.runtime.optimizer_step import autocast

    torch_device = torch.device(device)
    model = nn.Sequential(*[copy.deepcopy(layer) for layer in job.layers]).to(torch_device)
    optimizer = job.optimizer(list(model.parameters()))
    times = []
    for step in range(steps + 2):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if accumulate:
            total = 0.0
            for j in range(job.num_micro_batches):
                inputs, targets = (part.to(torch_device) for part in job.micro_batch(step, j))
                with autocast(job.training, torch_device):
                    loss = job.loss_fn(model(inputs), targets) / job.num_micro_batches
                loss.backward()
                total += loss.item()
        else:
            inputs, targets = _global_batch(job, step, torch_device)
            with autocast(job.training, torch_device):
                loss = job.loss_fn(model(inputs), targets)
            loss.backward()
            loss.item()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - start)
    return _median(times)


def engine_loop(job: Job, device: str, steps: int, directory: str) -> float:
    """Median seconds per step of one agent's engine at (1, 1): the signed TCP store, the
    commit protocol and the ledger (no checkpoints: the loop writes none either)."""
    from liveput.runtime import protocol
    from liveput.runtime.checkpoint import Checkpointer
    from liveput.runtime.engine import Engine, EngineConfig
    from liveput.runtime.store import SignedStore, TCPStoreBackend

    hosted = TCPStoreBackend("127.0.0.1", 0, host=True)
    store = SignedStore(hosted, "bench-gpu")
    try:
        engine = Engine(
            job,
            0,
            store,
            lambda plan, rank: None,
            Checkpointer(store, directory),
            EngineConfig(checkpoint_every=0, device=device),
        )
        plan = protocol.RuntimePlan(
            0,
            0,
            0,
            steps + 3,
            1,
            1,
            [0, job.num_layers],
            {0: (0, 0)},
            {0: "127.0.0.1"},
            [],
            "start",
            protocol.FRESH_START,
        )
        protocol.fence(store, 0, steps + 2, 1)
        engine.run_generation(plan)
        engine.checkpointer.close()
        committed = sorted(
            json.loads(v)["committed_unix_s"] for v in store.get_prefix("ledger/").values()
        )
    finally:
        store.close()
    gaps = [b - a for a, b in itertools.pairwise(committed[1:])]
    return _median(gaps)


def part_overhead(record: PartRecord, request: str, quick: bool) -> None:
    from liveput.models.jobs import resolve_job

    device = _device(request)
    model = _overhead_model(quick)
    job = _with_precision(resolve_job(model), "bf16")
    # Rounds of the plain loop and the engine, taken in turn: on the H100 one round of each
    # (30 steps, the medians) gave ratios of 0.77 and 0.97 in two runs of this part, and rounds
    # in turn in one process 0.74, 0.77 and 1.14; the medians of the rounds' medians compare
    # what drifts between rounds alike.
    rounds = 1 if quick else 3
    steps = 4 if quick else 20
    record.put("device", device)
    record.put("model", model)
    record.put("precision", "bf16")
    record.put("global_batch", job.global_batch_size)
    record.put("steps", steps)
    record.put("rounds", rounds)
    # The same computation as the plain loop: the whole batch as one micro-batch. A job's
    # micro-batches are fixed whatever (D, P) runs it (that is what makes a migration exact),
    # so a lone instance computes them one at a time; their size is the job's choice.
    whole = dataclasses.replace(job, micro_batch_size=job.global_batch_size)
    plain_rounds, whole_rounds = [], []
    for _ in range(rounds):
        plain_rounds.append(plain_loop(job, device, steps))
        _free(device)
        with tempfile.TemporaryDirectory(prefix="bench-gpu-overhead-") as scratch:
            whole_rounds.append(engine_loop(whole, device, steps, scratch))
        _free(device)
    plain_s, whole_s = _median(plain_rounds), _median(whole_rounds)
    record.put("plain_samples_per_s", round(job.global_batch_size / plain_s, 2))
    record.put("engine_one_micro_batch_samples_per_s", round(job.global_batch_size / whole_s, 2))
    record.put(
        "ratio_rounds", [_figures(p / w) for p, w in zip(plain_rounds, whole_rounds, strict=True)]
    )
    accumulating_s = plain_loop(job, device, steps, accumulate=True)
    record.put("plain_accumulating_samples_per_s", round(job.global_batch_size / accumulating_s, 2))
    record.put("micro_batches", job.num_micro_batches)
    _free(device)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-overhead-") as scratch:
        engine_s = engine_loop(job, device, steps, scratch)
    record.put("engine_samples_per_s", round(job.global_batch_size / engine_s, 2))
    record.put("ratio_job_micro_batches", _figures(plain_s / engine_s))
    # The engine's own cost: against the same loop running the same micro-batches.
    record.put("ratio_to_accumulating", _figures(accumulating_s / engine_s))
    _free(device)
    ratio = plain_s / whole_s
    record.put("ratio", _figures(ratio))
    record.put("target", OVERHEAD_TARGET)
    record.put("passed", ratio >= OVERHEAD_TARGET)


def _figures(ratio: float) -> float:
    """Four significant figures: three decimals made a loaded machine's ratio of 0.0165 read
    0.016, 3 % off the throughputs it is the quotient of."""
    return float(f"{ratio:.4g}")


def scripted_migrations(device: str, directory: str, precision: str = "bf16") -> dict:
    """Agents (threads, sharing ``device``) through (2,2) -> intra-stage (1,2) ->
    inter-stage (2,2) -> pipeline (1,4) -> a stage lost without notice, restored from the
    checkpoint at (1,2); exactly once and the final parameters against a fault-free run of
    the same steps on the same device."""
    import torch

    from liveput.models.jobs import resolve_job
    from liveput.perf.configuration import Configuration
    from liveput.runtime.engine import EngineConfig
    from liveput.runtime.inprocess import ThreadCluster
    from liveput.runtime.ledger import verify_ledger
    from liveput.runtime.planning import profile_job
    from liveput.testbed.reference import reference_layers

    steps = 12
    job = _with_precision(resolve_job(RUNTIME_JOB), precision)
    started = time.perf_counter()
    cluster = ThreadCluster(
        job,
        profile_job(job, repeats=1, device=device),
        directory,
        steps,
        EngineConfig(
            checkpoint_every=3, comm_timeout_s=60, device=device, shared_gpu=device != "cpu"
        ),
    )
    cluster.migrate(Configuration(2, 2), set(), [0, 1, 2, 3], 2)
    cluster.migrate(Configuration(1, 2), {3}, [], 4)
    cluster.migrate(Configuration(2, 2), set(), [4, 5], 6)
    cluster.migrate(Configuration(1, 4), set(), [], 8)
    lost = cluster.plan.instance_at(0, 3)  # its stage's only holder: gone without a notice
    cluster.migrate(Configuration(1, 2), {lost}, [], steps)
    cluster.checkpointer.flush()
    run_s = time.perf_counter() - started
    report = verify_ledger(cluster.store, job.global_batch_size, steps)
    final = [
        cluster.checkpointer.load_layer_file(f"final/layer-{i}.pt")["module"]
        for i in range(job.num_layers)
    ]
    reference = [layer.module.state_dict() for layer in reference_layers(job, steps, device)]
    tolerance = FP32_TOLERANCE if precision == "fp32" else BF16_TOLERANCE
    worst, mismatched, total = 0.0, [], 0
    for index, (got, want) in enumerate(zip(final, reference, strict=True)):
        for name, value in want.items():
            value = value.detach().float().cpu()
            other = got[name].detach().float().cpu()
            total += 1
            worst = max(worst, float((other - value).abs().max()))
            if not torch.allclose(other, value, **tolerance):
                mismatched.append(f"{index}.{name}")
    cluster.checkpointer.close()
    return {
        "job": RUNTIME_JOB,
        "precision": precision,
        "steps": steps,
        "agents_at_most": 4,
        "kinds": cluster.kinds,
        "exactly_once": report.exactly_once,
        "steps_rolled_back": report.steps_rolled_back,
        "restores": report.restores,
        "tolerance": tolerance,
        "max_abs_difference": worst,
        "parameters": total,
        "parameters_outside_tolerance": mismatched,
        "same_as_fault_free": not mismatched,
        "wall_s": round(run_s, 2),
    }


def train_command(request: str, quick: bool, directory: Path, limit_s: float) -> dict:
    """``liveput train --device`` with several agents sharing this machine; its summary."""
    output = directory / "train.json"
    workers, steps, scale = (2, 12, 6.0) if quick else (4, 120, 4.0)
    command = [
        sys.executable,
        "-m",
        "liveput.cli.main",
        "--quiet",
        "train",
        "--model",
        RUNTIME_JOB,
        "--workers",
        str(workers),
        "--steps",
        str(steps),
        "--time-scale",
        str(scale),
        "--device",
        request,
        "--checkpoint-every",
        "5",
        "--precision",
        "bf16",
        "-o",
        str(output),
        "--log-dir",
        str(directory / "logs"),
        "--json",
    ]
    started = time.perf_counter()
    completed = subprocess.run(
        command,
        env=repository_environment(),
        capture_output=True,
        text=True,
        timeout=limit_s,
        check=False,
    )
    result: dict = {
        "command": " ".join(command[1:]),
        "exit_code": completed.returncode,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    if completed.returncode != 0:
        result["stderr"] = completed.stderr[-2000:]
        return result
    summary = json.loads(output.read_text())
    result.update(
        {
            key: summary.get(key)
            for key in (
                "steps_completed",
                "exactly_once",
                "preemptions",
                "allocations",
                "migrations",
                "steps_rolled_back",
                "initial_loss",
                "final_loss",
                "devices",
                "device",
            )
        }
    )
    return result


def part_runtime(record: PartRecord, request: str, quick: bool) -> None:
    device = _device(request)
    record.put("device", device)
    record.put(
        "communication",
        "gloo, every message staged through CPU memory (agents share "
        "one device; NCCL refuses two ranks on one GPU)"
        if device != "cpu"
        else "gloo",
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-runtime-") as scratch:
        try:
            record.put("scripted", scripted_migrations(device, str(Path(scratch) / "ckpt")))
        except Exception as error:  # noqa: BLE001 - the train run below still runs
            record.put("scripted", {"error": _describe(error)})
        _free(device)
        left_s = LIMITS_S["quick" if quick else "full"]["runtime"] - (time.monotonic() - started)
        record.put("train", train_command(request, quick, Path(scratch), max(10.0, left_s - 5)))


def part_nccl(record: PartRecord, request: str, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    from liveput.runtime.comm import (
        NCCL_ERROR_HANDLING,
        CommAborted,
        Groups,
        configure_error_handling,
    )

    configure_error_handling()
    record.put("environment", {name: os.environ.get(name) for name in NCCL_ERROR_HANDLING})
    device = _device(request)
    torch_device = torch.device(device)
    record.put("backend", "nccl" if device != "cpu" else "gloo")
    store = dist.HashStore()
    started = time.perf_counter()
    groups = Groups.build(store, 0, 0, 1, None, torch_device, timeout_s=30.0)
    record.put("init_s", round(time.perf_counter() - started, 3))
    values = torch.arange(4, dtype=torch.float32, device=torch_device)
    started = time.perf_counter()
    groups.wait(groups.world.allreduce([values]))
    _sync(device)
    record.put("allreduce_s", round(time.perf_counter() - started, 4))
    record.put("allreduce_correct", bool(torch.equal(values.cpu(), torch.arange(4.0))))
    started = time.perf_counter()
    groups.abort()
    record.put("abort_s", round(time.perf_counter() - started, 3))
    try:
        groups.barrier()
        record.put("call_after_abort", "returned (expected CommAborted)")
    except CommAborted:
        record.put("call_after_abort", "CommAborted")
    again = Groups.build(store, 1, 0, 1, None, torch_device, timeout_s=30.0)
    again.barrier()
    record.put("next_generation_after_abort", "ok")
    again.close()
    record.put(
        "not_run",
        [
            "NCCL collectives and send/recv between ranks on distinct GPUs (needs 2 GPUs)",
            "abort of a rank blocked in an NCCL collective whose peer died (needs 2 GPUs)",
            "the blocking-wait timeout of a collective with a frozen peer (needs 2 GPUs)",
            "one agent per GPU of a multi-GPU instance (needs 2 GPUs)",
        ],
    )


PART_FUNCTIONS: dict[str, Callable[[PartRecord, str, bool], None]] = {
    "environment": part_environment,
    "profiles": part_profiles,
    "overhead": part_overhead,
    "runtime": part_runtime,
    "nccl": part_nccl,
}


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:2000]


def run_part(name: str, request: str, quick: bool, result: Path) -> int:
    """Run part ``name`` in this process, its figures (or its error) in ``result``."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    record = PartRecord(result)
    started = time.perf_counter()
    try:
        PART_FUNCTIONS[name](record, request, quick)
        record.data["status"] = "ok"
    except Exception as error:  # noqa: BLE001 - recorded: the other parts go on
        record.data["status"] = "error"
        record.data["error"] = _describe(error)
        record.data["traceback"] = traceback.format_exc()[-3000:]
    record.data["wall_s"] = round(time.perf_counter() - started, 2)
    record.flush()
    return 0


def repository_environment() -> dict[str, str]:
    """This environment with the repository on PYTHONPATH (run uninstalled from its root)."""
    paths = [str(_REPO / "src"), str(_REPO)]
    existing = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + ([existing] if existing else []))}
