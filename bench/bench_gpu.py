"""Every CUDA path of liveput, measured by one command that fits a short GPU lease.

``python -m bench gpu [--device cuda|cpu] [--quick] [-o FILE]`` runs five parts, each in its own
process under its own time limit (a part that hangs is killed and the others keep their
figures), writes one JSON document (``-o``, rewritten after every part) and prints a table:

1. ``environment``: torch, CUDA and NCCL versions, the GPU's name and memory, bf16 support.
2. ``profiles``: ``liveput profile`` of each model in fp32 and bf16, and the estimator's
   prediction from that profile for the GPU's catalog entry (its memory per GPU) against one
   instance's measured step time and peak memory at (D, P) = (1, 1), the one configuration one
   GPU runs alone: the error of each quantity.
3. ``overhead``: one agent (the engine under the commit protocol, at (1, 1)) training in bf16,
   samples/s against a plain PyTorch loop of the same model, batch and precision (target
   >= 0.9), in three rounds of each taken in turn (the medians of their medians).
4. ``runtime``: agents sharing the device through a scripted run with an intra-stage, an
   inter-stage and a pipeline migration and a loss without notice that forces a checkpoint
   restore: exactly once, and the final parameters equal to a fault-free run's on the same
   device within bf16's tolerance; then ``liveput train --device`` with several agents. Agents
   sharing one GPU communicate over gloo, every message staged through CPU memory (NCCL refuses
   two ranks on one GPU).
5. ``nccl``: the runtime's error-handling settings, a single-rank group built as the runtime
   builds it (NCCL on CUDA, gloo on the CPU), an all-reduce, an abort, a group after the abort;
   what needs more than one GPU is listed as not run.

``--device cpu --quick`` runs the same code on the CPU with small models in under 2 minutes (the
test suite runs it); the full CUDA run takes under 8 minutes on one H100.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_parts import LIMITS_S, PARTS, repository_environment, run_part

_REPO = Path(__file__).resolve().parents[1]


def run_isolated(name: str, request: str, quick: bool, limit_s: float, directory: Path) -> dict:
    """Part ``name`` in a child process killed (with its children) after ``limit_s``."""
    result = directory / f"{name}.json"
    log = directory / f"{name}.log"
    command = [
        sys.executable,
        "-m",
        "bench.bench_gpu",
        "--part",
        name,
        "--device",
        request,
        "--result",
        str(result),
    ] + (["--quick"] if quick else [])
    started = time.perf_counter()
    cpu_before_s = _children_cpu_s()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command,
            env=repository_environment(),
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=_REPO,
            start_new_session=True,
        )
        timed_out = False
        try:
            process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    data: dict = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(result.read_text())
    if timed_out:
        data["status"] = "timeout"
        data["error"] = f"killed after its limit of {limit_s:g} s (figures above: before that)"
    elif data.get("status") not in ("ok", "error"):
        data["status"] = "error"
        data["error"] = f"the part's process ended with exit code {process.returncode}"
    if data["status"] != "ok":
        with contextlib.suppress(OSError):
            data["log_tail"] = log.read_text(errors="replace")[-2000:]
    data["limit_s"] = limit_s
    data["wall_s"] = round(time.perf_counter() - started, 2)
    # CPU seconds of the part's processes (those waited for): its cost whatever else loads
    # the machine, which its wall time is not.
    data["cpu_s"] = round(_children_cpu_s() - cpu_before_s, 2)
    return data


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summary_rows(document: dict) -> list[tuple[str, str, str]]:
    """(part, status, figures) for the table."""
    parts = document["parts"]
    rows = []
    for name in PARTS:
        part = parts.get(name, {})
        status = part.get("status", "not run")
        figures = part.get("error", "") if status != "ok" else _figures(name, part)
        timing = f"{part.get('wall_s', 0):.0f} s, cpu {part.get('cpu_s', 0):.0f} s"
        rows.append((name, f"{status} ({timing})", figures))
    return rows


def _figures(name: str, part: dict) -> str:
    if name == "environment":
        return (
            f"torch {part.get('torch')} cuda {part.get('cuda_build')} "
            f"{part.get('gpu', part.get('device'))} {part.get('gpu_memory_gb', '')} "
            f"nccl {part.get('nccl', '-')} bf16 {part.get('bf16_supported')}"
        )
    if name == "profiles":
        return "; ".join(
            f"{key}: step {r['measured_step_s'] * 1e3:.1f} ms (pred {_percent(r['step_error'])})"
            f", mem {_gb(r['measured_peak_gb'])} (pred {_percent(r['memory_error'])})"
            if "error" not in r
            else f"{key}: {r['error']}"
            for key, r in part.get("results", {}).items()
        )
    if name == "overhead":
        return (
            f"{part['model']} bf16, batch {part['global_batch']} as one micro-batch: engine "
            f"{part['engine_one_micro_batch_samples_per_s']} / plain "
            f"{part['plain_samples_per_s']} samples/s = {part['ratio']} (target >= "
            f"{part['target']}: {'PASS' if part['passed'] else 'FAIL'}; rounds "
            f"{part['ratio_rounds']}); in the job's "
            f"{part['micro_batches']} micro-batches: engine {part['engine_samples_per_s']}, "
            f"{part['ratio_to_accumulating']}x a plain loop of the same micro-batches"
        )
    if name == "runtime":
        scripted, train = part.get("scripted", {}), part.get("train", {})
        text = (
            f"scripted {'->'.join(scripted.get('kinds', []))}: exactly once "
            f"{scripted.get('exactly_once')}, same as fault-free "
            f"{scripted.get('same_as_fault_free')} (max diff "
            f"{scripted.get('max_abs_difference', float('nan')):.2g})"
            if "error" not in scripted
            else f"scripted: {scripted['error']}"
        )
        if train.get("exit_code") == 0:
            text += (
                f"; train: {train['steps_completed']} steps, exactly once "
                f"{train['exactly_once']}, migrations {train['migrations']}"
            )
        else:
            text += f"; train: exit {train.get('exit_code')}"
        return text
    if name == "nccl":
        return (
            f"{part['backend']} single rank: init {part['init_s']} s, all-reduce "
            f"{part['allreduce_correct']}, abort {part['abort_s']} s, after abort "
            f"{part['call_after_abort']}; not run: {len(part['not_run'])} (need 2 GPUs)"
        )
    return ""


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.0f} %"


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} GB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench gpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--quick", action="store_true", help="small models and few steps (the suite's CPU run)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="write the JSON document here"
    )
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.part is not None:
        run_part(args.part, args.device, args.quick, args.result)
        # Without the interpreter's finalization: an aborted NCCL group, parked as the runtime
        # parks it, must not hold the exit (the figures are written already).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    limits = LIMITS_S["quick" if args.quick else "full"]
    document: dict = {
        "bench": "gpu",
        "device": args.device,
        "quick": args.quick,
        "command": "python -m bench gpu " + " ".join(argv or sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "limits_s": limits,
        "parts": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        for name in PARTS:
            print(f"bench gpu: {name} (limit {limits[name]} s)", file=sys.stderr, flush=True)
            document["parts"][name] = run_isolated(
                name, args.device, args.quick, limits[name], Path(scratch)
            )
            document["wall_s"] = round(time.perf_counter() - started, 1)
            if args.output is not None:
                args.output.parent.mkdir(parents=True, exist_ok=True)
                args.output.write_text(json.dumps(document, indent=1) + "\n")
    _print_table(document)
    return 0 if all(p["status"] == "ok" for p in document["parts"].values()) else 1


def _print_table(document: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"bench gpu --device {document['device']}"
        f"{' --quick' if document['quick'] else ''}: "
        f"{document['wall_s']:.0f} s"
    )
    for column in ("part", "status", "figures"):
        table.add_column(column, overflow="fold")
    for row in summary_rows(document):
        table.add_row(*row)
    Console(width=160).print(table)


if __name__ == "__main__":
    sys.exit(main())
