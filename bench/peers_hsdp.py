"""The torchft peer with HSDP: FSDP2 inside each replica group, torchft across the groups.

Each instance runs one replica group of several workers (``torchrun --nproc-per-node=N``, or one
process per rank started with ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``). Inside
the group the job's layers are sharded with FSDP2 (:func:`bench.peers_fsdp.shard`'s layout, over
the group's 1-D CPU mesh) on the group's gloo process group; across the groups a torchft
``Manager`` handles the replica dimension as torchft 0.2.0's ``fsdp_test`` does: every FSDP
unit's all-reduce hook all-reduces its reduce-scattered gradient shard, group rank ``r`` with
group rank ``r`` of every other group, through the manager (sum, then divided by the
participants: gloo has no ``ReduceOp.AVG``). A group that joins late heals from a live one: its
rank ``r`` fetches rank ``r``'s local shards of the model and optimizer (torchft's HTTP
checkpoint transport) and rebuilds them as DTensors over its own mesh (same group size).

The computation is :mod:`bench.peers_fsdp`'s over ``P * N`` workers (``P`` participating groups
of ``N``): worker ``p * N + r`` takes :func:`bench.peers_ddp.local_batch`'s share of step ``s``'s
global batch, its loss weighted by ``P * N * n / B`` (FSDP divides by ``N``, the manager by
``P``). Rank 0 of participant 0 writes the progress lines (``world``: participating groups) and
saves a DCP checkpoint every K steps (collective within its group), used only when every group
was lost.

In the benchmark (:func:`run_torchft_hsdp`) a replica group spans ``N`` instances, the fewest
over which FSDP's shards fit an instance's memory, one worker each: a torchrun elastic job of
its own per group (rendezvous ``group-<k>`` on one store, ``--nnodes=N``), as a user runs HSDP
across nodes. The cloud's instances are dealt to the groups as they come: to the group short of
an instance (the lowest first), else to a new one. A group that loses an instance stops (its
FSDP collectives fail) and its survivors wait in their rendezvous for the next instance the
cloud adds; the other groups train on at the next step (torchft), and the group re-formed heals
from one of them.

Run: ``torchrun --nnodes=N --nproc-per-node=1 ... -m bench.peers_hsdp REPLICA_ID JOB
CHECKPOINT_DIR CHECKPOINT_EVERY PROGRESS_FILE [HOST [TIMEOUT_S]]`` (one torchrun per
instance; ``TORCHFT_LIGHTHOUSE`` set; HOST: the address other groups reach this worker at,
default 127.0.0.1; TIMEOUT_S: torchft's, default 10). Runs in ``bench/.peers-venv``
(torchft); trains until killed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from bench.peers_ddp import build_model, local_batch, loss_weight, reported_loss
from bench.peers_fsdp import _load, _save, latest_checkpoint
from bench.peers_hosts import HostPool
from bench.peers_run import (
    REPO,
    TORCHRUN_WORKER_ENV,
    RunSettings,
    SystemRun,
    checkpoint_location,
    placement,
    progress_run,
    replayed_cloud,
    tree_launcher,
)
from bench.peers_torchft import make_manager, run_window, start_lighthouse
from liveput.cloud.processes import Launcher, LaunchSpec
from liveput.models.jobs import resolve_job
from liveput.objectstore import url_to_fs
from liveput.traces import Trace


def shard(model: nn.Sequential, mesh: DeviceMesh) -> nn.Sequential:
    """Each layer that has parameters its own FSDP2 unit over ``mesh``, then the whole model."""
    for layer in model:
        if next(layer.parameters(), None) is not None:
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _local(tree: Any) -> Any:
    """``tree`` with every DTensor replaced by this rank's shard (what is sent to a healer)."""
    if isinstance(tree, DTensor):
        return tree.to_local()
    if isinstance(tree, dict):
        return {key: _local(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [_local(value) for value in tree]
    return tree


def _distribute(template: Any, received: Any) -> Any:
    """``received`` (a peer's :func:`_local` tree) with its shards made DTensors like the ones
    at the same place in ``template`` (this rank's own state dict)."""
    if isinstance(template, DTensor):
        return DTensor.from_local(
            received,
            template.device_mesh,
            template.placements,
            shape=template.shape,
            stride=template.stride(),
        )
    if isinstance(received, dict):
        template = template if isinstance(template, dict) else {}
        return {key: _distribute(template.get(key), value) for key, value in received.items()}
    if isinstance(received, list) and isinstance(template, list):
        return [_distribute(t, r) for t, r in zip(template, received)]
    return received


def worker(
    replica_id: str,
    job_name: str,
    checkpoint_dir: str,
    checkpoint_every: int,
    progress_file: str,
    host: str = "127.0.0.1",
    timeout_s: float = 10.0,
) -> None:
    """One rank of one replica group; trains until killed. Needs the group's default process
    group initialized; ``host``: the address the other groups reach this worker at;
    ``timeout_s``: torchft's timeout on every operation (a heal's included)."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    group_rank, group_size = dist.get_rank(), dist.get_world_size()
    job = resolve_job(job_name)
    model = shard(build_model(job), init_device_mesh("cpu", (group_size,)))
    optimizer = job.optimizer(list(model.parameters()))

    def state_dict() -> dict:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        return _local({"model": model_state, "optim": optimizer_state})

    def load_state_dict(state: dict) -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        set_state_dict(
            model,
            optimizer,
            model_state_dict=_distribute(model_state, state["model"]),
            optim_state_dict=_distribute(optimizer_state, state["optim"]),
        )

    manager = make_manager(
        state_dict,
        load_state_dict,
        replica_id,
        rank=group_rank,
        world_size=group_size,
        hostname=host,
        timeout_s=timeout_s,
        checkpoint_transport=_transport(host, timeout_s),
        # Every group builds the same initial weights (the job's seed): with torchft's default,
        # two groups that start together each healed from the other at step 0, each serving
        # its state while replacing it, and both failed.
        init_sync=False,
    )

    def all_reduce_hook(output: torch.Tensor) -> None:
        # This unit's reduce-scattered gradient shard, averaged over the participating groups;
        # a failure (a lost group) is recorded by the manager and makes the step a no-commit.
        manager.allreduce(output).wait()

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(all_reduce_hook)
    fs, root = url_to_fs(checkpoint_dir)
    fs.makedirs(root, exist_ok=True)
    latest = latest_checkpoint(checkpoint_dir)
    if latest is not None:  # every group may have been lost: the disk has the newest state
        step = _load(latest, model, optimizer)
        manager.load_state_dict({"step": step, "batches_committed": step})
    with open(progress_file, "a", buffering=1) as progress:
        if group_rank == 0:
            line = {"t": time.time(), "start": manager.current_step(), "replica": replica_id}
            progress.write(json.dumps(line) + "\n")
        while True:
            optimizer.zero_grad(set_to_none=True)
            manager.start_quorum()  # synchronous: heals this group first if it is behind
            step = manager.current_step()
            replicas = manager.num_participants()
            replica = manager.participating_rank() or 0
            world, rank = replicas * group_size, replica * group_size + group_rank
            inputs, targets = local_batch(job, step, rank, world)
            weight = loss_weight(job, rank, world)
            loss = job.loss_fn(model(inputs), targets) * weight
            loss.backward()  # reduce-scatter in the group, then the hook across the groups
            if not manager.should_commit():
                continue
            optimizer.step()
            if replica == 0 and (step + 1) % checkpoint_every == 0:
                _save(checkpoint_dir, step + 1, model, optimizer, keep=2, rank=group_rank)
            if replica == 0 and group_rank == 0:
                line = {
                    "t": time.time(),
                    "step": step,
                    "world": replicas,
                    "workers": world,
                    "loss": reported_loss(loss, weight),
                }
                progress.write(json.dumps(line) + "\n")


def _transport(host: str, timeout_s: float) -> Any:
    """torchft's HTTP checkpoint transport (what heals a group), advertised at ``host``: its own
    advertises the machine's host name, which resolves outside the hosts' namespaces."""

    from torchft.checkpointing.http_transport import HTTPTransport

    class HostTransport(HTTPTransport):
        def address(self) -> str:
            return f"http://{host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    return HostTransport(timeout=timedelta(seconds=timeout_s), num_chunks=0)


def run_torchft_hsdp(
    trace: Trace, settings: RunSettings, work: Path, group_size: int, timeout_s: float
) -> SystemRun | str:
    """torchft with HSDP on the emulated cloud (module docstring): replica groups of
    ``group_size`` instances, the lighthouse and the groups' rendezvous store on the hosts'
    gateway; ``timeout_s``: torchft's, on every operation (a heal's included)."""
    from bench.peers_torchft import ensure_venv

    try:
        python = ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError, StopIteration) as error:
        return f"torchft could not be installed: {error}"
    maximum = max(1, trace.max_count())
    with placement(settings, maximum) as pool, checkpoint_location(settings, pool, work) as where:
        return _run_groups(trace, settings, work, where, group_size, timeout_s, python, pool)


def _group_launcher(
    template: list[str], env: dict[str, str], log_dir: Path, group_size: int, pool: HostPool | None
) -> Launcher:
    """Each instance the cloud adds joins the group short of one (the lowest first), else a new
    group: ``{group}`` in ``template`` is its number."""
    groups: dict[int, list[subprocess.Popen]] = {}
    lock = threading.Lock()

    def launch(spec: LaunchSpec) -> subprocess.Popen:
        with lock:
            live = {g: [p for p in ps if p.poll() is None] for g, ps in groups.items()}
            short = [g for g, ps in sorted(live.items()) if len(ps) < group_size]
            group = short[0] if short else len(groups)
            argv = [part.replace("{group}", str(group)) for part in template]
            if pool is None:
                process = tree_launcher(argv, env, log_dir)(spec)
            else:
                process = pool.launcher(argv, env, log_dir, REPO)(spec)
            groups[group] = [*live.get(group, []), process]
            return process

    return launch


def _run_groups(
    trace: Trace,
    settings: RunSettings,
    work: Path,
    checkpoints: str,
    group_size: int,
    timeout_s: float,
    python: Path,
    pool: HostPool | None,
) -> SystemRun | str:
    from torch.distributed import TCPStore

    for sub in ("logs", "notices"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    address = "127.0.0.1" if pool is None else pool.hosts.gateway_address
    store = TCPStore(address, 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    lighthouse, url = start_lighthouse(python, address, work / "logs" / "lighthouse.log")
    progress_file = work / "progress.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        **TORCHRUN_WORKER_ENV,
        "TORCHFT_LIGHTHOUSE": url,
    }
    if pool is not None:
        env["GLOO_SOCKET_IFNAME"] = "eth0"  # every host names its interface eth0
    template = [
        str(python),
        "-m",
        "torch.distributed.run",
        f"--nnodes={group_size}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={address}:{store.port}",
        "--rdzv-id=group-{group}",
        "--max-restarts=1000000",
        "--local-addr=127.0.0.1" if pool is None else "--local-addr={host}",
        # The torchrun peers' settings (bench.peers_run): a silent node is dead after 3 s.
        "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "-m",
        "bench.peers_hsdp",
        "group-{group}",
        settings.job,
        checkpoints,
        str(settings.checkpoint_every),
        str(progress_file),
        "127.0.0.1" if pool is None else "{host}",
        str(timeout_s),
    ]
    launcher = _group_launcher(template, env, work / "logs", group_size, pool)
    cloud = replayed_cloud(trace, launcher, work / "notices", settings)
    start_unix, stopped = run_window(cloud, lighthouse, settings)
    if stopped is not None:
        return stopped
    return progress_run("torchft-hsdp", trace, settings, progress_file, start_unix)


def main() -> None:
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    host = sys.argv[6] if len(sys.argv) > 6 else "127.0.0.1"
    timeout_s = float(sys.argv[7]) if len(sys.argv) > 7 else 10.0
    # The group's own gloo group with torchft's timeout, not gloo's 30 minutes: a rank whose
    # peer was killed before the group started would wait that long (bench.peers_ddp.init_group).
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], host, timeout_s)


if __name__ == "__main__":
    main()
