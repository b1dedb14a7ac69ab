"""`liveput perf MODEL`: throughput and memory of every (D, P), and the best per instance count."""

from __future__ import annotations

import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.output import console, print_json
from liveput.cli.params import FLAG
from liveput.perf import estimate_configs, load_profile


def register(app: typer.Typer) -> None:
    """Add the `perf` command to the root app."""

    @app.command("perf")
    def perf(
        model: str = typer.Argument(
            ...,
            help="Built-in model name, built-in job or module:function returning a liveput.Job "
            "(profiled here first), or a profile .json.",
        ),
        nodes: int = typer.Option(
            32, "--nodes", parser=params.INSTANCES, help="Largest instance count to consider."
        ),
        as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
    ) -> None:
        """Estimated samples/s, memory and feasibility of every (D, P) up to --nodes."""
        if nodes < 1:
            raise typer.BadParameter("--nodes must be >= 1")
        profile = load_profile(model)
        table = estimate_configs(profile, nodes)
        best: dict[str, list[int] | None] = {}
        for count in range(1, nodes + 1):
            choice = table.best_for(count)
            best[str(count)] = None if choice is None else [choice[0], choice[1]]
        configs = [
            {
                "data_parallel": int(d),
                "pipeline_stages": int(p),
                "samples_per_s": float(s),
                "memory_gb": float(m),
                "feasible": bool(f),
                "reason": r,
            }
            for d, p, s, m, f, r in zip(
                table.data_parallel,
                table.pipeline_stages,
                table.samples_per_s,
                table.memory_gb,
                table.feasible,
                table.reason,
                strict=True,
            )
        ]
        if as_json:
            print_json(
                {
                    "model": profile.model,
                    "instance_type": table.instance_type,
                    "configs": configs,
                    "best": best,
                }
            )
            return
        index = {(c["data_parallel"], c["pipeline_stages"]): i for i, c in enumerate(configs)}
        rows = _rows(best)
        view = Table(
            title=f"{profile.model} on {table.instance_type}: best D x P per count",
            caption=None
            if len(rows) == nodes
            else f"{len(rows)} row{'s' * (len(rows) > 1)} for {nodes:,} counts; --json "
            "lists every count",
        )
        for column in ("instances", "D x P", "samples/s", "memory GB"):
            view.add_column(column, justify="right")
        for first, last, pair in rows:
            counts = str(first) if first == last else f"{first}-{last}"
            if pair is None:
                view.add_row(counts, "-", "nothing fits", "-")
                continue
            figures = configs[index[(pair[0], pair[1])]]
            view.add_row(
                counts,
                f"{pair[0]} x {pair[1]}",
                f"{figures['samples_per_s']:.1f}",
                f"{figures['memory_gb']:.1f}",
            )
        console.print(view)


MAX_ROWS = 40
"""The table shows at most about this many rows; ``--json`` has every count."""


def _rows(best: dict[str, list[int] | None]) -> list[tuple[int, int, list[int] | None]]:
    """(first count, last count, best D x P) rows: counts with the same best configuration are
    one row; beyond :data:`MAX_ROWS` such runs, one row per step of a ladder of counts growing by
    about 1.25x (1, 2, 3, 4, 5, 6, 8, 10, ...), and the largest count."""
    runs: list[tuple[int, int, list[int] | None]] = []
    for key, choice in best.items():
        count = int(key)
        if runs and runs[-1][2] == choice:
            runs[-1] = (runs[-1][0], count, choice)
        else:
            runs.append((count, count, choice))
    if len(runs) <= MAX_ROWS:
        return runs
    largest = len(best)
    ladder: list[int] = []
    count = 1
    while count < largest:
        ladder.append(count)
        count = max(count + 1, round(count * 1.25))
    ladder.append(largest)
    return [(n, n, best[str(n)]) for n in ladder]
