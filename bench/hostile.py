"""Hostile and oversized input for every command: the corpus, and a runner that judges each case.

A :class:`Case` is a ``liveput`` command line run in a fresh folder holding its input files
(``{dir}`` in the arguments names that folder). :func:`run_case` runs it as its own process under
an address-space limit and a time limit and judges the outcome:

``ok``         a refusal in one line on stderr with exit code 2 (or exit 0 where the input is
               valid or merely large);
``traceback``  a Python traceback, or an exit code other than 0 and 2;
``hang``       still running at the time limit;
``accepted``   exit 0 for input that is bad;
``partial``    a refusal that left a file behind in the folder (or a temporary file anywhere);
``noisy``      a refusal in more than one line;
``memory``     a refusal that first grew past :data:`REFUSAL_MEMORY_MB`.

The corpus (:func:`corpus`) crosses every command's numeric options with bad numbers, every trace
reader with malformed traces, every output with impossible paths, every name with an unknown one,
the JSON and CSV inputs with malformed files, and adds large but plausible work.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from liveput.traces import generate_trace
from liveput.traces.formats import _events_text

REFUSAL_MEMORY_MB = 500.0
"""A refusal must come before the command grows past this."""
ADDRESS_SPACE_BYTES = 6 * 2**30
"""Address-space limit of each case (a runaway allocation fails instead of taking the machine)."""
BAD_NUMBERS = ("nan", "inf", "-inf", "-1", "abc", "", "1e400", "1e300")
BAD_WHOLE_NUMBERS = (*BAD_NUMBERS, "2.5")


@dataclass(frozen=True)
class Case:
    """One command line and the files it reads."""

    name: str
    argv: tuple[str, ...]
    """Arguments after ``liveput``; ``{dir}`` is the case's folder."""
    bad: bool = True
    """The input is bad: only a refusal (exit 2) is right. Otherwise exit 0 or a refusal."""
    files: tuple[tuple[str, bytes], ...] = ()
    """Files (name, content) put in the folder first."""
    folders: tuple[str, ...] = ()
    """Folders made in the folder first."""


@dataclass
class Outcome:
    """How a case ended, and the verdict."""

    case: Case
    code: int | None
    stderr: str
    seconds: float
    peak_mb: float
    verdict: str = "ok"
    left: list[str] = field(default_factory=list)


def valid_trace() -> bytes:
    return _events_text(generate_trace(8, 0.5, seed=1)).encode()


def malformed_traces() -> dict[str, bytes]:
    """Malformed traces, by what is wrong with them."""
    return {
        "binary": bytes(range(256)) * 8,
        "nul-bytes": b"0,add,a\x00\n60000,add,b\n",
        "empty": b"",
        "blank-lines": b"\n\n   \n",
        "nan-timestamp": b"0,add,a\nnan,add,b\n",
        "inf-timestamp": b"0,add,a\ninf,add,b\n",
        "huge-timestamp": b"0,add,a\n100000000000000,add,b\n",
        "backwards": b"60000,add,a\n0,add,b\n",
        "remove-absent": b"0,add,a\n1000,remove,b\n",
        "text-timestamp": b"0,add,a\nsoon,add,b\n",
        "csv-negative": b"time,count\n0,4\n60,-3\n",
        "csv-nan-time": b"time,count\n0,4\nnan,3\n",
        "csv-text-count": b"time,count\n0,4\n60,many\n",
        "csv-header-only": b"time,count\n",
        "csv-repeated-time": b"time,count\n0,4\n0,4\n",
        "json-truncated": b'{"metadata": {"gap_seconds": 60}, "data": [1, 2',
        "json-nan-gap": b'{"metadata": {"gap_seconds": NaN}, "data": [1, 2]}',
        "json-text-gap": b'{"metadata": {"gap_seconds": "soon"}, "data": [1, 2]}',
        "json-huge-gap": b'{"metadata": {"gap_seconds": 1e300}, "data": [1, 2]}',
        "json-text-data": b'{"metadata": {"gap_seconds": 60}, "data": [1, "x"]}',
        "json-list": b"[1, 2, 3]",
        "json-text-prices": b'{"metadata": {"gap_seconds": 60}, "data": [1, 2], "prices": ["x"]}',
        "text-bad-date": b"2024-13-40, 10:00:00, 3\n",
        "unknown-format": b"hello world\n",
    }


def _json_inputs() -> dict[str, bytes]:
    """Malformed JSON inputs (catalogs, profiles)."""
    return {
        "binary": bytes(range(256)) * 4,
        "truncated": b'{"types": [',
        "list": b"[1, 2]",
        "empty-object": b"{}",
        "nan-values": b'{"model": "m", "layers": NaN}',
        "empty": b"",
    }


# Numeric options of each command, with a base command line that is otherwise valid.
NUMERIC_OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, bool]]] = {
    # command: (base argv, {option: whole number?})
    "trace stats": (
        ("trace", "stats", "{dir}/trace.csv"),
        {"--interval": False, "--start-hour": False, "--end-hour": False},
    ),
    "trace generate": (
        ("trace", "generate", "-o", "{dir}/out.csv"),
        {"--nodes": True, "--hours": False, "--seed": True},
    ),
    "trace plot": (
        ("trace", "plot", "{dir}/trace.csv", "-o", "{dir}/out.png"),
        {"--start-hour": False, "--end-hour": False},
    ),
    "simulate": (
        ("simulate", "--trace", "{dir}/trace.csv", "--policies", "reactive"),
        {
            "--interval": False,
            "--horizon": True,
            "--on-demand": True,
            "--seed": True,
            "--spot-price": False,
            "--on-demand-price": False,
            "--preemption-notice": False,
            "--start-hour": False,
            "--end-hour": False,
        },
    ),
    "plan": (
        ("plan", "--nodes", "8", "--forecast", "8,8,8", "--horizon", "4"),
        {
            "--nodes": True,
            "--horizon": True,
            "--interval": False,
            "--on-demand": True,
            "--spread": True,
        },
    ),
    "perf": (("perf", "gpt-1.5b"), {"--nodes": True}),
    "predict backtest": (
        ("predict", "backtest", "{dir}/trace.csv", "--methods", "persistence"),
        {
            "--horizon": True,
            "--interval": False,
            "--warmup": True,
            "--start-hour": False,
            "--end-hour": False,
        },
    ),
    "predict plot": (
        ("predict", "plot", "{dir}/trace.csv", "-o", "{dir}/out.png"),
        {"--horizon": True, "--interval": False, "--warmup": True},
    ),
    "advise deepvm": (
        ("advise", "deepvm", "--budget-usd-per-hour", "3"),
        {
            "--budget-usd-per-hour": False,
            "--checkpoint-gb": False,
            "--checkpoint-interval-s": False,
        },
    ),
    "advise slo": (
        (
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "0.5",
        ),
        {"--target-loss": False, "--deadline-hours": False, "--max-workers": True},
    ),
    "advise pool": (
        (
            "advise",
            "pool",
            "--model",
            "gpt-1.5b",
            "--deadline-hours",
            "6",
            "--trace",
            "{dir}/trace.csv",
            "--target-samples",
            "2e6",
        ),
        {
            "--deadline-hours": False,
            "--target-samples": False,
            "--hours": False,
            "--interval": False,
        },
    ),
    "profile": (
        ("profile", "-o", "{dir}/profile.json"),
        {"--micro-batch": True, "--repeats": True},
    ),
    "train": (
        ("train", "--steps", "3"),
        {
            "--workers": True,
            "--time-scale": False,
            "--steps": True,
            "--checkpoint-every": True,
            "--notice-lead": False,
            "--seed": True,
            "--keep-checkpoints": True,
            "--budget-usd": False,
            "--budget-usd-per-hour": False,
        },
    ),
    "coordinator": (
        ("coordinator", "--token", "t"),
        {
            "--steps": True,
            "--checkpoint-every": True,
            "--capacity": True,
            "--workers": True,
            "--start-grace": False,
            "--interval": False,
            "--heartbeat-timeout": False,
        },
    ),
    "agent": (
        ("agent", "--coordinator", "127.0.0.1:1", "--token", "t"),
        {"--connect-timeout": False},
    ),
}

# Commands that read a trace, with the trace's place in their arguments.
TRACE_READERS = {
    "trace stats": ("trace", "stats", "{dir}/bad"),
    "trace plot": ("trace", "plot", "{dir}/bad", "-o", "{dir}/out.png"),
    "simulate": ("simulate", "--trace", "{dir}/bad", "--policies", "reactive"),
    "predict backtest": ("predict", "backtest", "{dir}/bad", "--methods", "persistence"),
    "predict plot": ("predict", "plot", "{dir}/bad", "-o", "{dir}/out.png"),
    "advise pool": (
        "advise",
        "pool",
        "--model",
        "gpt-1.5b",
        "--deadline-hours",
        "6",
        "--trace",
        "{dir}/bad",
        "--target-samples",
        "2e6",
    ),
}


def _number_cases() -> Iterator[Case]:
    for command, (base, options) in NUMERIC_OPTIONS.items():
        for option, whole in options.items():
            for value in BAD_WHOLE_NUMBERS if whole else BAD_NUMBERS:
                yield Case(
                    f"{command} {option}={value!r}",
                    (*base, option, value),
                    files=(("trace.csv", valid_trace()),),
                )


def _trace_cases() -> Iterator[Case]:
    for command, argv in TRACE_READERS.items():
        for what, content in malformed_traces().items():
            yield Case(f"{command} trace:{what}", argv, files=(("bad", content),))
        yield Case(f"{command} trace:missing", argv)
        yield Case(f"{command} trace:folder", argv, folders=("bad",))


def _output_cases() -> Iterator[Case]:
    trace = (("trace.csv", valid_trace()),)
    outputs = {
        "trace generate": ("trace", "generate", "--hours", "0.5", "-o", "{out}"),
        "trace plot": ("trace", "plot", "{dir}/trace.csv", "-o", "{out}"),
        "predict plot": (
            "predict",
            "plot",
            "{dir}/trace.csv",
            "--method",
            "persistence",
            "--warmup",
            "5",
            "--horizon",
            "3",
            "-o",
            "{out}",
        ),
        "simulate -o": (
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "--policies",
            "reactive",
            "-o",
            "{out}",
        ),
        "profile": ("profile", "-o", "{out}"),
        "train -o": ("train", "--steps", "3", "-o", "{out}"),
    }
    places = {
        "folder": "{dir}/sub",
        "missing-parent": "{dir}/no/such/out.png",
        "parent-is-file": "{dir}/trace.csv/out.png",
        "root": "/",
    }
    for command, argv in outputs.items():
        for what, out in places.items():
            filled = tuple(a.replace("{out}", out) for a in argv)
            yield Case(f"{command} out:{what}", filled, files=trace, folders=("sub",))
    for command in ("trace plot", "predict plot"):
        filled = tuple(a.replace("{out}", "{dir}/out.jpg") for a in outputs[command])
        yield Case(f"{command} out:not-png", filled, files=trace)
    for what, out in {"is-a-file": "{dir}/trace.csv", "missing-parent": "{dir}/no/report"}.items():
        yield Case(
            f"simulate --report:{what}",
            (
                "simulate",
                "--trace",
                "{dir}/trace.csv",
                "--policies",
                "reactive",
                "-o",
                "{dir}/sim.json",
                "--report",
                out,
            ),
            files=trace,
        )


def _name_cases() -> Iterator[Case]:
    trace = (("trace.csv", valid_trace()),)
    unknown = {
        "plan --model": ("plan", "--model", "bogus", "--nodes", "8", "--forecast", "8,8"),
        "plan --objective": ("plan", "--objective", "bogus", "--nodes", "8", "--forecast", "8,8"),
        "plan --current": ("plan", "--current", "9x9x9", "--nodes", "8", "--forecast", "8,8"),
        "perf model": ("perf", "bogus"),
        "simulate --model": ("simulate", "--trace", "{dir}/trace.csv", "--model", "bogus"),
        "simulate --policies": ("simulate", "--trace", "{dir}/trace.csv", "--policies", "bogus"),
        "simulate --objective": ("simulate", "--trace", "{dir}/trace.csv", "--objective", "x"),
        "trace generate --regime": ("trace", "generate", "-o", "{dir}/t.csv", "--regime", "x"),
        "trace stats --format": ("trace", "stats", "{dir}/trace.csv", "--format", "bogus"),
        "predict backtest --methods": (
            "predict",
            "backtest",
            "{dir}/trace.csv",
            "--methods",
            "bogus",
        ),
        "predict plot --method": (
            "predict",
            "plot",
            "{dir}/trace.csv",
            "-o",
            "{dir}/o.png",
            "--method",
            "bogus",
        ),
        "advise deepvm --catalog": (
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--catalog",
            "bogus",
        ),
        "advise deepvm --types": (
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--types",
            "bogus",
        ),
        "advise deepvm --revocation": (
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--revocation",
            "bogus",
        ),
        "advise slo --model": (
            "advise",
            "slo",
            "--model",
            "bogus",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "1",
        ),
        "advise slo --search": (
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "1",
            "--search",
            "bogus",
        ),
        "advise slo --ps-type": (
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "1",
            "--ps-type",
            "bogus",
        ),
        "advise slo --loss-params": (
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "1",
            "--loss-params",
            "1,nan",
        ),
        "advise pool --anchors": (
            "advise",
            "pool",
            "--model",
            "gpt-1.5b",
            "--deadline-hours",
            "6",
            "--trace",
            "{dir}/trace.csv",
            "--target-samples",
            "2e6",
            "--anchors",
            "x,-1",
        ),
        "advise catalog --catalog": ("advise", "catalog", "--catalog", "bogus"),
        "advise deepvm --network-bound": (
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--network-bound",
            "bogus",
        ),
        "plan --forecast": ("plan", "--nodes", "8", "--forecast", "8,x,8", "--horizon", "4"),
        "plan --forecast short": ("plan", "--nodes", "8", "--forecast", "8", "--horizon", "4"),
        "profile --device": ("profile", "--device", "bogus", "-o", "{dir}/p.json"),
        "profile --model": ("profile", "--model", "bogus", "-o", "{dir}/p.json"),
        "train --model": ("train", "--model", "bogus", "--steps", "3"),
        "train --precision": ("train", "--precision", "fp8", "--steps", "3"),
        "train --lr-schedule": ("train", "--lr-schedule", "cosine:warm=2", "--steps", "3"),
        "agent --notices": (
            "agent",
            "--coordinator",
            "127.0.0.1:1",
            "--token",
            "t",
            "--notices",
            "bogus",
        ),
        "unknown command": ("bogus",),
        "unknown option": ("trace", "stats", "{dir}/trace.csv", "--bogus"),
    }
    for name, argv in unknown.items():
        yield Case(f"unknown name: {name}", argv, files=trace)


def _file_cases() -> Iterator[Case]:
    for what, content in _json_inputs().items():
        files = (("input.json", content),)
        yield Case(
            f"advise deepvm --catalog file:{what}",
            ("advise", "deepvm", "--budget-usd-per-hour", "3", "--catalog", "{dir}/input.json"),
            files=files,
        )
        yield Case(
            f"plan --model file:{what}",
            ("plan", "--model", "{dir}/input.json", "--nodes", "8", "--forecast", "8,8"),
            files=files,
        )
        yield Case(f"perf file:{what}", ("perf", "{dir}/input.json"), files=files)
    speedups = {
        "binary": bytes(range(256)),
        "no-header": b"1,2,3\n",
        "nan": b"type,nodes,speedup\np3.2xlarge,nan,1\n",
        "text": b"type,nodes,speedup\np3.2xlarge,two,1\n",
    }
    for what, content in speedups.items():
        yield Case(
            f"advise deepvm --speedups file:{what}",
            ("advise", "deepvm", "--budget-usd-per-hour", "3", "--speedups", "{dir}/s.csv"),
            files=(("s.csv", content),),
        )


def _valid_cases() -> Iterator[Case]:
    trace = (("trace.csv", valid_trace()),)
    valid = {
        "trace stats": ("trace", "stats", "{dir}/trace.csv", "--json"),
        "trace generate": ("trace", "generate", "-o", "{dir}/t.csv", "--hours", "0.5"),
        "trace plot": ("trace", "plot", "{dir}/trace.csv", "-o", "{dir}/t.png"),
        "plan": ("plan", "--nodes", "8", "--forecast", "8,8,8", "--horizon", "4", "--json"),
        "perf": ("perf", "gpt-1.5b", "--nodes", "8", "--json"),
        "advise deepvm": ("advise", "deepvm", "--budget-usd-per-hour", "3", "--json"),
        "advise catalog": ("advise", "catalog", "--json"),
        "simulate": (
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "--policies",
            "reactive",
            "-o",
            "{dir}/s.json",
        ),
        "simulate --json": (
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "--policies",
            "reactive",
            "--json",
        ),
        "quiet simulate": (
            "--quiet",
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "--policies",
            "reactive",
        ),
        "plan with a longer forecast": (
            "plan",
            "--nodes",
            "8",
            "--forecast",
            "8,8,8,8,8",
            "--horizon",
            "4",
        ),
        "advise deepvm --network-bound stream": (
            "advise",
            "deepvm",
            "--budget-usd-per-hour",
            "3",
            "--network-bound",
            "stream",
        ),
    }
    for name, argv in valid.items():
        yield Case(f"valid: {name}", argv, bad=False, files=trace)
    # Large but plausible work: done within the limits, or refused in one line.
    large = {
        "plan --nodes 2000": (
            "plan",
            "--nodes",
            "2000",
            "--forecast",
            "2000,2000",
            "--horizon",
            "3",
            "--json",
        ),
        "perf --nodes 100000": ("perf", "gpt-1.5b", "--nodes", "100000", "--json"),
        "trace generate 2000 nodes 48 h": (
            "trace",
            "generate",
            "-o",
            "{dir}/big.csv",
            "--nodes",
            "2000",
            "--hours",
            "48",
        ),
        "trace generate a year": ("trace", "generate", "-o", "{dir}/year.csv", "--hours", "8784"),
        "advise slo exact 64": (
            "advise",
            "slo",
            "--model",
            "resnet152",
            "--target-loss",
            "0.5",
            "--deadline-hours",
            "1",
            "--search",
            "exact",
            "--max-workers",
            "64",
            "--json",
        ),
        "simulate 1-ms intervals": (
            "simulate",
            "--trace",
            "{dir}/trace.csv",
            "--interval",
            "0.001",
            "--policies",
            "reactive",
        ),
    }
    for name, argv in large.items():
        yield Case(f"large: {name}", argv, bad=False, files=trace)
    # Every policy plans 2,000 instances: 48 hours of them take minutes, past a
    # case's time limit, so the long trace runs the restarting policies and a short one all.
    big = _events_text(generate_trace(2000, 48, seed=0)).encode()
    yield Case(
        "large: simulate a 2000-instance 48-h trace",
        ("simulate", "--trace", "{dir}/big.csv", "--policies", "reactive,checkpoint"),
        bad=False,
        files=(("big.csv", big),),
    )
    short = _events_text(generate_trace(2000, 2, seed=0)).encode()
    yield Case(
        "large: simulate a 2000-instance 2-h trace with every policy",
        ("simulate", "--trace", "{dir}/short.csv"),
        bad=False,
        files=(("short.csv", short),),
    )


def corpus() -> list[Case]:
    """Every case, in a fixed order."""
    return [
        *_number_cases(),
        *_trace_cases(),
        *_output_cases(),
        *_name_cases(),
        *_file_cases(),
        *_valid_cases(),
    ]


# A small launcher forks the command and reports its peak memory. The command is not forked
# from the caller directly: Linux carries a process's memory high-water mark across exec, so a
# child forked from a large process (pytest with torch loaded) would report the parent's size.
_LAUNCHER = """
import os, resource, sys
limit, report = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "liveput.cli.main", *sys.argv[3:]])
_, status, usage = os.wait4(pid, 0)
with open(report, "w") as out:
    out.write(str(usage.ru_maxrss))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_case(case: Case, timeout_s: float = 60.0) -> Outcome:
    """Run ``case`` in a fresh folder, as its own process, and judge it."""
    folder = Path(tempfile.mkdtemp(prefix="liveput-hostile-"))
    report = Path(tempfile.mkstemp(prefix="liveput-hostile-rss-")[1])
    try:
        for name, content in case.files:
            (folder / name).write_bytes(content)
        for name in case.folders:
            (folder / name).mkdir()
        before = {p.relative_to(folder) for p in folder.rglob("*")}
        argv = [a.replace("{dir}", str(folder)) for a in case.argv]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "COLUMNS": "120",
            "LIVEPUT_TOKEN": "hostile",
        }
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(ADDRESS_SPACE_BYTES), str(report), *argv],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        hung = threading.Event()

        def kill() -> None:
            hung.set()
            os.killpg(process.pid, signal.SIGKILL)

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        try:
            _, stderr = process.communicate()
        finally:
            timer.cancel()
        code: int | None = None if hung.is_set() else process.returncode
        peak_kb = float(report.read_text() or 0) if report.stat().st_size else 0.0
        seconds = time.monotonic() - started
        text = stderr.decode(errors="replace")
        outcome = Outcome(case, code, text, seconds, peak_kb / 1024.0)
        after = {p.relative_to(folder) for p in folder.rglob("*")}
        outcome.left = sorted(str(p) for p in after - before if code != 0 or p.name.startswith("."))
        outcome.verdict = _verdict(outcome)
        return outcome
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        report.unlink(missing_ok=True)


def _verdict(outcome: Outcome) -> str:
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    if outcome.code is None:
        return "hang"
    if "Traceback (most recent call last)" in outcome.stderr or outcome.code not in (0, 2):
        return "traceback"
    if outcome.code == 0:
        return "accepted" if outcome.case.bad else ("partial" if outcome.left else "ok")
    if outcome.left:
        return "partial"
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return "noisy"
    if outcome.peak_mb > REFUSAL_MEMORY_MB:
        return "memory"
    return "ok"


def summary(outcomes: list[Outcome]) -> dict[str, object]:
    """Counts by verdict, and the cases that were not ok."""
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.verdict] = counts.get(outcome.verdict, 0) + 1
    return {
        "cases": len(outcomes),
        "verdicts": counts,
        "largest_refusal_mb": max((o.peak_mb for o in outcomes if o.code == 2), default=0.0),
        "slowest_s": max((o.seconds for o in outcomes), default=0.0),
        "failures": [
            {
                "case": o.case.name,
                "verdict": o.verdict,
                "code": o.code,
                "stderr": o.stderr.strip().splitlines()[-3:],
                "left": o.left,
            }
            for o in outcomes
            if o.verdict != "ok"
        ],
    }


def to_json(outcomes: list[Outcome]) -> str:
    return json.dumps(summary(outcomes), indent=2)
