"""The torchrun / TorchElastic peer: the liveput job's model as plain DDP, run as users run it.

One torchrun agent per instance (``torchrun --nnodes=MIN:MAX --rdzv-backend=c10d``, one worker
each, ``--max-restarts`` large). Every membership change restarts all workers; each start resumes
from the newest complete checkpoint, saved by rank 0 every ``checkpoint_every`` steps.

The computation is the liveput job's: its layers as one ``nn.Sequential`` with their initial
weights, one optimizer over all parameters (the job's optimizers are element-wise, so this equals
liveput's per-layer ones), and step ``s`` trains on the samples ``s * B .. s * B + B - 1``: rank r
of W takes the samples :func:`sample_share` gives it (the batch split by samples, so that any
number of ranks up to the batch trains; ranks beyond it are spares), and its mean loss is
weighted by ``W * n_r / B`` so that DDP's average of the gradients is the global batch's.

Rank 0 appends one JSON line per step to ``--progress`` (``t``: wall time, ``step``, ``loss``,
``world``) and one ``start`` line per worker-group start, which the benchmark reads.

Run: ``torchrun ... -m bench.peers_ddp --checkpoint-dir DIR --progress FILE``.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.models.jobs import resolve_job
from liveput.runtime.instance_env import NOTICE_FILE_ENV
from liveput.runtime.launch import DEFAULT_COMM_TIMEOUT_S

CHECKPOINT_GLOB = "step-*.pt"
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class DDPConfig:
    """One worker of the DDP peer."""

    checkpoint_dir: str
    """Shared directory of the checkpoints (every instance sees it, as it would an NFS or S3)."""
    job: str = "tiny-gpt"
    """Built-in liveput job whose model, data, loss and optimizer are trained."""
    checkpoint_every: int = 10
    """K: rank 0 saves after every K-th step."""
    steps: int = 1_000_000_000
    """Train until this step (exclusive); the benchmark stops the run by its window instead."""
    progress_file: str | None = None
    """Where rank 0 appends its per-step JSON lines (None: nowhere)."""
    keep_checkpoints: int = 2
    """Only the newest this many checkpoints stay on disk."""
    checkpoint_on_notice: bool = False
    """Also save at the first step boundary after any rank's instance is noticed of its
    preemption (its notice file, ``LIVEPUT_NOTICE_FILE``, appears): what a careful user adds to
    a torchrun job on spot instances (``torchrun-notice``, ``torchrun-pp-notice``)."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.steps < 1 or self.keep_checkpoints < 1:
            raise LiveputError("peers_ddp: --checkpoint-every, --steps and --keep must be >= 1")


def build_model(job: Job) -> nn.Sequential:
    """The job's unsplit layers with their initial weights."""
    return nn.Sequential(*[copy.deepcopy(layer) for layer in job.layers])


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint (written under a temporary name, then renamed)."""
    found = sorted(directory.glob(CHECKPOINT_GLOB))
    return found[-1] if found else None


def _save(
    directory: Path, next_step: int, model: nn.Module, optimizer: torch.optim.Optimizer, keep: int
) -> None:
    path = directory / f"step-{next_step:010d}.pt"
    partial = path.with_suffix(".partial")
    torch.save(
        {"next_step": next_step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
        partial,
    )
    os.replace(partial, path)
    for old in sorted(directory.glob(CHECKPOINT_GLOB))[:-keep]:
        old.unlink(missing_ok=True)


def sample_share(global_batch_size: int, rank: int, world: int) -> range:
    """Offsets in a step's batch that rank ``rank`` of ``world`` trains: the batch split by
    samples, as even as it divides (with more ranks than samples, those beyond it get none).

    By samples, not by the job's micro-batches: a peer's data-parallel width is its instance
    count, which may exceed the job's micro-batch count (gpt2-small: 4 micro-batches of 2, 8
    instances), where a split by micro-batches has no share for some ranks."""
    if world > global_batch_size:
        return range(rank, rank + 1) if rank < global_batch_size else range(0)
    return range(rank * global_batch_size // world, (rank + 1) * global_batch_size // world)


def local_batch(job: Job, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of rank ``rank``'s share of step ``step``. A rank with no share (more
    ranks than samples) gets the step's first sample, which :func:`loss_weight` weighs 0: it
    takes part in the collectives as a spare, adding nothing to the gradient."""
    share = sample_share(job.global_batch_size, rank, world) or range(1)
    size = job.micro_batch_size
    micro = range(share.start // size, (share.stop - 1) // size + 1)
    pairs = [job.micro_batch(step, m) for m in micro]
    offset = micro.start * size
    window = slice(share.start - offset, share.stop - offset)
    return torch.cat([p[0] for p in pairs])[window], torch.cat([p[1] for p in pairs])[window]


def loss_weight(job: Job, rank: int, world: int) -> float:
    """What rank ``rank``'s mean loss is multiplied by so that the average of the ranks'
    gradients (DDP's, FSDP's, torchft's) is the global batch's: ``world * n_r / B`` for its
    ``n_r`` samples (0 for a spare)."""
    return world * len(sample_share(job.global_batch_size, rank, world)) / job.global_batch_size


def reported_loss(loss: torch.Tensor, weight: float) -> float:
    """The rank's own mean loss from its weighted one (rank 0 always has a share)."""
    return float(loss.detach()) / weight if weight else float("nan")


class NoticeWatch:
    """Whether a rank's instance was noticed since the last look, agreed by every rank of
    ``group`` (None: the default group): each rank's notice file (``notice_file``, by default
    ``LIVEPUT_NOTICE_FILE``, set by the cloud for the instance's processes) counted, summed over
    the ranks (one small all-reduce a step), and a rise of the sum is a new notice: every rank
    then saves together (FSDP's and DCP's saves are collective). Disabled, it never says so and
    takes part in no collective."""

    def __init__(
        self,
        enabled: bool,
        notice_file: str | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self.enabled = enabled
        notice_file = notice_file or os.environ.get(NOTICE_FILE_ENV)
        self.notice_file = Path(notice_file) if notice_file else None
        self.group = group
        self.seen = 0

    def new_notice(self) -> bool:
        if not self.enabled:
            return False
        mine = torch.tensor([int(self.notice_file is not None and self.notice_file.exists())])
        dist.all_reduce(mine, group=self.group)
        noticed = int(mine.item())
        rose, self.seen = noticed > self.seen, noticed
        if rose:
            LOG.info("a notice among the ranks (%d in all): checkpointing at this step", noticed)
        return rose


def run_steps(
    config: DDPConfig,
    job: Job,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    save: Callable[[int], None],
) -> None:
    """Train ``model`` (wrapped for data parallelism) from ``step`` to ``config.steps``, calling
    ``save(next_step)`` on every rank after every K-th step; rank 0 writes the progress lines."""
    rank, world = dist.get_rank(), dist.get_world_size()
    noticed = NoticeWatch(config.checkpoint_on_notice)
    progress = (
        open(config.progress_file, "a", buffering=1)  # noqa: SIM115
        if rank == 0 and config.progress_file
        else None
    )
    if progress is not None:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        progress.write(
            json.dumps({"t": time.time(), "start": step, "world": world, "restart": restart}) + "\n"
        )
    try:
        while step < config.steps:
            inputs, targets = local_batch(job, step, rank, world)
            weight = loss_weight(job, rank, world)
            loss = job.loss_fn(model(inputs), targets) * weight
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % config.checkpoint_every == 0 or noticed.new_notice():
                save(step)
            if progress is not None:
                progress.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "step": step - 1,
                            "world": world,
                            "loss": reported_loss(loss, weight),
                        }
                    )
                    + "\n"
                )
    finally:
        if progress is not None:
            progress.close()


def train(config: DDPConfig) -> nn.Sequential:
    """Train from the newest checkpoint (or the initial weights) to ``config.steps``; the model.

    Needs an initialized default process group (torchrun's environment, or a test's)."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    job = resolve_job(config.job)
    model = build_model(job)
    optimizer = job.optimizer(list(model.parameters()))
    directory = Path(config.checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    step = 0
    latest = latest_checkpoint(directory)
    if latest is not None:
        state = torch.load(latest, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["next_step"])
    ddp = DistributedDataParallel(model) if world > 1 else model

    def save(next_step: int) -> None:
        if rank == 0:
            _save(directory, next_step, model, optimizer, config.keep_checkpoints)

    run_steps(config, job, ddp, optimizer, step, save)
    return model


def worker_arguments(description: str) -> argparse.ArgumentParser:
    """The command line of a torchrun peer's worker (this one's, and :mod:`bench.peers_fsdp`'s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--job", default="tiny-gpt")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=1_000_000_000)
    parser.add_argument("--progress")
    parser.add_argument(
        "--comm-timeout-s",
        type=float,
        default=DEFAULT_COMM_TIMEOUT_S,
        help="timeout of the process group's operations, its start included (liveput's "
        "agents': 30 s, more on slow links)",
    )
    parser.add_argument(
        "--checkpoint-on-notice",
        action="store_true",
        help="also save at the first step boundary after an instance's notice file appears",
    )
    return parser


def init_group(args: argparse.Namespace) -> None:
    """The worker's gloo group, with the timeout liveput's agents have: with gloo's default (30
    min) a rank whose peer was killed between torchrun's rendezvous and the group's start waited
    for that peer's address until the store's host was killed too (torchrun on the p3 cut: no
    step from 10 s to 80 s of a 100-s window), and torchrun restarts only a group whose worker
    failed."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.comm_timeout_s))


def worker_config(args: argparse.Namespace) -> DDPConfig:
    return DDPConfig(
        args.checkpoint_dir,
        args.job,
        args.checkpoint_every,
        args.steps,
        args.progress,
        checkpoint_on_notice=args.checkpoint_on_notice,
    )


def main() -> None:
    args = worker_arguments(__doc__.splitlines()[0]).parse_args()
    config = worker_config(args)
    init_group(args)
    try:
        train(config)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
