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
import functools
import json
import logging
import multiprocessing
import shutil
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from bench import peers_report
from bench.inputs import P3_TRACE, real_trace
from bench.peers_regime import REGIMES, Regime, interpolated, sharded_minimum
from bench.peers_run import RunSettings, SystemRun, run_liveput, run_torchrun, scratch
from bench.peers_stops import Stop, stop_of
from liveput.traces import IntervalTrace, Trace, generate_trace, read_trace

if TYPE_CHECKING:
    from bench.peers_pp import PlannedCuts


def p3_cut(workers: int, start_s: float = 3030.0, span_s: float = 300.0) -> Trace:
    """A ``span_s`` cut of the real p3 trace (the default: its 5 minutes with the most
    preemption events, 4), rescaled to ``workers``."""
    return cut_trace(read_trace(real_trace(P3_TRACE)), workers, start_s, span_s, "p3-cut")


def cut_trace(
    full: Trace | IntervalTrace, workers: int, start_s: float, span_s: float, name: str
) -> Trace:
    """``span_s`` seconds of ``full`` from ``start_s``, rescaled to ``workers``: the count scaled
    by ``workers / peak``, each change keeping at least one instance so that no preemption event
    vanishes in the rounding."""
    import numpy as np

    if isinstance(full, IntervalTrace):
        full = Trace.from_counts(
            full.name,
            np.arange(len(full.count)) * full.interval_s,
            np.asarray(full.count),
            len(full.count) * full.interval_s,
        )
    if not 0 <= start_s < full.end_s:
        sys.exit(
            f"bench peers: --trace-start {start_s:g} s is outside {full.name} "
            f"(0 to {full.end_s:g} s)"
        )
    ratio = workers / max(int(full.max_count()), 1)
    count = int(np.clip(round(int(full.count_at(start_s)) * ratio), 1, workers))
    times, counts = [0.0], [count]
    inside = (full.times_s > start_s) & (full.times_s < start_s + span_s)
    for time_s, added, removed in zip(
        full.times_s[inside], full.added[inside], full.removed[inside], strict=True
    ):
        delta = int(added) - int(removed)
        if delta:
            step = int(np.sign(delta)) * max(1, round(abs(delta) * ratio))
            count = int(np.clip(count + step, 0, workers))
            times.append(float(time_s - start_s))
            counts.append(count)
    span_s = min(span_s, full.end_s - start_s)
    return Trace.from_counts(f"{name}-{workers}", np.array(times), np.array(counts), span_s)


def user_traces(
    paths: list[str], start_s: float, span_s: float, workers: int
) -> list[tuple[str, Trace]]:
    """Traces the user names (any format the CLI reads), cut and rescaled to ``workers``; a
    missing or unreadable one ends the benchmark with a message (it never skips one)."""
    from liveput.errors import LiveputError

    chosen = []
    for path in paths:
        if not Path(path).is_file():
            sys.exit(f"bench peers: --trace {path}: no such file")
        try:
            full = read_trace(Path(path))
        except LiveputError as error:
            sys.exit(f"bench peers: --trace {path}: {error}")
        chosen.append((Path(path).stem, cut_trace(full, workers, start_s, span_s, Path(path).stem)))
    return chosen


def traces(quick: bool, seeds: list[int], workers: int) -> list[tuple[str, Trace, int]]:
    """(name, trace, seed): the generated 5-minute trace per seed, and the p3 cut."""
    chosen = [
        (f"generated-{workers}-seed{s}", generate_trace(workers, 5 / 60, s), s) for s in seeds
    ]
    if quick:
        return chosen[:1]
    chosen.append(("p3-cut", p3_cut(workers), seeds[0]))
    return chosen


def _torchft(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    from bench.peers_torchft import run_torchft

    return run_torchft(trace, settings, work)


def _global_batch(job: str) -> int:
    return _shape(job)[0]


def _parameters(job: str) -> int:
    return _shape(job)[1]


@functools.cache
def _shape(job: str) -> tuple[int, int]:
    """The built-in job's global batch and parameter count (its layers built once per
    benchmark, then let go)."""
    from liveput.models.jobs import resolve_job

    built = resolve_job(job)
    return built.global_batch_size, sum(p.numel() for x in built.layers for p in x.parameters())


def _torchrun_fsdp(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    minimum = sharded_minimum(_parameters(settings.job), settings.instance_memory_gb)
    return run_torchrun(trace, settings, work, "bench.peers_fsdp", "torchrun-fsdp", minimum)


@functools.cache
def _planned_cuts(job: str, instance_memory_gb: float | None, maximum: int) -> PlannedCuts:
    """liveput's plan's stage cut per instance count (:func:`bench.peers_pp.liveput_cuts`),
    once per benchmark: the job is profiled in a process of its own (about a minute for
    gpt2-small on the loaded cores; its layers' memory stays out of the benchmark's process, as
    the simulator's measurements do)."""
    from bench.peers_pp import liveput_cuts

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(liveput_cuts, job, instance_memory_gb, maximum).result()


def _torchrun_pp(
    trace: Trace, settings: RunSettings, work: Path, notice: bool = False
) -> SystemRun | str:
    """The pipeline peer (:mod:`bench.peers_pp`) on liveput's plan's cut of each instance count,
    from the fewest instances a cut fits; with ``notice``, every rank checkpoints at the first
    step boundary after any instance's notice file appears."""
    from bench.peers_pp import write_plan

    planned = _planned_cuts(settings.job, settings.instance_memory_gb, max(1, trace.max_count()))
    work.mkdir(parents=True, exist_ok=True)
    plan = work / "pp-plan.json"
    write_plan(plan, planned)
    worker_args = ["--plan", str(plan)]
    if notice:
        # Where the emulated cloud writes each instance's notice (its LaunchSpec.notice_file).
        worker_args += ["--notice-file", str(work / "notices" / "{instance_id}.notice.json")]
    system = "torchrun-pp-notice" if notice else "torchrun-pp"
    return run_torchrun(
        trace, settings, work, "bench.peers_pp", system, planned.minimum, worker_args
    )


def _torchft_hsdp(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    from bench.peers_hsdp import run_torchft_hsdp
    from liveput.launch.assemble import OPTIMIZER_STATE_FACTOR
    from liveput.runtime.launch import comm_timeout_s

    parameters = _parameters(settings.job)
    group_size = sharded_minimum(parameters, settings.instance_memory_gb)
    # liveput's agents' collective timeout on these links: a heal sends a rank's shards of the
    # fp32 weights and Adam's two moments over its link.
    shard_bytes = OPTIMIZER_STATE_FACTOR * 4 * parameters / group_size
    link_gbps = None if settings.link_mbit is None else settings.link_mbit / 1000
    timeout_s = comm_timeout_s(shard_bytes, link_gbps)
    return run_torchft_hsdp(trace, settings, work, group_size, timeout_s)


RUNNERS: dict[str, Callable[[Trace, RunSettings, Path], SystemRun | str]] = {
    "liveput": lambda t, s, w: run_liveput(t, s, w, "liveput", "liveput"),
    "liveput-restart": lambda t, s, w: run_liveput(t, s, w, "reactive", "liveput-restart"),
    "torchrun": run_torchrun,
    "torchrun-notice": lambda t, s, w: run_torchrun(
        t, s, w, system="torchrun-notice", worker_args=("--checkpoint-on-notice",)
    ),
    "torchrun-fsdp": _torchrun_fsdp,
    "torchrun-pp": _torchrun_pp,
    "torchrun-pp-notice": functools.partial(_torchrun_pp, notice=True),
    "torchft": _torchft,
    "torchft-hsdp": _torchft_hsdp,
}


def _run(system: str, trace: Trace, settings: RunSettings) -> SystemRun | str:
    work = scratch(settings, system)
    try:
        run = RUNNERS[system](trace, settings, work)
        if isinstance(run, SystemRun):
            run.extra["checkpoint_every_steps"] = settings.checkpoint_every
            stop = stop_of(run, trace, settings, work / "logs")
            run.stopped = None if stop is None else stop.as_json()
        return run
    except Exception as error:  # noqa: BLE001 - one system failing must not lose the others
        logging.getLogger(__name__).exception("%s failed", system)
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    finally:
        # A run's logs and checkpoints (76 MB a liveput run in the pipeline regime; a full
        # benchmark left 1.6 GB in a tmpfs) are kept only where --work-dir asks for them.
        if not settings.work_dir:
            shutil.rmtree(work, ignore_errors=True)


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
        run = _run(system, constant, settings)
        if isinstance(run, SystemRun):
            runs[system] = run
    for system, twin in twins.items():
        if twin in runs:
            runs[system] = runs[twin]
    return runs


SAME_WITHOUT_PREEMPTION = {
    "liveput-restart": "liveput",
    "torchrun-notice": "torchrun",
    "torchrun-pp-notice": "torchrun-pp",
}
"""Systems that do what another does while no instance is lost (a policy's restarts, a peer's
checkpoint on notice): their no-preemption run is the other's."""


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
) -> dict[int, float]:
    """liveput's samples/s with ``n`` instances and no preemption, ``n`` from the regime's
    fewest to its workers (``counts`` only, the others interpolated, where given), each after a
    third of its window (the simulator's throughput per instance count: the instances share
    this machine's cores). ``steady``: the run of the regime's steady instances already made."""
    every = range(regime.fewest_instances, regime.workers + 1)
    rates = {}
    for count in every if counts is None else counts:
        if count == regime.steady_instances and steady is not None:
            rates[count] = steady.rate(settings.window_s / 3)
            continue
        constant = Trace(f"constant-{count}", count, [], [], [], window_s * settings.time_scale)
        run = _run("liveput", constant, dataclasses.replace(settings, window_s=window_s))
        if isinstance(run, SystemRun):
            rates[count] = run.rate(window_s / 3)
    rates = interpolated({n: r for n, r in rates.items() if r > 0}, every)
    return {count: round(rate, 2) for count, rate in rates.items()}


def steady_rates(runs: dict[str, SystemRun], window_s: float) -> dict[str, float]:
    """Samples/s of each no-preemption run after a third of its window (past start-up)."""
    return {system: round(run.rate(window_s / 3), 2) for system, run in runs.items()}


def first_step_s(run: SystemRun) -> float | None:
    """Wall seconds from the cloud's start to the run's first committed step (start-up)."""
    return next((t for t, samples in run.timeline if samples > 0), None)


def loss_signal_delay(text: str) -> float | None:
    """``--loss-signal-delay``'s value: trace seconds >= 0, or ``none`` (never reported)."""
    if text.strip().lower() == "none":
        return None
    try:
        delay_s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds or none: {text!r}") from None
    if not delay_s >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 s or none, got {text}")
    return delay_s


def build_parser() -> argparse.ArgumentParser:
    """``python -m bench peers``'s options."""
    parser = argparse.ArgumentParser(
        prog="python -m bench peers", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="one trace, one seed (under 10 minutes)"
    )
    parser.add_argument(
        "--regime",
        choices=sorted(REGIMES),
        default="data-parallel",
        help="data-parallel: tiny-gpt on loopback (default); pipeline: gpt2-small under a "
        "memory budget on hosts with shaped links",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        default=None,
        help="each instance's link, Mbit/s (default: the regime's; pipeline 100)",
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
        help="seeds of the generated traces (default: data-parallel 20,22; pipeline 20)",
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
        type=float,
        default=None,
        help="liveput's --notice-margin, wall s (default: the regime's: "
        + "; ".join(f"{r.name} {r.notice_margin_s:g}" for r in REGIMES.values())
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
            regime.notice_margin_s if args.notice_margin is None else args.notice_margin
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
        base, window_s=regime.steady_window_s / 2 if args.quick else regime.steady_window_s
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
    measured, by_count = None, {}
    if not args.no_sim:
        from bench.peers_sim import measure

        startup_s = first_step_s(steady["liveput"]) if "liveput" in steady else None
        print(
            f"liveput on {regime.fewest_instances} to {regime.workers} instances, "
            "no preemption ...",
            flush=True,
        )
        by_count = rates_by_count(
            steady_settings,
            steady.get("liveput"),
            regime.count_window_s * (2 / 3 if args.quick else 1),
            regime,
            regime.quick_counts if args.quick else None,
        )
        print(
            "samples/s by instance count: "
            + ", ".join(f"{n}: {rate:.1f}" for n, rate in by_count.items()),
            flush=True,
        )
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
    rates = steady_rates(steady, steady_settings.window_s)
    every_s = (
        regime.checkpoint_every_s if args.checkpoint_every_s is None else args.checkpoint_every_s
    )
    batch = _global_batch(base.job)
    every = {s: steps_between_checkpoints(every_s, rates.get(s), batch) for s in systems}
    print(
        f"checkpoints every {every_s:g} s: "
        + ", ".join(f"{s} every {k} steps" for s, k in every.items()),
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
                runs[system].append(_run(system, trace, chosen_k))
        simulated = {}
        if measured is not None:
            from bench.peers_sim import predict

            simulated = predict(trace, measured, settings.time_scale, settings.notice_lead_s, seed)
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
    print(peers_report.table(document))
    targets = regime.targets if base.notice_lead_s == 0 else regime.notice_targets or regime.targets
    _verdicts(document, targets)
    if args.json:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        peers_report.plot(document, args.plot)
        print(f"wrote {args.plot}")


HUNG_S = 60.0
"""Wall seconds an instance was held without the system taking a step after which its run
counts as broken (a crash loop or a hang, not a slow restart): no verdict is drawn from it."""


def _broken(figures: dict) -> str:
    """Why a system's median run cannot carry a ratio ('' when it can): it trained nothing, or
    it stopped while an instance was held :data:`HUNG_S` or longer."""
    if figures.get("samples") == 0:
        return "trained nothing"
    stopped = figures.get("stopped")
    if stopped and stopped["held_after_s"] >= HUNG_S:
        return f"stopped: {Stop(**stopped).describe()}"
    return ""


def _verdicts(document: dict, targets: tuple[tuple[str, float], ...]) -> None:
    for entry in document["traces"]:
        systems, simulated = entry["systems"], entry["simulated"]
        live = systems.get("liveput", {}).get("samples")
        for peer, target in targets:
            other = systems.get(peer, {}).get("samples")
            broken = [s for s in ("liveput", peer) if _broken(systems.get(s, {}))]
            if live is not None and other is not None and broken:
                # A ratio to a run that crashed or hung measures the harness, not the systems.
                print(
                    f"{entry['trace']}: liveput / {peer}: NO VERDICT, "
                    + "; ".join(f"{s} {_broken(systems[s])}" for s in broken)
                )
            elif live and other:
                ratio = live / other
                bound = entry.get("bound_samples")
                reach = (
                    ""
                    if bound is None or bound >= target * other
                    else (f"; out of reach here: {target} x {other} > the bound, {bound}")
                )
                print(
                    f"{entry['trace']}: liveput / {peer} = {ratio:.2f} (target >= {target}): "
                    f"{'PASS' if ratio >= target else 'FAIL'}{reach}"
                )
        for system, predicted in simulated.items():
            real = systems.get(system, {}).get("samples")
            if real:
                error = predicted / real - 1
                print(
                    f"{entry['trace']}: simulator / runtime for {system} = {predicted} / "
                    f"{real} ({error * 100:+.0f} %, target within 10 %): "
                    f"{'PASS' if abs(error) <= 0.10 else 'FAIL'}"
                )


if __name__ == "__main__":
    main()
