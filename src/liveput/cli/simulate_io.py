"""The inputs and outputs of `liveput simulate`: comma-separated names, traces read and checked
before any work, the options of a deadline job checked whole, and the results written as JSON."""

from __future__ import annotations

from pathlib import Path

from liveput.cli.output import err_console, print_json, to_json
from liveput.cli.trace import load_trace
from liveput.errors import LiveputError
from liveput.files import write_text_atomic
from liveput.sim import default_trace
from liveput.sim.engine import check_size
from liveput.traces import IntervalTrace


def parse_names(text: str, what: str) -> list[str]:
    """The comma-separated names of option ``--what`` (none is refused)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise LiveputError(f"--{what} is empty; give comma-separated names")
    return names


def load_intervals(
    path: Path, interval_s: float, start_hour: float | None, end_hour: float | None
) -> IntervalTrace:
    """The trace file at ``path`` (between the hours given) in ``interval_s`` intervals, refused
    when it is empty or too large to simulate."""
    trace = load_trace(path, None, start_hour, end_hour, interval_s)
    if trace.end_s <= 0:
        raise LiveputError(f"trace {path} is empty: it spans no time")
    intervals = trace.resample(interval_s)
    check_size(intervals)  # before any work or note
    return intervals


def emit(summary: dict, output: Path | None, as_json: bool) -> None:
    """The results as JSON: into ``--output`` (atomically), on stdout with ``--json``, or both."""
    if output is not None:
        write_text_atomic(output, to_json(summary) + "\n")
        err_console.print(f"wrote {output}")
    if as_json:
        print_json(summary)


def is_deadline_job(
    deadline_hours: float | None,
    steps: int | None,
    target_samples: float | None,
    budget_usd: float | None,
    budget_usd_per_hour: float | None,
    on_demand_max: int | None,
    run_sweep: bool,
) -> bool:
    """Whether the options describe a deadline job (checking that they describe one whole)."""
    if all(
        value is None
        for value in (
            deadline_hours,
            steps,
            target_samples,
            budget_usd,
            budget_usd_per_hour,
            on_demand_max,
        )
    ):
        return False
    if steps is None and target_samples is None:
        raise LiveputError("a deadline job needs its work: --steps or --target-samples")
    if steps is not None and target_samples is not None:
        raise LiveputError("give --steps or --target-samples, not both")
    if deadline_hours is None and not run_sweep:
        raise LiveputError("a deadline job needs --deadline-hours (or --sweep over deadlines)")
    return True


def one_trace(
    traces: list[Path] | None, interval_s: float, start_hour: float | None, end_hour: float | None
) -> IntervalTrace:
    """The trace of one simulation: the one ``--trace`` or the project's own default."""
    if traces and len(traces) > 1:
        raise LiveputError("several --trace files need --sweep")
    if traces:
        return load_intervals(traces[0], interval_s, start_hour, end_hour)
    if start_hour is not None or end_hour is not None:
        raise LiveputError("--start-hour and --end-hour need a --trace")
    return default_trace(interval_s)
