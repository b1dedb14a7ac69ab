"""The torchrun peer as users run a model too big for one instance: FSDP2 and DCP checkpoints.

One torchrun agent per instance, as :mod:`bench.peers_ddp`, elastic over the same c10d
rendezvous, restarting every worker on each membership change. The model is the liveput job's
layers, each sharded across the workers with ``torch.distributed.fsdp.fully_shard`` (FSDP2: a
layer's parameters, gradients and optimizer state live split over the ranks and are gathered
only while it runs), then the whole model, as torchtitan shards a transformer. The checkpoints are
``torch.distributed.checkpoint`` (DCP) folders, on local disk or any fsspec URL (an S3 bucket in
the pipeline regime): every rank writes its own shards, and a restart with another number of
workers loads them re-split to its own (DCP reshards on load).

The computation is the DDP peer's: step ``s`` trains on the samples ``s * B .. s * B + B - 1``,
rank r of W on the samples :func:`bench.peers_ddp.sample_share` gives it, its loss weighted by
``W * n_r / B`` (FSDP averages the gradients over the
ranks as DDP does), one optimizer over the (sharded) parameters. Progress lines as the DDP peer's.

Run: ``torchrun ... -m bench.peers_fsdp --checkpoint-dir DIR --progress FILE``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from bench.peers_ddp import (
    DDPConfig,
    build_model,
    init_group,
    run_steps,
    worker_arguments,
    worker_config,
)
from liveput.models.jobs import resolve_job
from liveput.objectstore import url_to_fs

CHECKPOINT_PREFIX = "step-"
METADATA = ".metadata"


def _checkpoints(fs: Any, root: str) -> list[str]:
    """The DCP checkpoint folders under ``root``, complete or not, oldest first."""
    try:
        names = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    return sorted(
        n for n in names if n.rstrip("/").rsplit("/", 1)[-1].startswith(CHECKPOINT_PREFIX)
    )


def _complete(fs: Any, checkpoints: list[str]) -> list[str]:
    """Those of ``checkpoints`` that are complete: DCP writes a checkpoint's ``.metadata``
    last, once every rank's shards are in (atomically: aside, then renamed)."""
    return [name for name in checkpoints if fs.exists(f"{name}/{METADATA}")]


def latest_checkpoint(directory: str) -> str | None:
    """The newest complete DCP checkpoint under ``directory`` (a path or any fsspec URL), as
    DCP is given it: a local path, or a URL."""
    fs, root = url_to_fs(directory)
    found = _complete(fs, _checkpoints(fs, root))
    return _url(fs, found[-1]) if found else None


def shard(model: nn.Sequential) -> nn.Sequential:
    """Each layer that has parameters its own FSDP2 unit, then the model as a whole."""
    for layer in model:
        if next(layer.parameters(), None) is not None:
            fully_shard(layer)
    fully_shard(model)
    return model


def _writer(checkpoint: str) -> dcp.StorageWriter:
    if "://" in checkpoint:
        # An object is durable once its upload completes: nothing to fsync.
        return FsspecWriter(checkpoint, sync_files=False)
    return dcp.FileSystemWriter(checkpoint)


def _reader(checkpoint: str) -> dcp.StorageReader:
    return FsspecReader(checkpoint) if "://" in checkpoint else dcp.FileSystemReader(checkpoint)


def _url(fs: Any, path: str) -> str:
    """What DCP is given: a local path as it is, anything else as a URL."""
    return path if "file" in fs.protocol else fs.unstrip_protocol(path)


def _save(
    directory: str,
    next_step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    keep: int,
    rank: int,
) -> None:
    fs, root = url_to_fs(directory)
    checkpoint = _url(fs, f"{root}/{CHECKPOINT_PREFIX}{next_step:010d}")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # Collective: it returns once every rank's shards and rank 0's metadata are written.
    dcp.save(
        {"model": model_state, "optimizer": optimizer_state, "next_step": next_step},
        storage_writer=_writer(checkpoint),
    )
    if rank == 0:
        # The older complete ones past ``keep``, and what a kill left half written (no
        # metadata: nothing else is being written while this rank is here).
        found = _checkpoints(fs, root)
        complete = _complete(fs, found)
        for old in [*complete[:-keep], *(n for n in found if n not in complete)]:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(old, recursive=True)


def _load(checkpoint: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict = {"model": model_state, "optimizer": optimizer_state, "next_step": 0}
    dcp.load(state, storage_reader=_reader(checkpoint))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    return int(state["next_step"])


def train(config: DDPConfig) -> nn.Sequential:
    """Train from the newest checkpoint (or the initial weights) to ``config.steps``; the
    (sharded) model. Needs an initialized default process group."""
    torch.set_num_threads(1)
    # The job's output layers return views; nothing here changes them in place afterwards.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    rank = dist.get_rank()
    job = resolve_job(config.job)
    model = shard(build_model(job))
    optimizer = job.optimizer(list(model.parameters()))
    directory = config.checkpoint_dir
    fs, root = url_to_fs(directory)
    fs.makedirs(root, exist_ok=True)
    latest = latest_checkpoint(directory)
    step = 0 if latest is None else _load(latest, model, optimizer)

    def save(next_step: int) -> None:
        _save(directory, next_step, model, optimizer, config.keep_checkpoints, rank)

    run_steps(config, job, model, optimizer, step, save)
    return model


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole (unsharded) parameters, on every rank."""
    return {
        name: value.full_tensor() if hasattr(value, "full_tensor") else value
        for name, value in model.state_dict().items()
    }


def main() -> None:
    parser = worker_arguments(__doc__.splitlines()[0])
    parser.add_argument("--final", help="rank 0 writes the whole trained weights here at the end")
    args = parser.parse_args()
    init_group(args)
    try:
        model = train(worker_config(args))
        weights = full_state(model)
        if args.final and dist.get_rank() == 0:
            torch.save(weights, args.final)
        dist.barrier()  # every rank leaves the group once the weights are written
    finally:
        dist.destroy_process_group()
    end_worker()


def end_worker() -> None:
    """End a worker whose output is written and whose group is gone, without the interpreter's
    teardown, where a rank aborted in C++ ("terminate called without an active exception")
    after a complete run in 3 of 38 runs on a loaded machine (with or without the group
    destroyed first); ending so, 0 of 20. Its cause inside torch was not found."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
