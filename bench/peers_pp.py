"""The torchrun peer as users run a pipeline: ``torch.distributed.pipelining`` and DCP.

One torchrun agent per instance, as :mod:`bench.peers_ddp`, elastic over the same c10d
rendezvous, restarting every worker on each membership change. What a careful user who read
torchtitan would run on preemptible instances: the job's layers cut into P stages, each stage a
``PipelineStage`` of an ``nn.Sequential`` of its layers, a schedule over the job's micro-batches
(``Schedule1F1B``), ``D = world // P`` pipelines side by side (data parallelism across them: the
gradients of a stage all-reduced among the D ranks that hold it), ranks past ``D * P`` idle.

The cut: for each instance count the benchmark gives the worker liveput's plan's stages at that
count (``--plan``, :func:`liveput_cuts`: the configuration liveput's planner scores best on its
own profile of the job under the instances' memory budget, ``ConfigTable.best_for``, and that
configuration's stage boundaries, ``partition_layers``). The worker takes P and the boundaries
from it and runs ``D = min(world // P, M)`` pipelines (M: the job's micro-batches per step; the
planner's D obeys the same cap); the ranks left over idle until the next membership change.

The computation is the DDP peer's: step ``s`` trains on the samples ``s * B .. s * B + B - 1``,
pipeline d of D on the micro-batches :func:`~liveput.models.job.replica_micro_batches` gives it,
each micro-batch one of the schedule's; the loss of a micro-batch is weighted ``1 / M`` and the
stage's gradients summed over the pipelines, so that every stage steps with the gradient of the
global batch's mean loss, as the DDP peer's does. One optimizer per stage over its layers (the
job's optimizers are element-wise: the same as one over the whole model).

Checkpoints: every K steps (and, with ``--notice-file``, at the first step boundary after any
pipeline rank's notice appears: the pipeline ranks agree on it by an all-reduce of a count
after every step; an idle rank's kill stops no pipeline, so its notice is left alone) every
pipeline rank takes part in one DCP save (``dcp.save`` over the
pipeline ranks' group, each stage's weights and optimizer state keyed by the unsplit model's
names, ``"5.attn.weight"``; DCP writes each stage once, spread over the pipelines that hold it).
A checkpoint is complete once its ``.metadata`` is written, which DCP does last, after every
stage's part; a restart loads the newest complete one, whatever cut wrote it: each rank asks for
its own layers' keys, so a restart at another instance count (another P) loads it too.

Progress lines as the DDP peer's: a ``start`` line per worker-group start and one line per step
(``t``, ``step``, ``world``, ``loss``: the global batch's mean loss), written by the last stage
of pipeline 0 (the rank that has the loss).

Run: ``torchrun ... -m bench.peers_pp --checkpoint-dir DIR --progress FILE --plan PLAN.json``
(or ``--boundaries 0,2,4``: one cut for every instance count).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from bench.peers_ddp import NoticeWatch, init_group, worker_arguments
from bench.peers_fsdp import (
    CHECKPOINT_PREFIX,
    _checkpoints,
    _complete,
    _reader,
    _url,
    _writer,
    end_worker,
    latest_checkpoint,
)
from liveput.errors import LiveputError
from liveput.models.job import Job, replica_micro_batches
from liveput.models.jobs import resolve_job
from liveput.objectstore import url_to_fs

STATE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
"""Optimizer state flattened to one entry per parameter, keyed by the parameter's name: what
lets a stage of another cut load it (torchtitan saves pipeline stages so)."""

IDLE_TIMEOUT = timedelta(days=365)
"""How long an idle rank waits for the pipelines to finish (they run until the benchmark's
window ends or a membership change restarts the group): longer than any run."""


@dataclass(frozen=True)
class PPConfig:
    """One worker of the pipeline-parallel peer."""

    checkpoint_dir: str
    """Where the DCP checkpoints go: a local folder every instance sees, or an fsspec URL
    (``s3://bucket/prefix``), as :mod:`bench.peers_fsdp`'s."""
    cuts: Mapping[int, tuple[int, ...]]
    """Stage boundaries by instance count: layer indices where stages start, then the number of
    layers (P + 1 entries). A world not listed takes the cut of the largest listed count below
    it (its extra ranks idle)."""
    job: str = "tiny-gpt"
    """Built-in liveput job whose model, data, loss and optimizer are trained."""
    checkpoint_every: int = 10
    """K: every pipeline rank saves its stage after every K-th step."""
    steps: int = 1_000_000_000
    """Train until this step (exclusive); the benchmark stops the run by its window instead."""
    progress_file: str | None = None
    """Where the last stage of pipeline 0 appends its per-step JSON lines (None: nowhere)."""
    keep_checkpoints: int = 2
    """Only the newest this many complete checkpoints stay."""
    notice_file: str | None = None
    """This instance's preemption notice file (None: notices are not read): once any pipeline
    rank's appears, every pipeline rank checkpoints at the next step boundary (an idle rank's is
    not read: its kill stops no pipeline)."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.steps < 1 or self.keep_checkpoints < 1:
            raise LiveputError("peers_pp: --checkpoint-every, --steps and --keep must be >= 1")
        if not self.cuts:
            raise LiveputError("peers_pp: no stage cut given (--plan or --boundaries)")
        for world, bounds in self.cuts.items():
            if (
                world < 1
                or len(bounds) < 2
                or bounds[0] != 0
                or any(b <= a for a, b in zip(bounds, bounds[1:], strict=False))
                or len(bounds) - 1 > world
            ):
                raise LiveputError(
                    f"peers_pp: cut {list(bounds)} for {world} instances: boundaries must "
                    "start at 0, increase, and make at most one stage per instance"
                )


@dataclass(frozen=True)
class Layout:
    """Where each rank of a world sits: rank ``d * P + s`` is stage s of pipeline d."""

    world: int
    """Ranks (instances)."""
    boundaries: tuple[int, ...]
    """The cut: P + 1 layer indices."""
    pipelines: int
    """D: pipelines that train; ranks from ``D * P`` on idle."""

    @property
    def stages(self) -> int:
        """P."""
        return len(self.boundaries) - 1

    @property
    def active(self) -> int:
        """Ranks that hold a stage (``D * P``)."""
        return self.pipelines * self.stages

    def role(self, rank: int) -> tuple[int, int] | None:
        """(pipeline, stage) of ``rank``, None for an idle rank."""
        if rank >= self.active:
            return None
        return divmod(rank, self.stages)

    def layers(self, stage: int) -> range:
        """Indices of stage ``stage``'s layers."""
        return range(self.boundaries[stage], self.boundaries[stage + 1])


def layout(config: PPConfig, world: int, num_micro_batches: int) -> Layout:
    """The layout of ``world`` ranks: the cut of ``world`` (or of the largest count below it),
    ``D = min(world // P, M)`` pipelines."""
    counts = [n for n in config.cuts if n <= world]
    if not counts:
        raise LiveputError(
            f"peers_pp: no stage cut for {world} instances (cuts for {sorted(config.cuts)})"
        )
    bounds = tuple(config.cuts[max(counts)])
    stages = len(bounds) - 1
    if stages > world:
        raise LiveputError(f"peers_pp: {stages} stages need {stages} instances, not {world}")
    # The planner's D obeys the same cap (its configurations need a micro-batch per pipeline):
    # past it the ranks idle rather than split a micro-batch.
    return Layout(world, bounds, min(world // stages, num_micro_batches))


def stage_module(job: Job, layers: range) -> nn.Sequential:
    """The stage's layers as one ``nn.Sequential`` named by their indices in the unsplit model
    (its parameters are ``"5.attn.weight"``, as in ``nn.Sequential(*job.layers)``)."""
    return nn.Sequential(OrderedDict((str(i), job.layers[i]) for i in layers))


def _check_ties(job: Job, lay: Layout) -> None:
    """Tied parameters in two stages would need their gradients summed across stages, which
    this peer does not do: such a job is refused rather than trained differently."""
    for first, second in job.tied_weights:
        stage_of = [
            next(s for s in range(lay.stages) if int(name.split(".")[0]) in lay.layers(s))
            for name in (first, second)
        ]
        if stage_of[0] != stage_of[1]:
            raise LiveputError(
                f"peers_pp: {first} and {second} are tied but fall in stages {stage_of}"
            )


@dataclass
class _Groups:
    """The process groups of one layout (every rank creates every group, in one order)."""

    active: dist.ProcessGroup | None
    """The pipeline ranks (DCP's saves and loads); None on an idle rank."""
    pipeline: dist.ProcessGroup | None
    """This rank's pipeline (the stages' sends and receives)."""
    stage: dist.ProcessGroup | None
    """The D ranks of this rank's stage (its gradients' all-reduce)."""
    idle: dist.ProcessGroup
    """Every rank, with a timeout longer than any run: the end-of-run barrier idle ranks wait
    in (the default group's 30-min timeout would fail them in a long run)."""


def _groups(lay: Layout, rank: int) -> _Groups:
    role = lay.role(rank)
    active = dist.new_group(list(range(lay.active)))
    pipelines = [
        dist.new_group(list(range(d * lay.stages, (d + 1) * lay.stages)))
        for d in range(lay.pipelines)
    ]
    stages = [
        dist.new_group([d * lay.stages + s for d in range(lay.pipelines)])
        for s in range(lay.stages)
    ]
    idle = dist.new_group(list(range(lay.world)), timeout=IDLE_TIMEOUT)
    if role is None:
        return _Groups(None, None, None, idle)
    return _Groups(active, pipelines[role[0]], stages[role[1]], idle)


def _state(stage: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return get_state_dict(stage, optimizer, options=STATE_OPTIONS)


def save_checkpoint(
    directory: str,
    next_step: int,
    stage: nn.Module,
    optimizer: torch.optim.Optimizer,
    group: dist.ProcessGroup,
    keep: int,
) -> None:
    """Every pipeline rank's stage into one DCP checkpoint (collective over ``group``); the
    group's first rank then removes the complete ones past ``keep`` and what a kill left half
    written."""
    fs, root = url_to_fs(directory)
    checkpoint = _url(fs, f"{root}/{CHECKPOINT_PREFIX}{next_step:010d}")
    model_state, optimizer_state = _state(stage, optimizer)
    dcp_save(
        {"model": model_state, "optimizer": optimizer_state, "next_step": next_step},
        storage_writer=_writer(checkpoint),
        process_group=group,
    )
    if dist.get_rank(group) == 0:
        found = _checkpoints(fs, root)
        complete = _complete(fs, found)
        for old in [*complete[:-keep], *(n for n in found if n not in complete)]:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(old, recursive=True)


def load_checkpoint(
    checkpoint: str, stage: nn.Module, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup
) -> int:
    """This rank's layers and their optimizer state from ``checkpoint`` (collective over
    ``group``), whatever cut wrote it; the step it resumes at."""
    model_state, optimizer_state = _state(stage, optimizer)
    state: dict = {"model": model_state, "optimizer": optimizer_state, "next_step": 0}
    dcp_load(state, storage_reader=_reader(checkpoint), process_group=group)
    set_state_dict(
        stage,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=STATE_OPTIONS,
    )
    return int(state["next_step"])


def _pipeline_batch(
    job: Job, step: int, pipeline: int, pipelines: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pipeline ``pipeline``'s samples of step ``step``, its micro-batches in order
    (inputs, targets, how many micro-batches)."""
    chunks = replica_micro_batches(job.num_micro_batches, pipelines, pipeline)
    pairs = [job.micro_batch(step, m) for m in chunks]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs]), len(chunks)


def _reduce_gradients(
    stage: nn.Module, group: dist.ProcessGroup, pipelines: int, loss: torch.Tensor | None
) -> torch.Tensor | None:
    """Sum the stage's gradients over the D pipelines (one flat all-reduce); the last stage's
    loss share rides in the same buffer (so it costs no collective of its own). The summed
    loss, where one was given."""
    params = [p for p in stage.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    pieces = [g.reshape(-1) for g in grads]
    if loss is not None:
        pieces.append(loss.reshape(1).to(pieces[0].dtype if pieces else loss.dtype))
    if pipelines > 1 and pieces:
        flat = torch.cat(pieces)
        dist.all_reduce(flat, group=group)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            p.grad = flat[offset : offset + g.numel()].view_as(g)
            offset += g.numel()
        if loss is not None:
            return flat[offset]
    return loss


def train(config: PPConfig) -> tuple[nn.Module, Layout]:
    """Train from the newest complete checkpoint (or the initial weights) to ``config.steps``;
    this rank's stage (empty on an idle rank) and the layout. Needs an initialized default
    (gloo) process group."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    job = resolve_job(config.job)
    lay = layout(config, world, job.num_micro_batches)
    _check_ties(job, lay)
    groups = _groups(lay, rank)
    role = lay.role(rank)
    fs, root = url_to_fs(config.checkpoint_dir)
    fs.makedirs(root, exist_ok=True)
    latest = latest_checkpoint(config.checkpoint_dir)
    if role is None:
        # Nothing of the model on an idle rank (its memory stays free, as an idle instance's).
        job.layers = []
        # An idle rank takes part in no step: its instance's kill stops no pipeline (nothing of
        # theirs waits on it; torchrun restarts the group only when a worker fails, or at the
        # next arrival), so its notice is not theirs to act on. Where it took part in the
        # notices' agreement every step, its kill failed the pipelines' next step and cost a
        # restart (measured: tiny-gpt, 3 instances at 1x2, the idle one killed).
        _broadcast_step(0)
        dist.barrier(group=groups.idle)
        return nn.Sequential(), lay
    pipeline, stage_index = role
    assert groups.active is not None and groups.pipeline is not None and groups.stage is not None
    module = stage_module(job, lay.layers(stage_index))
    # Only this stage's layers stay alive: the job's others go (an instance holds its stage).
    job.layers = []
    optimizer = job.optimizer(list(module.parameters()))
    step = 0 if latest is None else load_checkpoint(latest, module, optimizer, groups.active)
    step = _broadcast_step(step)
    pipe = PipelineStage(
        module, stage_index, lay.stages, torch.device("cpu"), group=groups.pipeline
    )
    micro_batches = len(replica_micro_batches(job.num_micro_batches, lay.pipelines, pipeline))
    scale = 1.0 / job.num_micro_batches

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Each micro-batch's mean loss over the step's M micro-batches: summed over the
        # micro-batches and the pipelines, the global batch's mean loss, as the DDP peer's.
        return job.loss_fn(output, target) * scale

    # Schedule1F1B refuses fewer micro-batches than stages (schedules.py: "must be greater
    # than or equal to the number of stages"); with that few, 1F1B's warm-up holds every
    # micro-batch on every stage anyway, which is GPipe's fill-drain: the same schedule.
    schedule_class = Schedule1F1B if micro_batches >= lay.stages else ScheduleGPipe
    schedule = schedule_class(pipe, micro_batches, loss_fn=loss_fn, scale_grads=False)
    writer = rank == lay.stages - 1  # the last stage of pipeline 0
    progress = (
        open(config.progress_file, "a", buffering=1)  # noqa: SIM115
        if writer and config.progress_file
        else None
    )
    if progress is not None:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        progress.write(
            json.dumps(
                {
                    "t": time.time(),
                    "start": step,
                    "world": world,
                    "restart": restart,
                    "pipelines": lay.pipelines,
                    "stages": lay.stages,
                }
            )
            + "\n"
        )
    notices = NoticeWatch(config.notice_file is not None, config.notice_file, groups.active)
    first, last = stage_index == 0, stage_index == lay.stages - 1
    try:
        while step < config.steps:
            inputs, targets, _ = _pipeline_batch(job, step, pipeline, lay.pipelines)
            optimizer.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            args = (inputs,) if first else ()
            if last:
                schedule.step(*args, target=targets, losses=losses)
            else:
                schedule.step(*args)
            share = torch.stack([v.detach() for v in losses]).sum() if last else None
            loss = _reduce_gradients(module, groups.stage, lay.pipelines, share)
            optimizer.step()
            step += 1
            if step % config.checkpoint_every == 0 or notices.new_notice():
                save_checkpoint(
                    config.checkpoint_dir,
                    step,
                    module,
                    optimizer,
                    groups.active,
                    config.keep_checkpoints,
                )
            if progress is not None and loss is not None:
                progress.write(
                    json.dumps(
                        {"t": time.time(), "step": step - 1, "world": world, "loss": float(loss)}
                    )
                    + "\n"
                )
    finally:
        if progress is not None:
            progress.close()
    dist.barrier(group=groups.idle)
    return module, lay


def _broadcast_step(step: int) -> int:
    """Rank 0's step (the pipelines' first rank, which loaded it) on every rank."""
    value = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(value, src=0)
    return int(value.item())


def parse_cuts(plan: str | None, boundaries: str | None) -> dict[int, tuple[int, ...]]:
    """The cuts by instance count from ``--plan`` (a JSON file ``{"cuts": {"4": [0, 4, 7, 10,
    14], ...}}``, :func:`write_plan`) or ``--boundaries`` (``0,2,4``: one cut for every count
    from its stage count on)."""
    if (plan is None) == (boundaries is None):
        raise LiveputError("peers_pp: give exactly one of --plan and --boundaries")
    if boundaries is not None:
        try:
            bounds = tuple(int(b) for b in boundaries.split(","))
        except ValueError:
            raise LiveputError(
                f"peers_pp: --boundaries {boundaries!r}: integers, by commas"
            ) from None
        return {len(bounds) - 1: bounds}
    assert plan is not None
    try:
        cuts = json.loads(Path(plan).read_text())["cuts"]
        return {int(n): tuple(int(b) for b in bounds) for n, bounds in cuts.items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LiveputError(f"peers_pp: --plan {plan}: {error}") from None


@dataclass(frozen=True)
class PlannedCuts:
    """liveput's plan's configuration at each instance count, as the peer runs it."""

    cuts: dict[int, tuple[int, ...]]
    """Stage boundaries by instance count (counts on which nothing fits: absent)."""
    configurations: dict[int, tuple[int, int]]
    """(D, P) the planner scores best by instance count (the peer runs that P, and D =
    ``min(count // P, M)``)."""

    @property
    def minimum(self) -> int:
        """The fewest instances on which a configuration fits."""
        return min(self.cuts)


def liveput_cuts(job_name: str, instance_memory_gb: float | None, maximum: int) -> PlannedCuts:
    """liveput's planner on its own profile of the job (measured here, one thread, as the
    runtime's coordinator measures it, ``profile_job``) for instances of
    ``instance_memory_gb``: the best configuration of each count up to ``maximum``
    (``ConfigTable.best_for``, ``liveput plan``'s ``best_now``) and its stage cut
    (``partition_layers``, the boundaries the runtime's plans carry)."""
    from liveput.perf.estimator import estimate_configs
    from liveput.perf.partition import partition_layers
    from liveput.runtime.planning import planning_profile, profile_job

    torch.set_num_threads(1)
    job = resolve_job(job_name)
    profile = planning_profile(profile_job(job), job, instance_memory_gb)
    table = estimate_configs(profile, maximum)
    cuts, configurations = {}, {}
    for count in range(1, maximum + 1):
        best = table.best_for(count)
        if best is None:
            continue
        data_parallel, stages, _ = best
        configurations[count] = (data_parallel, stages)
        cuts[count] = tuple(int(b) for b in partition_layers(profile, stages))
    if not cuts:
        raise LiveputError(
            f"peers_pp: {job_name} fits no configuration of up to {maximum} instances"
        )
    return PlannedCuts(cuts, configurations)


def write_plan(path: Path, planned: PlannedCuts) -> None:
    """The ``--plan`` file of ``planned``."""
    path.write_text(
        json.dumps(
            {
                "cuts": {str(n): list(b) for n, b in planned.cuts.items()},
                "configurations": {str(n): list(c) for n, c in planned.configurations.items()},
            }
        )
        + "\n"
    )


def arguments() -> argparse.ArgumentParser:
    """The worker's command line: the DDP peer's, and the cut and the notice file."""
    parser = worker_arguments(__doc__.splitlines()[0])
    parser.add_argument("--plan", help="JSON file of stage cuts by instance count (write_plan)")
    parser.add_argument("--boundaries", help="one cut for every instance count: 0,2,4")
    parser.add_argument(
        "--notice-file", help="this instance's notice file: checkpoint once it appears"
    )
    return parser


def config_of(args: argparse.Namespace) -> PPConfig:
    return PPConfig(
        args.checkpoint_dir,
        parse_cuts(args.plan, args.boundaries),
        args.job,
        args.checkpoint_every,
        args.steps,
        args.progress,
        notice_file=args.notice_file,
    )


def main() -> None:
    args = arguments().parse_args()
    config = config_of(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    init_group(args)
    try:
        train(config)
    finally:
        dist.destroy_process_group()
    end_worker()  # as the FSDP peer's worker: a gloo rank aborted in the interpreter's teardown


if __name__ == "__main__":
    main()
