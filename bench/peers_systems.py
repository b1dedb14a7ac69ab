"""The systems ``bench peers`` compares, by name (:data:`RUNNERS`), and one run of one of them
(:func:`run_system`): its scratch folder, why it stopped (from its logs), its checkpoint
interval, and its logs kept only where ``--work-dir`` asks."""

from __future__ import annotations

import functools
import logging
import multiprocessing
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.peers_regime import sharded_minimum
from bench.peers_run import RunSettings, SystemRun, run_liveput, run_torchrun, scratch
from bench.peers_stops import stop_of
from liveput.traces import Trace

if TYPE_CHECKING:
    from bench.peers_pp import PlannedCuts


def _torchft(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    from bench.peers_torchft import run_torchft

    return run_torchft(trace, settings, work)


def global_batch(job: str) -> int:
    """The built-in job's global batch (samples a step)."""
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


def agents_timeout_s(settings: RunSettings, state_share: float = 1.0) -> float:
    """The process-group timeout liveput's agents get for the job on these links
    (``comm_timeout_s`` of its fp32 weights and Adam's two moments; ``state_share``: the share
    of them one rank holds and sends), which every torchrun peer gets too."""
    from liveput.launch.assemble import OPTIMIZER_STATE_FACTOR
    from liveput.runtime.launch import comm_timeout_s

    state_bytes = OPTIMIZER_STATE_FACTOR * 4 * _parameters(settings.job) * state_share
    link_gbps = None if settings.link_mbit is None else settings.link_mbit / 1000
    return comm_timeout_s(state_bytes, link_gbps)


def _torchrun(trace: Trace, settings: RunSettings, work: Path, **options: Any) -> SystemRun | str:
    """:func:`bench.peers_run.run_torchrun` with liveput's agents' timeout (``options``: its
    keyword arguments)."""
    return run_torchrun(trace, settings, work, comm_timeout_s=agents_timeout_s(settings), **options)


def _shards(settings: RunSettings) -> int:
    """The fewest instances the sharded peers shard the job over (a torchrun-fsdp group, a
    torchft-hsdp replica group)."""
    return sharded_minimum(_parameters(settings.job), settings.instance_memory_gb)


def _torchrun_fsdp(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    return _torchrun(
        trace,
        settings,
        work,
        module="bench.peers_fsdp",
        system="torchrun-fsdp",
        minimum=_shards(settings),
    )


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
    return _torchrun(
        trace,
        settings,
        work,
        module="bench.peers_pp",
        system=system,
        minimum=planned.minimum,
        worker_args=worker_args,
    )


def _torchft_hsdp(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    from bench.peers_hsdp import run_torchft_hsdp

    group_size = _shards(settings)
    # A heal sends a rank's shards of the weights and Adam's moments over its link.
    timeout_s = agents_timeout_s(settings, 1 / group_size)
    return run_torchft_hsdp(trace, settings, work, group_size, timeout_s)


RUNNERS: dict[str, Callable[[Trace, RunSettings, Path], SystemRun | str]] = {
    "liveput": lambda t, s, w: run_liveput(t, s, w, "liveput", "liveput"),
    "liveput-restart": lambda t, s, w: run_liveput(t, s, w, "reactive", "liveput-restart"),
    "torchrun": _torchrun,
    "torchrun-notice": lambda t, s, w: _torchrun(
        t, s, w, system="torchrun-notice", worker_args=("--checkpoint-on-notice",)
    ),
    "torchrun-fsdp": _torchrun_fsdp,
    "torchrun-pp": _torchrun_pp,
    "torchrun-pp-notice": functools.partial(_torchrun_pp, notice=True),
    "torchft": _torchft,
    "torchft-hsdp": _torchft_hsdp,
}


def _planned_minimum(settings: RunSettings, maximum: int) -> int:
    return _planned_cuts(settings.job, settings.instance_memory_gb, maximum).minimum


def _sharded_minimum(settings: RunSettings, maximum: int) -> int:
    return _shards(settings)


FEWEST_INSTANCES: dict[str, Callable[[RunSettings, int], int]] = {
    "liveput": _planned_minimum,
    "liveput-restart": _planned_minimum,
    "torchrun-pp": _planned_minimum,
    "torchrun-pp-notice": _planned_minimum,
    "torchrun-fsdp": _sharded_minimum,
    "torchft-hsdp": _sharded_minimum,
}
"""The fewest instances each system trains the job on under a memory budget, given the most
the trace holds (liveput's plan's stages, a sharded job's shards; the others: one)."""


def fewest_instances(system: str, settings: RunSettings, maximum: int) -> int:
    """The fewest instances ``system`` trains ``settings.job`` on (1 without a budget)."""
    if settings.instance_memory_gb is None or system not in FEWEST_INSTANCES:
        return 1
    return FEWEST_INSTANCES[system](settings, maximum)


def run_system(system: str, trace: Trace, settings: RunSettings) -> SystemRun | str:
    work = scratch(settings, system)
    try:
        run = RUNNERS[system](trace, settings, work)
        if isinstance(run, SystemRun):
            run.extra["checkpoint_every_steps"] = settings.checkpoint_every
            fewest = fewest_instances(system, settings, max(1, trace.max_count()))
            stop = stop_of(run, trace, settings, work / "logs", fewest)
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


SAME_WITHOUT_PREEMPTION = {
    "liveput-restart": "liveput",
    "torchrun-notice": "torchrun",
    "torchrun-pp-notice": "torchrun-pp",
}
"""Systems that do what another does while no instance is lost (a policy's restarts, a peer's
checkpoint on notice): their no-preemption run is the other's."""
