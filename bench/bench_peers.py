"""Peers: liveput's runtime against torchrun elastic and torchft on the same job and trace, and
the simulator's prediction of the runtime's samples.

Usage: ``python -m bench peers [--quick] [--repeats N] [--checkpoint-every-s S] [--notice-lead S]
[--loss-signal-delay S|none] [--trace FILE [--trace-start S] [--trace-span S]] [--json FILE]
[--plot FILE] [--work-dir DIR]``.

Every system trains the built-in job (``tiny-gpt``: same model, data order, global batch and
learning rate) on the same emulated cloud (:mod:`bench.peers_run`): the trace replayed at the same
time scale over the same wall-clock window, preemption = SIGKILL of the instance's processes
after the notice lead. Systems:

- ``liveput``: the runtime with the liveput policy (``liveput train``'s coordinator and agents);
- ``liveput-restart``: the same runtime with the ``reactive`` policy, whose every change is a
  restart from the newest checkpoint (the simulator's reactive baseline, executed for real);
- ``torchrun``: plain DDP under TorchElastic (:mod:`bench.peers_ddp`); ``torchrun-notice``:
  the same, checkpointing at the first step boundary after any instance's notice;
- ``torchrun-fsdp`` (only when ``--systems`` names it): the same under FSDP2 with DCP
  checkpoints (:mod:`bench.peers_fsdp`), as users run a model that needs sharding;
- ``torchrun-pp`` (the pipeline regime): the job cut into liveput's plan's stages under
  ``torch.distributed.pipelining`` (1F1B), ``world // P`` pipelines, per-stage DCP checkpoints
  (:mod:`bench.peers_pp`); ``torchrun-pp-notice``: the same, checkpointing at the first step
  boundary after any instance's notice;
- ``torchft``: per-step fault tolerance (:mod:`bench.peers_torchft`), installed in the
  benchmark's own environment ``bench/.peers-venv``;
- ``torchft-hsdp`` (the pipeline regime): torchft across replica groups, FSDP2 inside each
  group of as many instances as the shards need (:mod:`bench.peers_hsdp`).

Each system runs ``--repeats`` times per trace (3; 1 with ``--quick``), interleaved, and
checkpoints every ``--checkpoint-every-s`` wall seconds of its own steps. Per trace it prints
the median samples in the window and their min-max, ratios of medians to liveput's, downtime
per preemption, restarts or migrations, final loss, why a system stopped (from its logs), the
simulator's prediction (:mod:`bench.peers_sim`) and each system's samples/s with no preemption
(two instances, one per core of this machine).

Targets: liveput >= 1.5x torchrun where preemptions come more than once per 5 trace
minutes, >= torchft; no-preemption throughput within 5 % of torchrun's; the simulator within
10 % of the runtime for liveput and liveput-restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench import peers_report
from bench.peers_rates import SteadyRate, describe, steady_rate
from bench.peers_regime import REGIMES, Regime, interpolated
from bench.peers_run import RunSettings, SystemRun
from bench.peers_systems import RUNNERS, SAME_WITHOUT_PREEMPTION, global_batch, run_system
from bench.peers_traces import traces, user_traces
from liveput.traces import Trace


def steady_runs(settings: RunSettings, systems: list[str], instances: int) -> dict[str, SystemRun]:
    """Each system on ``instances`` that stay the whole window (no preemption)."""
    constant = Trace(
        f"constant-{instances}",
        instances,
        [],
        [],
        [],
        settings.window_s * settings.time_scale,
    )
    runs = {}
    twins = {
        s: SAME_WITHOUT_PREEMPTION[s] for s in systems if SAME_WITHOUT_PREEMPTION.get(s) in systems
    }
    for system in [s for s in systems if s not in twins]:
        run = run_system(system, constant, settings)
        if isinstance(run, SystemRun):
            runs[system] = run
    for system, twin in twins.items():
        if twin in runs:
            runs[system] = runs[twin]
    return runs


def steps_between_checkpoints(interval_s: float, samples_per_s: float | None, batch: int) -> int:
    """K for a system that trains ``samples_per_s`` without preemption: ``interval_s`` wall
    seconds of its steps, at least 1 (10, the interval every system had before, where its rate
    was not measured)."""
    if not samples_per_s:
        return RunSettings.checkpoint_every
    return max(1, round(interval_s * samples_per_s / batch))


def rates_by_count(
    settings: RunSettings,
    steady: SystemRun | None,
    window_s: float,
    regime: Regime,
    counts: tuple[int, ...] | None = None,
) -> tuple[dict[int, float], dict[int, SteadyRate]]:
    """liveput's samples/s with ``n`` instances and no preemption, ``n`` from the regime's
    fewest to its workers (``counts`` only, the others interpolated, where given): the
    simulator's throughput per instance count and the bound's (the instances share this
    machine's cores), and how each measured count's rate was taken. Every count's rate, the
    count runs' and ``steady``'s alike, is its run's steady rate
    (:func:`bench.peers_rates.steady_rate`: past the run's warm-up, whose share of a 30-s count
    run is twice its share of the 60-s run). ``steady``: the run of the regime's steady
    instances already made, at ``settings``' checkpoint interval (None: that count is run
    too)."""
    every = range(regime.fewest_instances, regime.workers + 1)
    measured: dict[int, SteadyRate] = {}
    for count in every if counts is None else counts:
        if count == regime.steady_instances and steady is not None:
            measured[count] = steady_rate(steady)
            continue
        constant = Trace(f"constant-{count}", count, [], [], [], window_s * settings.time_scale)
        run = run_system("liveput", constant, dataclasses.replace(settings, window_s=window_s))
        if isinstance(run, SystemRun):
            measured[count] = steady_rate(run)
    rates = interpolated(
        {n: how.samples_per_s for n, how in measured.items() if how.samples_per_s > 0}, every
    )
    return {count: round(rate, 2) for count, rate in rates.items()}, measured


def steady_rates(runs: dict[str, SystemRun]) -> dict[str, float]:
    """Samples/s of each no-preemption run from its first step to its last: each system's own
    throughput (the table's and its checkpoint interval's), what it trained over its run; the
    rate of an instance count for the bound and the simulator is :func:`rates_by_count`'s."""
    return {system: round(run.rate(), 2) for system, run in runs.items()}


def first_step_s(run: SystemRun) -> float | None:
    """Wall seconds from the cloud's start to the run's first committed step (start-up)."""
    return next((t for t, samples in run.timeline if samples > 0), None)


@dataclasses.dataclass(frozen=True)
class Margin:
    """``--notice-margin``'s value: seconds, or None for ``auto``."""

    seconds: float | None


def notice_margin(text: str) -> Margin:
    """``--notice-margin S`` (>= 0) or ``auto``."""
    return Margin(seconds_or(text, "auto"))


def loss_signal_delay(text: str) -> float | None:
    """``--loss-signal-delay``'s value: trace seconds >= 0, or ``none`` (never reported)."""
    return seconds_or(text, "none")


def seconds_or(text: str, word: str) -> float | None:
    """Seconds >= 0, or None for ``word``."""
    if text.strip().lower() == word:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds or {word}: {text!r}") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 s or {word}, got {text}")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    """``python -m bench peers``'s options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one trace, one seed, one run of each system (data-parallel: about 11 minutes on "
        "2 cores, with --repeats 3, 23; pipeline: about 10, a smoke test: its 60-s windows "
        "leave the torchrun peers no step after their 25-40-s starts)",
    )
    parser.add_argument(
        "--regime",
        choices=sorted(REGIMES),
        default="data-parallel",
        help="data-parallel: tiny-gpt on loopback (default); pipeline: tiny-gpt under a "
        "memory budget on hosts with shaped links",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        help="each instance's link, Mbit/s (default: the regime's; pipeline 200)",
    )
    parser.add_argument(
        "--checkpoints",
        choices=("local", "object-store"),
        default=None,
        help="where every system checkpoints: a local folder, or an S3 bucket behind the "
        "shaped links (default: the regime's: data-parallel local, pipeline object-store)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, help="write the samples-over-time plot here (PNG)")
    parser.add_argument(
        "--seeds",
        default=None,
        help="seeds of the generated traces (default: 20; the full benchmark adds the p3 cut)",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, of {', '.join(peers_report.SYSTEMS)} (default: the regime's: "
        + "; ".join(f"{r.name} {','.join(r.systems)}" for r in REGIMES.values())
        + ")",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="trace seconds per wall second (default: the regime's: "
        + "; ".join(
            f"{r.name} {r.time_scale:g}, {r.quick_time_scale:g} with --quick"
            for r in REGIMES.values()
        )
        + ")",
    )
    parser.add_argument(
        "--notice-margin",
        type=notice_margin,
        default=None,
        metavar="S|auto",
        help="liveput's --notice-margin, wall s, or auto (the product's default: twice the "
        "move it measured; default here: the regime's: "
        + "; ".join(
            f"{r.name} {'auto' if r.notice_margin_s is None else f'{r.notice_margin_s:g}'}"
            for r in REGIMES.values()
        )
        + ")",
    )
    parser.add_argument(
        "--notice-lead",
        type=float,
        default=RunSettings.notice_lead_s,
        help="preemption notice lead for every system, trace s (0: none; default %(default)s)",
    )
    parser.add_argument(
        "--loss-signal-delay",
        type=loss_signal_delay,
        default=RunSettings.loss_signal_delay_s,
        metavar="S",
        help="trace s from an instance's end until the cloud's list reports it (every system "
        "meets the same cloud; only liveput reads the list), or 'none': never (default "
        "%(default)s, RunSettings' default: the slow side of what EC2 and GCE document, "
        "docs/peers.md)",
    )
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        help="run this trace file (any format the CLI reads) instead of the built-in ones, cut "
        "at --trace-start for --trace-span and rescaled to the instance count; repeatable",
    )
    parser.add_argument("--trace-start", type=float, default=0.0, help="trace s (--trace)")
    parser.add_argument("--trace-span", type=float, default=300.0, help="trace s (--trace)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of each system on each trace, interleaved (A B C A B C); the table gives "
        "the median and the min-max (default 3; 1 with --quick)",
    )
    parser.add_argument(
        "--checkpoint-every-s",
        type=float,
        default=None,
        help="wall s between every system's checkpoints: each system's K (steps) is this over "
        "its own step time without preemption (default: the regime's: "
        + "; ".join(f"{r.name} {r.checkpoint_every_s:g}" for r in REGIMES.values())
        + ")",
    )
    parser.add_argument("--work-dir", default="", help="keep logs and checkpoints here")
    parser.add_argument("--no-sim", action="store_true", help="skip the simulator's prediction")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv or [])
    logging.basicConfig(level=logging.WARNING)
    regime = REGIMES[args.regime]
    systems = [s for s in (args.systems or ",".join(regime.systems)).split(",") if s]
    unknown = sorted(set(systems) - set(RUNNERS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(RUNNERS)}")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(regime.seeds)
    if args.time_scale is None:
        args.time_scale = regime.quick_time_scale if args.quick else regime.time_scale
    if args.notice_lead < 0 or args.trace_span <= 0:
        parser.error("--notice-lead must be >= 0 and --trace-span > 0")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.checkpoint_every_s is not None and not args.checkpoint_every_s > 0:
        parser.error("--checkpoint-every-s must be > 0")
    if args.link_mbit is not None and not args.link_mbit > 0:
        parser.error("--link-mbit must be > 0")
    link_mbit = args.link_mbit if args.link_mbit is not None else regime.link_mbit
    object_store = (
        regime.object_store if args.checkpoints is None else args.checkpoints == "object-store"
    )
    if object_store and link_mbit is None:
        parser.error("--checkpoints object-store needs shaped links (--link-mbit)")
    chosen = (
        [
            (name, trace, seeds[0])
            for name, trace in user_traces(
                args.trace, args.trace_start, args.trace_span, regime.workers
            )
        ]
        if args.trace
        else traces(args.quick, seeds, regime.workers)
    )
    base = RunSettings(
        job=regime.job,
        time_scale=args.time_scale,
        work_dir=args.work_dir,
        notice_margin_s=(
            regime.notice_margin_s if args.notice_margin is None else args.notice_margin.seconds
        ),
        notice_lead_s=args.notice_lead,
        loss_signal_delay_s=args.loss_signal_delay,
        instance_memory_gb=regime.instance_memory_gb,
        link_mbit=link_mbit,
        object_store=object_store,
    )
    # Stopped by a signal, the benchmark still removes its hosts (their gateway address would
    # take the next run's traffic) and stops its instances.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # No-preemption runs first: liveput's gives the start-up time the simulator is told.
    steady_settings = dataclasses.replace(
        base, window_s=regime.quick_steady_window_s if args.quick else regime.steady_window_s
    )
    print(
        f"{regime.name} regime: {base.job}"
        + (f", {base.instance_memory_gb:g} GB per instance" if base.instance_memory_gb else "")
        + (f", links shaped to {base.link_mbit:g} Mbit/s" if base.link_mbit else "")
        + (", checkpoints in an S3 bucket behind them" if base.object_store else ""),
        flush=True,
    )
    print(
        f"no preemption on {regime.steady_instances}: {', '.join(systems)} "
        f"({steady_settings.window_s:.0f} s each) ...",
        flush=True,
    )
    steady = steady_runs(steady_settings, systems, regime.steady_instances)
    rates = steady_rates(steady)
    every_s = (
        regime.checkpoint_every_s if args.checkpoint_every_s is None else args.checkpoint_every_s
    )
    batch = global_batch(base.job)
    every = {s: steps_between_checkpoints(every_s, rates.get(s), batch) for s in systems}
    print(
        f"checkpoints every {every_s:g} s: "
        + ", ".join(f"{s} every {k} steps" for s, k in every.items()),
        flush=True,
    )
    measured, by_count, how = None, {}, {}
    if not args.no_sim:
        from bench.peers_sim import measure

        startup_s = first_step_s(steady["liveput"]) if "liveput" in steady else None
        print(
            f"liveput on {regime.fewest_instances} to {regime.workers} instances, "
            "no preemption ...",
            flush=True,
        )
        # At the trace runs' checkpoint interval (the no-preemption runs checkpoint every
        # RunSettings.checkpoint_every steps, to measure the rate that interval is drawn from):
        # checkpointing every 10 steps instead of 39 cost liveput 12 % of its rate.
        count_settings = dataclasses.replace(
            steady_settings, checkpoint_every=every.get("liveput", steady_settings.checkpoint_every)
        )
        same_k = count_settings.checkpoint_every == steady_settings.checkpoint_every
        by_count, how = rates_by_count(
            count_settings,
            steady.get("liveput") if same_k else None,
            regime.count_window_s * (2 / 3 if args.quick else 1),
            regime,
            regime.quick_counts if args.quick else None,
        )
        print(describe(by_count, how), flush=True)
        # In a process of its own: its in-process instances (threads, each with the job's
        # layers) left about 9 GB of gpt2-small in this one, freed but kept by glibc's
        # per-thread arenas, and the next run's instances beside it ran the machine out of
        # memory.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
            measured = child.submit(
                measure,
                base.job,
                startup_s or 0.0,
                by_count,
                base.instance_memory_gb,
                base.link_mbit,
                base.object_store,
            ).result()
        print(
            "measured here: "
            + ", ".join(f"{k} {v:.2f} s" for k, v in measured.downtimes_s.items()),
            flush=True,
        )
    repeats = args.repeats or (1 if args.quick else 3)
    results = []
    for name, trace, seed in chosen:
        settings = dataclasses.replace(base, window_s=trace.end_s / args.time_scale, seed=seed)
        runs: dict[str, list[SystemRun | str]] = {system: [] for system in systems}
        # Interleaved (A B C A B C): a slow spell of the machine falls on every system.
        for repeat in range(repeats):
            for system in systems:
                print(
                    f"{name}: {system} ({settings.window_s:.0f} s window, run {repeat + 1} of "
                    f"{repeats}) ...",
                    flush=True,
                )
                chosen_k = dataclasses.replace(settings, checkpoint_every=every[system])
                runs[system].append(run_system(system, trace, chosen_k))
        simulated = {}
        if measured is not None:
            from bench.peers_sim import predict

            simulated = predict(
                trace, measured, settings.time_scale, settings.notice_lead_s, seed, every_s
            )
        results.append((name, runs, simulated))
    document = peers_report.to_json_document(results, rates)
    document["regime"] = {
        "name": regime.name,
        "job": base.job,
        "workers": regime.workers,
        "instance_memory_gb": base.instance_memory_gb,
        "link_mbit": base.link_mbit,
        "checkpoints": "object-store" if base.object_store else "local",
        "loss_signal_delay_s": base.loss_signal_delay_s,
        "checkpoint_every_s": every_s,
        "repeats": repeats,
    }
    if by_count:
        document["liveput_samples_per_s_by_instances"] = {str(n): r for n, r in by_count.items()}
        document["liveput_steady_rate_by_instances"] = {str(n): h.to_json() for n, h in how.items()}
    # The figures first: an hour of runs is not lost to a fault in what reads them.
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.json}")
    print(peers_report.table(document))
    targets = regime.targets if base.notice_lead_s == 0 else regime.notice_targets or regime.targets
    peers_report.verdicts(document, targets)
    if args.plot:
        peers_report.plot(document, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
