"""Reading and writing availability traces in the four formats users bring.

==========  =====================================================  =================================
format      content                                                span
==========  =====================================================  =================================
``events``  no header; ``timestamp_ms,add|remove,node_name``       first to last event
``json``    ``{"metadata": {"gap_seconds": g}, "data": [n, ...]}``  ``len(data) * g``
``csv``     header ``time,count`` (or ``time,instance_count``)     last time + median spacing
``text``    ``YYYY-MM-DD, HH:MM:SS, count`` per line               last time + median spacing
==========  =====================================================  =================================

The format is detected from the content, never from the file name. Events at the first timestamp
of an events trace form its initial state. Every error names the file and line.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np

from liveput.errors import LiveputError
from liveput.files import read_text_file, write_text_atomic
from liveput.traces.trace import Trace

FORMATS = ("events", "json", "csv", "text")
_TEXT_LINE = re.compile(r"^\s*(\d{4}-\d{2}-\d{2})\s*,\s*(\d{1,2}:\d{2}:\d{2})\s*,\s*(-?\d+)\s*$")
_EVENT_LINE = re.compile(r"^\s*-?\d+(\.\d+)?\s*,\s*(add|remove)\s*,")
MAX_SPAN_S = 366 * 86_400.0
"""Longest trace read, seconds (a year): a longer span is a typo (seconds read as ms, a stray
digit) that would otherwise ask for gigabytes of intervals."""
MAX_TIME_S = 1e10
"""Largest absolute timestamp, seconds (year 2286 in Unix time)."""


def detect_format(text: str, path: str = "<trace>") -> str:
    """The format of a trace from its content."""
    stripped = text.lstrip()
    if not stripped:
        raise LiveputError(f"{path}: empty trace file")
    if stripped.startswith("{"):
        return "json"
    first = next(line for line in stripped.splitlines() if line.strip())
    header = [cell.strip().lower() for cell in first.split(",")]
    if header[:1] == ["time"] and len(header) == 2:
        return "csv"
    if _TEXT_LINE.match(first):
        return "text"
    if _EVENT_LINE.match(first):
        return "events"
    raise LiveputError(
        f"{path}:1: unknown trace format (expected events CSV, count JSON, `time,count` CSV "
        "or `YYYY-MM-DD, HH:MM:SS, count` text)"
    )


def read_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """Read a trace file in any supported format (detected from content unless ``fmt`` is given)."""
    path = Path(path)
    if not path.exists():
        raise LiveputError(f"{path}: no such trace file")
    text = read_text_file(path, "trace")
    fmt = fmt or detect_format(text, str(path))
    if fmt not in _READERS:
        raise LiveputError(f"{path}: unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    if not text.strip():
        raise LiveputError(f"{path}: empty trace file")
    trace = _READERS[fmt](text, str(path))
    if trace.end_s > MAX_SPAN_S:
        raise LiveputError(
            f"{path}: the trace spans {trace.end_s / 86_400:.4g} days, more than "
            f"the {MAX_SPAN_S / 86_400:.0f} a trace may (a timestamp in the wrong "
            "unit, or a stray digit?)"
        )
    return trace


def _check_time(time_s: float, cell: str, path: str, number: int) -> float:
    if not math.isfinite(time_s) or abs(time_s) > MAX_TIME_S:
        raise LiveputError(f"{path}:{number}: time {cell!r} is not a plausible timestamp")
    return time_s


def _parse_events(text: str, path: str) -> Trace:
    present: set[str] = set()
    changes: dict[float, list[int]] = {}
    first_time: float | None = None
    last_time = -np.inf
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3 or cells[1] not in ("add", "remove") or not cells[2]:
            raise LiveputError(f"{path}:{number}: expected `timestamp_ms,add|remove,node`")
        try:
            time_s = _check_time(float(cells[0]) / 1000.0, cells[0], path, number)
        except ValueError as error:
            if isinstance(error, LiveputError):
                raise
            raise LiveputError(f"{path}:{number}: timestamp {cells[0]!r} is not a number") from None
        if time_s < last_time:
            raise LiveputError(f"{path}:{number}: time goes backwards ({cells[0]} ms)")
        last_time = time_s
        first_time = time_s if first_time is None else first_time
        node = cells[2]
        if cells[1] == "add":
            if node in present:
                raise LiveputError(f"{path}:{number}: node {node} is added while already present")
            present.add(node)
            changes.setdefault(time_s, [0, 0])[0] += 1
        else:
            if node not in present:
                raise LiveputError(f"{path}:{number}: node {node} is removed but is not present")
            present.remove(node)
            changes.setdefault(time_s, [0, 0])[1] += 1
    if first_time is None:
        raise LiveputError(f"{path}: empty trace file")
    initial_added, initial_removed = changes.pop(first_time)
    times = np.array(sorted(changes), dtype=float)
    return Trace(
        name=Path(path).name,
        initial_count=initial_added - initial_removed,
        times_s=times - first_time,
        added=np.array([changes[t][0] for t in times], dtype=np.int64),
        removed=np.array([changes[t][1] for t in times], dtype=np.int64),
        end_s=last_time - first_time,
    )


def _parse_json(text: str, path: str) -> Trace:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise LiveputError(f"{path}:{error.lineno}: invalid JSON ({error.msg})") from None
    if not isinstance(document, dict) or "data" not in document:
        raise LiveputError(f"{path}:1: count JSON needs a `data` list")
    metadata = document.get("metadata") or {}
    gap = metadata.get("gap_seconds", 0) if isinstance(metadata, dict) else 0
    if (
        isinstance(gap, bool)
        or not isinstance(gap, (int, float))
        or not math.isfinite(gap)
        or not 0 < gap <= MAX_SPAN_S
    ):
        raise LiveputError(
            f"{path}:1: count JSON needs metadata.gap_seconds, a number of seconds > 0, got {gap!r}"
        )
    gap_s = float(gap)
    data = document["data"]
    if not isinstance(data, list) or not data:
        raise LiveputError(f"{path}:1: `data` must be a non-empty list of counts")
    for index, value in enumerate(data):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise LiveputError(f"{path}: data[{index}] = {value!r} is not a count >= 0")
    prices = document.get("prices")
    price = None
    if isinstance(prices, list) and prices:
        if not all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p >= 0
            for p in prices
        ):
            raise LiveputError(f"{path}: `prices` must be finite numbers >= 0")
        price = float(np.mean(prices))
    times = np.arange(len(data)) * gap_s
    return Trace.from_counts(Path(path).name, times, np.array(data), len(data) * gap_s, price)


def _series_trace(times: list[float], counts: list[int], lines: list[int], path: str) -> Trace:
    if not times:
        raise LiveputError(f"{path}: empty trace file")
    for k in range(1, len(times)):
        if times[k] <= times[k - 1]:
            raise LiveputError(
                f"{path}:{lines[k]}: time goes backwards or repeats "
                "(several runs concatenated? split the file)"
            )
    array = np.array(times, dtype=float)
    spacing = float(np.median(np.diff(array))) if len(array) > 1 else 60.0
    return Trace.from_counts(Path(path).name, array, np.array(counts), array[-1] + spacing)


def _parse_count(cell: str, path: str, number: int) -> int:
    try:
        value = int(cell)
    except ValueError:
        raise LiveputError(f"{path}:{number}: count {cell!r} is not an integer") from None
    if value < 0:
        raise LiveputError(f"{path}:{number}: negative count {value}")
    return value


def _parse_time(cell: str, path: str, number: int) -> float:
    try:
        return _check_time(float(cell), cell, path, number)
    except ValueError as error:
        if isinstance(error, LiveputError):
            raise
    try:
        return datetime.fromisoformat(cell.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise LiveputError(
            f"{path}:{number}: time {cell!r} is neither seconds nor an ISO-8601 timestamp"
        ) from None


def _parse_csv(text: str, path: str) -> Trace:
    rows = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    header = [cell.strip().lower() for cell in rows[0][1].split(",")]
    if header not in (["time", "count"], ["time", "instance_count"]):
        raise LiveputError(f"{path}:{rows[0][0]}: expected header `time,count`")
    times, counts, lines = [], [], []
    for number, line in rows[1:]:
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 2:
            raise LiveputError(f"{path}:{number}: expected `time,count`")
        times.append(_parse_time(cells[0], path, number))
        counts.append(_parse_count(cells[1], path, number))
        lines.append(number)
    if times:
        base = times[0]
        times = [t - base for t in times]
    return _series_trace(times, counts, lines, path)


def _parse_text(text: str, path: str) -> Trace:
    times, counts, lines = [], [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _TEXT_LINE.match(line)
        if not match:
            raise LiveputError(f"{path}:{number}: expected `YYYY-MM-DD, HH:MM:SS, count`")
        try:
            stamp = datetime.fromisoformat(f"{match[1]}T{int(match[2][:-6]):02d}{match[2][-6:]}")
        except ValueError:
            raise LiveputError(f"{path}:{number}: invalid date or time") from None
        times.append(stamp.timestamp())
        counts.append(_parse_count(match[3], path, number))
        lines.append(number)
    if times:
        base = times[0]
        times = [t - base for t in times]
    return _series_trace(times, counts, lines, path)


_READERS: dict[str, Callable[[str, str], Trace]] = {
    "events": _parse_events,
    "json": _parse_json,
    "csv": _parse_csv,
    "text": _parse_text,
}


# --- writing ----------------------------------------------------------------------------------
def _events_text(trace: Trace) -> str:
    # An events file ends at its last event: a span that runs on after it is not kept.
    lines: list[str] = []
    next_id = 0
    present: list[str] = []

    def add(time_ms: int) -> None:
        nonlocal next_id
        next_id += 1
        present.append(f"node{next_id}")
        lines.append(f"{time_ms},add,{present[-1]}")

    for _ in range(trace.initial_count):
        add(0)
    if trace.initial_count == 0:
        # An events trace starts with its first row: keep time 0 visible with an add and remove.
        add(0)
        lines.append(f"0,remove,{present.pop()}")
    for time_s, added, removed in zip(trace.times_s, trace.added, trace.removed, strict=True):
        time_ms = int(round(time_s * 1000))
        for _ in range(int(removed)):
            lines.append(f"{time_ms},remove,{present.pop(0)}")
        for _ in range(int(added)):
            add(time_ms)
    return "\n".join(lines) + "\n"


def _json_text(trace: Trace, gap_s: float) -> str:
    resampled = trace.resample(gap_s)
    document = {"metadata": {"gap_seconds": gap_s}, "data": resampled.count.tolist()}
    return json.dumps(document) + "\n"


def write_trace(
    trace: Trace, path: str | Path, fmt: str | None = None, gap_s: float = 60.0
) -> None:
    """Write ``trace`` atomically (temp file then rename): a failure never corrupts ``path``.

    ``fmt`` defaults to ``json`` for a ``.json`` path, else ``events``. The count JSON samples the
    count every ``gap_s`` seconds (exact when changes fall on multiples of ``gap_s``).
    """
    path = Path(path)
    fmt = fmt or ("json" if path.suffix.lower() == ".json" else "events")
    if fmt == "events":
        text = _events_text(trace)
    elif fmt == "json":
        text = _json_text(trace, gap_s)
    else:
        raise LiveputError(f"{path}: cannot write format {fmt!r}; writable: events, json")
    write_text_atomic(path, text)
