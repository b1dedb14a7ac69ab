"""The self-contained HTML report of a simulation: a summary table and the figures, each PNG
embedded as base64 (the page needs no other file), written beside the PNGs themselves."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from liveput.files import write_text_atomic
from liveput.policies import POLICIES
from liveput.report.plots import write_figures
from liveput.sim.result import SimulationResult

CAPTIONS = {
    "available": "Spot instances available at the start of each interval.",
    "configurations": "What each policy ran: instances used over time (grey: available).",
    "samples": "Samples trained so far: the policy that climbs fastest trains most.",
    "cost": "Dollars paid so far for every instance-hour held, and what each 1,000 samples cost.",
}

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; }
figcaption { color: #555; font-size: 90%; }
dt { font-weight: bold; } dd { margin: 0 0 0.5em 1.5em; }
"""


def _number(value: float | int | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def summary_rows(result: SimulationResult) -> list[list[str]]:
    """Rows of the summary table (also printed by the CLI)."""
    rows = []
    for name, run in result.runs.items():
        fraction = result.fraction_of_ideal(name)
        rows.append(
            [
                name,
                _number(run.samples),
                _number(fraction, 3),
                _number(run.cost_usd, 2),
                "-" if run.samples <= 0 else _number(run.usd_per_1k_samples, 3),
                str(run.reconfigurations),
                _number(run.downtime_s / 60.0, 1),
            ]
        )
    return rows


SUMMARY_HEADER = ["policy", "samples", "of ideal", "cost $", "$/1k", "reconf", "down min"]
"""Short enough that the table fits an 80-column terminal: $/1k is dollars per 1,000 samples,
reconf the reconfigurations, down min the downtime in minutes."""


def policy_summaries(result: SimulationResult) -> dict[str, str]:
    """Each policy's one-line model (the first line of its class docstring)."""
    return {
        name: (POLICIES.get(name).__doc__ or "").strip().splitlines()[0]
        for name in result.runs
        if name in POLICIES
    }


def write_simulation_report(result: SimulationResult, directory: str | Path) -> Path:
    """Write ``index.html`` and the PNGs into ``directory``; returns the page's path."""
    directory = Path(directory)
    figures = write_figures(result, directory)
    header = "".join(f"<th>{html.escape(cell)}</th>" for cell in SUMMARY_HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
        for row in summary_rows(result)
    )
    sections = []
    for name, path in figures.items():
        encoded = base64.b64encode(path.read_bytes()).decode("ascii")
        sections.append(
            f'<figure><img alt="{name}" src="data:image/png;base64,{encoded}">'
            f"<figcaption>{html.escape(CAPTIONS.get(name, name))}</figcaption></figure>"
        )
    models = "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>"
        for name, text in policy_summaries(result).items()
    )
    title = f"liveput simulation: {result.model} on {result.trace}"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{result.hours:.2f} hours replayed in {result.interval_s:g}-s intervals. Each policy met the
same preemptions at the same times; "of ideal" is its samples over the best configuration for
every count with free moves (the upper bound).</p>
<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>
<dl>{models}</dl>
{"".join(sections)}
</body></html>
"""
    target = directory / "index.html"
    return write_text_atomic(target, page)
