"""Reports: the HTML page and PNG figures of a simulation, for throughput or for a deadline job
(the result says which: a deadline job's fills its deadline fields)."""

from collections.abc import Sequence
from pathlib import Path

from liveput.report.deadline import (
    DEADLINE_HEADER,
    deadline_rows,
    write_deadline_report,
)
from liveput.report.html import SUMMARY_HEADER, summary_rows, write_simulation_report
from liveput.report.plots import FIGURES, write_figures
from liveput.sim.result import SimulationResult
from liveput.sim.sweep import DeadlineSweepRow


def summary_table(result: SimulationResult) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the result's summary table (the CLI prints the same)."""
    if result.deadline_hours is not None:
        return DEADLINE_HEADER, deadline_rows(result)
    return SUMMARY_HEADER, summary_rows(result)


def write_report(
    result: SimulationResult, directory: str | Path, curve: Sequence[DeadlineSweepRow] = ()
) -> Path:
    """Write ``index.html`` and its PNGs into ``directory``; returns the page's path.
    ``curve``: a deadline job's runs at several deadlines (its cost-against-deadline figure)."""
    if result.deadline_hours is not None:
        return write_deadline_report(result, curve, directory)
    return write_simulation_report(result, directory)


__all__ = [
    "DEADLINE_HEADER",
    "FIGURES",
    "SUMMARY_HEADER",
    "deadline_rows",
    "summary_rows",
    "summary_table",
    "write_deadline_report",
    "write_figures",
    "write_report",
    "write_simulation_report",
]
