"""The torchft peer: per-step fault tolerance, one replica group per instance.

torchft (PyPI ``torchft``) is installed into the benchmark's own environment,
``bench/.peers-venv`` (:func:`ensure_venv`: a venv that also sees this interpreter's packages,
torch among them, through a ``.pth`` file, so torch stays the project's pin); it is not a
dependency of liveput. The benchmark starts the lighthouse; each instance runs one replica group
of one worker (:func:`worker`), which hosts its group's store, joins the quorum every step
(synchronously, so that it knows the participants before it takes its share of the batch), and,
when it joins late, heals from a peer's live state. Survivors of a preemption go on at the next
step. Participant 0 also saves a checkpoint every K steps, used only when every replica was lost.

The computation is :mod:`bench.peers_ddp`'s: the job's layers as one model, step ``s`` on the
global batch ``s``, split over the step's participants.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers_run import (
    REPO,
    RunSettings,
    SystemRun,
    progress_run,
    replayed_cloud,
    tree_launcher,
)
from liveput.cloud.emulated import EmulatedProvider
from liveput.models.jobs import resolve_job
from liveput.testbed import free_port
from liveput.traces import Trace

VENV = REPO / "bench" / ".peers-venv"
TORCHFT = "torchft==0.2.0"


def ensure_venv() -> Path:
    """The peers' interpreter, with torchft installed (created on first use); raises
    RuntimeError saying why when it cannot be."""
    python = VENV / "bin" / "python"
    probe = [str(python), "-c", "import torchft, torch; print(torch.__version__)"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    site = next((VENV / "lib").glob("python3*/site-packages"))
    (site / "liveput-parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", TORCHFT], capture_output=True, text=True
    )
    if install.returncode != 0:
        raise RuntimeError(f"pip install {TORCHFT} failed: {install.stderr.strip()[-300:]}")
    return python


def start_lighthouse(python: Path, address: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """torchft's lighthouse at ``address`` (the peers' settings: one replica is a quorum, 1-s
    join timeout, 3-s heartbeat timeout), its log in ``log_path``; returns it and its URL."""
    port = free_port(address)
    with open(log_path, "wb") as log:
        lighthouse = subprocess.Popen(
            [
                str(python.parent / "torchft_lighthouse"),
                "--min_replicas",
                "1",
                "--bind",
                f"{address}:{port}",
                "--join_timeout_ms",
                "1000",
                "--heartbeat_timeout_ms",
                "3000",
                "--quorum_tick_ms",
                "100",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return lighthouse, f"http://{address}:{port}"


def run_window(
    cloud: EmulatedProvider, lighthouse: subprocess.Popen, settings: RunSettings
) -> tuple[float, str | None]:
    """Replay the cloud for the window, then stop it and the lighthouse: (the cloud's start,
    Unix seconds; why it stopped early, or None)."""
    start_unix, start = time.time(), time.monotonic()
    try:
        cloud.start_background()
        while time.monotonic() - start < settings.window_s:
            if lighthouse.poll() is not None:
                return start_unix, f"the torchft lighthouse exited (code {lighthouse.returncode})"
            time.sleep(0.2)
    finally:
        cloud.close()
        lighthouse.kill()
        lighthouse.wait()
    return start_unix, None


def run_torchft(trace: Trace, settings: RunSettings, work: Path) -> SystemRun | str:
    """torchft on the emulated cloud: the lighthouse here, a replica group per instance."""
    try:
        python = ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError, StopIteration) as error:
        return f"torchft could not be installed: {error}"
    for sub in ("logs", "notices", "checkpoints"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    lighthouse, url = start_lighthouse(python, "127.0.0.1", work / "logs" / "lighthouse.log")
    progress_file = work / "progress.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "OMP_NUM_THREADS": "1",
        "TORCHFT_LIGHTHOUSE": url,
    }
    template = [
        str(python),
        "-m",
        "bench.peers_torchft",
        "{instance_id}",
        settings.job,
        str(work / "checkpoints"),
        str(settings.checkpoint_every),
        str(progress_file),
    ]
    cloud = replayed_cloud(
        trace, tree_launcher(template, env, work / "logs"), work / "notices", settings
    )
    start_unix, stopped = run_window(cloud, lighthouse, settings)
    if stopped is not None:
        return stopped
    run = progress_run("torchft", trace, settings, progress_file, start_unix)
    if len(run.timeline) < 2:
        log = work / "logs" / "i-0000.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        return f"torchft trained no step ({tail[0][:200] if tail else 'no log'})"
    return run


def make_manager(
    state_dict: Callable[[], dict],
    load_state_dict: Callable[[dict], None],
    replica_id: str,
    rank: int = 0,
    world_size: int = 1,
    hostname: str = "127.0.0.1",
    timeout_s: float = 10.0,
    **options: Any,
) -> Any:
    """A torchft ``Manager`` as the peers run it: gloo across replica groups, training on with
    one group, a synchronous quorum (each step knows its participants before it takes its
    share of the batch), ``timeout_s`` on every operation (a heal's included); ``hostname``:
    the address the other groups reach it at; ``options``: more of ``Manager``'s (the group's
    store address, if not the environment's)."""
    from datetime import timedelta

    from torchft import Manager, ProcessGroupGloo

    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=timeout_s)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        use_async_quorum=False,
        timeout=timedelta(seconds=timeout_s),
        rank=rank,
        world_size=world_size,
        replica_id=replica_id,
        hostname=hostname,
        **options,
    )


def worker(
    replica_id: str, job_name: str, checkpoint_dir: str, checkpoint_every: int, progress_file: str
) -> None:
    """One replica group of one worker; trains until killed."""
    import json

    import torch
    from torch.distributed import TCPStore

    from bench.peers_ddp import (
        _save,
        build_model,
        latest_checkpoint,
        local_batch,
        loss_weight,
        reported_loss,
    )

    torch.set_num_threads(1)
    job = resolve_job(job_name)
    model = build_model(job)
    inner = job.optimizer(list(model.parameters()))
    directory = Path(checkpoint_dir)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])

    manager = make_manager(
        state_dict,
        load_state_dict,
        replica_id,
        store_addr="127.0.0.1",
        store_port=store.port,
    )
    latest = latest_checkpoint(directory)
    if latest is not None:  # every replica may have been lost: the disk has the newest state
        saved = torch.load(latest, weights_only=True)
        model.load_state_dict(saved["model"])
        inner.load_state_dict(saved["optimizer"])
        manager.load_state_dict(
            {"step": int(saved["next_step"]), "batches_committed": int(saved["next_step"])}
        )
    parameters = [p for p in model.parameters() if p.requires_grad]
    with open(progress_file, "a", buffering=1) as progress:
        progress.write(
            json.dumps({"t": time.time(), "start": manager.current_step(), "replica": replica_id})
            + "\n"
        )
        while True:
            inner.zero_grad(set_to_none=True)
            manager.start_quorum()
            step = manager.current_step()
            world = manager.num_participants()
            rank = manager.participating_rank()
            inputs, targets = local_batch(job, step, rank or 0, world)
            weight = loss_weight(job, rank or 0, world)
            loss = job.loss_fn(model(inputs), targets) * weight
            loss.backward()
            # The gradients averaged over the participants in one flat buffer. (torchft 0.2.0's
            # DistributedDataParallel fails an assertion in its comm hook once a peer is lost,
            # killing the survivor; the manager's allreduce is what it wraps, and it turns the
            # step into a no-commit instead.)
            flat = torch.cat([p.grad.reshape(-1) for p in parameters])
            manager.allreduce(flat).wait()
            offset = 0
            for p in parameters:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            if not manager.should_commit():
                continue
            inner.step()
            if rank == 0:
                progress.write(
                    json.dumps(
                        {
                            "t": time.time(),
                            "step": step,
                            "world": world,
                            "loss": reported_loss(loss, weight),
                        }
                    )
                    + "\n"
                )
                if (step + 1) % checkpoint_every == 0:
                    _save(directory, step + 1, model, inner, keep=2)


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
