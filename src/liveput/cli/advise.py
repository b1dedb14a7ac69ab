"""`liveput advise ...`: what to rent, under a budget (deepvm, mixed), an SLO (slo) or a deadline
on a trace (pool). Every command prints a table, or one JSON object with ``--json``."""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from pathlib import Path

import numpy as np
import typer
from rich.table import Table

from liveput.advise import (
    REVOCATION_MODELS,
    Advice,
    Catalog,
    DeepVMConfig,
    LogisticScaling,
    Market,
    MixedConfig,
    RevocationModel,
    SLOConfig,
    advise_deepvm,
    advise_mixed,
    advise_slo,
    fit_logistic,
    load_catalog,
    problem_from_catalog,
)
from liveput.cli import params
from liveput.cli.output import console, print_json, progress
from liveput.cli.params import FLAG
from liveput.cli.trace import load_trace
from liveput.errors import LiveputError
from liveput.files import read_text_file

app = typer.Typer(
    help="What to rent: spot and on-demand mixes under a budget or a deadline.",
    no_args_is_help=True,
)

CATALOG_HELP = "Built-in catalog (aws, deepvm-aws) or a catalog JSON (liveput or DeepVM format)."
REVOCATION_HELP = (
    "Revocation model: a published one ("
    + ", ".join(REVOCATION_MODELS.names())
    + ") or a trace file to estimate it from; ranks plans by expected figures."
)


def _catalog(name: str, refresh: bool, region: str) -> Catalog:
    catalog = load_catalog(name)
    if refresh:
        from liveput.advise.prices import refresh_spot_prices

        catalog = refresh_spot_prices(catalog, region, dt.datetime.now(dt.UTC))
    return catalog


def _revocation(value: str | None) -> RevocationModel | None:
    if value is None:
        return None
    if value in REVOCATION_MODELS:
        return REVOCATION_MODELS.get(value)
    if Path(value).is_file():
        from liveput.traces import read_trace

        return RevocationModel.from_trace(read_trace(value).resample())
    raise LiveputError(
        f"--revocation {value!r}: not a published model "
        f"({', '.join(REVOCATION_MODELS.names())}) nor a trace file"
    )


def _speedup_fits(path: Path | None, catalog: Catalog) -> dict[str, LogisticScaling]:
    """Logistic fits from a CSV of measured speedups (columns type, nodes, speedup)."""
    if path is None:
        return {}
    text = read_text_file(path, "--speedups")
    rows: dict[str, list[tuple[float, float]]] = {}
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not reader.fieldnames or not {"type", "nodes", "speedup"} <= set(reader.fieldnames):
        raise LiveputError(f"--speedups {path}: needs a header with type,nodes,speedup")
    for line, row in enumerate(reader, start=2):
        try:
            point = (float(row["nodes"]), float(row["speedup"]))
        except (TypeError, ValueError):
            raise LiveputError(
                f"--speedups {path}:{line}: nodes and speedup must be numbers"
            ) from None
        if not all(math.isfinite(x) and x > 0 for x in point):
            raise LiveputError(
                f"--speedups {path}:{line}: nodes and speedup must be finite and > 0"
            )
        rows.setdefault(row["type"], []).append(point)
    fits = {}
    for name, points in rows.items():
        catalog.get(name)
        nodes, speedups = np.array(points).T
        fits[name] = fit_logistic(nodes, speedups, f"least-squares fit to {path.name}")
    return fits


def _floats(text: str, count: int, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise LiveputError(f"{option} {text!r} must be {count} comma-separated numbers") from None
    if len(values) != count:
        raise LiveputError(f"{option} needs {count} comma-separated numbers, got {len(values)}")
    return values


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise LiveputError(f"{option} {text!r} must be comma-separated integers") from None
    if not values:
        raise LiveputError(f"{option} needs at least one value")
    return values


def _render(advice: Advice, as_json: bool, columns: dict[str, str]) -> None:
    if as_json:
        print_json(advice.to_dict())
        return
    shown = {
        key: header
        for key, header in columns.items()
        if any(key in plan.metrics for plan in advice.plans)
    }
    table = Table(title=advice.plans[0].objective.replace("_", " "))
    table.add_column("#", justify="right")
    table.add_column("architecture")
    table.add_column("instances (od: on-demand)")
    for header in ("$/h", "value", *shown.values()):
        table.add_column(header, justify="right")
    for rank, plan in enumerate(advice.plans, start=1):
        extra = [f"{plan.metrics[key]:.4g}" if key in plan.metrics else "-" for key in shown]
        instances = "\n".join(
            f"{item.count} {item.type}{' od' if item.market is Market.ON_DEMAND else ''}"
            for item in plan.instances
        )
        table.add_row(
            str(rank),
            plan.architecture,
            instances,
            f"{plan.usd_per_hour:.4f}",
            f"{plan.value:.4g}",
            *extra,
        )
    console.print(table)
    console.print(f"[bold]why #1:[/bold] {advice.reason}")


@app.command("deepvm")
def deepvm(
    budget_usd_per_hour: float = typer.Option(
        ...,
        "--budget-usd-per-hour",
        parser=params.PRICE_POSITIVE,
        help="Price willingness, $/h for the whole cluster.",
    ),
    catalog: str = typer.Option("aws", "--catalog", help=CATALOG_HELP),
    checkpoint_gb: float = typer.Option(
        1.0, "--checkpoint-gb", parser=params.GIGABYTES, help="Checkpoint size, GB."
    ),
    checkpoint_interval_s: float = typer.Option(
        60.0, "--checkpoint-interval-s", parser=params.SECONDS, help="Seconds between checkpoints."
    ),
    types: str | None = typer.Option(
        None,
        "--types",
        parser=params.INSTANCE_TYPES,
        help="Only these instance types (comma-separated; GPU and CPU).",
    ),
    mixed: bool = typer.Option(
        False,
        "--mixed",
        metavar=FLAG,
        help="Also solve the mixed-GPU-type tiering MILP (HiGHS) and list its plan.",
    ),
    speedups: Path | None = typer.Option(
        None,
        "--speedups",
        help="CSV type,nodes,speedup of your measured speedups (fitted by least squares).",
    ),
    revocation: str | None = typer.Option(None, "--revocation", help=REVOCATION_HELP),
    refresh_prices: bool = typer.Option(
        False,
        "--refresh-prices",
        metavar=FLAG,
        help="Refresh spot prices from AWS (needs credentials).",
    ),
    region: str = typer.Option("us-east-1", "--region", help="AWS region for --refresh-prices."),
    network_bound: str = typer.Option(
        "saturation",
        "--network-bound",
        help="Tiering's network limit: saturation (DeepVM's: fewer "
        "GPU nodes per checkpoint node than its measured saturation "
        "point) or stream (liveput's: the tier's Gb/s absorbs every "
        "node's checkpoint stream).",
    ),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
) -> None:
    """DeepVM: best single-type cluster (Single Anchor or Tiering) within a price willingness."""
    chosen = _catalog(catalog, refresh_prices, region)
    if types:
        chosen = chosen.subset([name.strip() for name in types.split(",") if name.strip()])
    config = DeepVMConfig(
        budget_usd_per_hour,
        checkpoint_gb=checkpoint_gb,
        checkpoint_interval_s=checkpoint_interval_s,
        fits=_speedup_fits(speedups, chosen),
        revocation=_revocation(revocation),
        network_bound=network_bound,
    )
    advice = advise_deepvm(chosen, config)
    if mixed:
        mixed_plan = advise_mixed(chosen, MixedConfig(config)).plans[0]
        single = advice.plans[0]
        plans = sorted([*advice.plans, mixed_plan], key=lambda p: (-p.value, p.usd_per_hour))
        reason = advice.reason
        if plans[0] is mixed_plan and mixed_plan.value > single.value:
            reason = (
                f"the mixed-type MILP plan's effective FLOPS ({mixed_plan.value:.0f}) beat "
                f"the best single-type plan's ({single.value:.0f}, {single.describe()}) "
                f"within ${budget_usd_per_hour:g}/h"
            )
        advice = Advice(tuple(plans), reason, advice.inputs)
    _render(
        advice,
        as_json,
        {
            "gpu_nodes": "GPU nodes",
            "speedup": "speedup",
            "flopp": "FLOPP",
            "productive_fraction": "productive",
        },
    )


@app.command("slo")
def slo(
    model: str = typer.Option(..., "--model", help="Built-in model or profile .json."),
    target_loss: float = typer.Option(
        ..., "--target-loss", parser=params.LOSS, help="Loss to reach."
    ),
    deadline_hours: float = typer.Option(
        ..., "--deadline-hours", parser=params.HOURS, help="By when, hours."
    ),
    catalog: str = typer.Option("aws", "--catalog", help=CATALOG_HELP),
    types: str | None = typer.Option(
        None,
        "--types",
        parser=params.INSTANCE_TYPES,
        help="Only these worker types (comma-separated).",
    ),
    ps_type: str = typer.Option(
        "c5n.xlarge", "--ps-type", help="Parameter-server instance type (on-demand)."
    ),
    search: str = typer.Option("window", "--search", help="window (spotDNN) or exact."),
    max_workers: int = typer.Option(
        16, "--max-workers", parser=params.INSTANCES, help="Most workers in the cluster."
    ),
    loss_params: str | None = typer.Option(
        None,
        "--loss-params",
        parser=params.NUMBERS,
        help="Your fitted loss coefficients g1,g2,g3,g4,g5.",
    ),
    revocation: str | None = typer.Option(None, "--revocation", help=REVOCATION_HELP),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
) -> None:
    """spotDNN: cheapest heterogeneous spot cluster reaching a loss by a deadline."""
    from liveput.perf import load_profile

    chosen = load_catalog(catalog)
    if types:
        names = [name.strip() for name in types.split(",") if name.strip()]
        chosen = chosen.subset(names + ([ps_type] if ps_type not in names else []))
    loss = _floats(loss_params, 5, "--loss-params") if loss_params else None
    problem, ps = problem_from_catalog(chosen, load_profile(model), ps_type, loss)
    config = SLOConfig(
        target_loss,
        deadline_hours,
        search=search,
        max_workers=max_workers,
        ps_usd_per_hour=ps.on_demand_usd_per_hour,
        revocation=_revocation(revocation),
    )
    _render(advise_slo(problem, config, ps.name), as_json, {"hours_to_target": "hours to target"})


@app.command("pool")
def pool(
    model: str = typer.Option(..., "--model", help="Built-in model or profile .json."),
    deadline_hours: float = typer.Option(
        ..., "--deadline-hours", parser=params.HOURS, help="By when, hours."
    ),
    trace: Path = typer.Option(..., "--trace", help="Availability trace of the spot type."),
    target_samples: float = typer.Option(
        ..., "--target-samples", parser=params.SAMPLES, help="Samples to train."
    ),
    anchors: str = typer.Option(
        "0,1,2,4", "--anchors", parser=params.NUMBERS, help="On-demand anchor counts to try."
    ),
    spot_caps: str | None = typer.Option(
        None,
        "--spot-caps",
        parser=params.NUMBERS,
        help="Spot caps to try (default: the trace's peak).",
    ),
    hours: float | None = typer.Option(
        None,
        "--hours",
        parser=params.optional(params.HOURS),
        help="Simulate only the trace's first hours (the rate carries on past them).",
    ),
    catalog: str = typer.Option("aws", "--catalog", help=CATALOG_HELP),
    interval_s: float = typer.Option(
        60.0, "--interval", parser=params.SECONDS, help="Simulation interval, seconds."
    ),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
) -> None:
    """Pool: on-demand anchors + spot for the liveput runtime, chosen by simulating candidates."""
    from liveput.advise.pool import PoolConfig, advise_pool, pool_candidates
    from liveput.perf import load_profile
    from liveput.sim.engine import check_size

    profile = load_profile(model)
    replay = load_trace(trace, interval_s=interval_s).resample(interval_s)
    if hours is not None:
        if hours * 3600.0 < interval_s:
            raise LiveputError(
                f"--hours {hours:g} ({hours * 3600:.4g} s) is shorter than one --interval "
                f"({interval_s:g} s): give a shorter --interval or more --hours"
            )
        replay = replay.head(max(1, int(round(hours * 3600 / interval_s))))
    check_size(replay)  # each candidate pool is simulated over every interval
    spec = load_catalog(catalog).get(profile.instance_type.name)
    config = PoolConfig(
        target_samples,
        deadline_hours,
        anchors=_ints(anchors, "--anchors"),
        spot_caps=_ints(spot_caps, "--spot-caps") if spot_caps else None,
        spot_usd_per_hour=spec.spot_usd_per_hour,
        on_demand_usd_per_hour=spec.on_demand_usd_per_hour,
    )
    count = len(pool_candidates(config.anchors, config.spot_caps or (replay.max_count,)))
    with progress() as bar:
        task = bar.add_task("simulating pools", total=count)
        advice = advise_pool(replay, profile, config, on_candidate=lambda: bar.advance(task))
    _render(
        advice, as_json, {"hours_to_target": "hours to target", "reconfigurations": "reconfig."}
    )


@app.command("catalog")
def show_catalog(
    catalog: str = typer.Option("aws", "--catalog", help=CATALOG_HELP),
    as_json: bool = typer.Option(False, "--json", metavar=FLAG, help="Print one JSON object."),
) -> None:
    """List a catalog's instance types, prices, quotas and the source of each figure."""
    chosen = load_catalog(catalog)
    if as_json:
        print_json(
            {
                "name": chosen.name,
                "sources": chosen.sources,
                "instances": [
                    {
                        "name": s.name,
                        "family": s.family,
                        "gpus": s.gpus,
                        "gpu": s.gpu,
                        "relative_flops": s.relative_flops,
                        "spot_usd_per_hour": s.spot_usd_per_hour,
                        "on_demand_usd_per_hour": s.on_demand_usd_per_hour,
                        "vcpus": s.vcpus,
                        "network_gbps": s.network_gbps,
                        "sources": s.sources,
                    }
                    for s in chosen.instances
                ],
            }
        )
        return
    table = Table(title=f"catalog {chosen.name}")
    for header in (
        "type",
        "family",
        "GPUs",
        "FLOPS",
        "spot $/h",
        "on-demand $/h",
        "vCPU",
        "Gb/s",
        "price sources",
    ):
        table.add_column(header)
    for s in chosen.instances:
        table.add_row(
            s.name,
            s.family,
            f"{s.gpus} {s.gpu}".strip(),
            f"{s.relative_flops:g}",
            f"{s.spot_usd_per_hour:g}",
            f"{s.on_demand_usd_per_hour:g}",
            str(s.vcpus),
            f"{s.network_gbps:g}",
            f"{s.sources.get('spot_price', '?')}/{s.sources.get('ondemand_price', '?')}",
        )
    console.print(table)
    for key, text in chosen.sources.items():
        console.print(f"[bold]{key}[/bold]: {text}")
