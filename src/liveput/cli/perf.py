"""`liveput perf MODEL`: throughput and memory of every (D, P), and the best per instance count."""

from __future__ import annotations

import typer
from rich.table import Table

from liveput.cli import params
from liveput.cli.params import FLAG
from liveput.cli.output import console, print_json
from liveput.perf import estimate_configs, load_profile


def register(app: typer.Typer) -> None:
    """Add the `perf` command to the root app."""

    @app.command("perf")
    def perf(
        model: str = typer.Argument(..., help="Built-in model name or a profile .json."),
        nodes: int = typer.Option(32, "--nodes", parser=params.INSTANCES,
                                  help="Largest instance count to consider."),
        as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
    ) -> None:
        """Estimated samples/s, memory and feasibility of every (D, P) up to --nodes."""
        if nodes < 1:
            raise typer.BadParameter("--nodes must be >= 1")
        profile = load_profile(model)
        table = estimate_configs(profile, nodes)
        best = {}
        for count in range(1, nodes + 1):
            choice = table.best_for(count)
            best[str(count)] = None if choice is None else [choice[0], choice[1]]
        configs = [
            {"data_parallel": int(d), "pipeline_stages": int(p), "samples_per_s": float(s),
             "memory_gb": float(m), "feasible": bool(f), "reason": r}
            for d, p, s, m, f, r in zip(table.data_parallel, table.pipeline_stages,
                                        table.samples_per_s, table.memory_gb, table.feasible,
                                        table.reason, strict=True)
        ]
        if as_json:
            print_json({"model": profile.model, "instance_type": table.instance_type,
                        "configs": configs, "best": best})
            return
        view = Table(title=f"{profile.model} on {table.instance_type}: best configuration per count")
        for column in ("instances", "D x P", "samples/s", "memory GB"):
            view.add_column(column, justify="right")
        for count, choice in best.items():
            if choice is None:
                view.add_row(count, "-", "nothing fits", "-")
                continue
            index = next(i for i, c in enumerate(configs)
                         if [c["data_parallel"], c["pipeline_stages"]] == choice)
            view.add_row(count, f"{choice[0]} x {choice[1]}",
                         f"{configs[index]['samples_per_s']:.1f}",
                         f"{configs[index]['memory_gb']:.1f}")
        console.print(view)
