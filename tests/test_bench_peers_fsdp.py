"""The FSDP2 + DCP torchrun peer: the DDP peer's computation, resumed exactly from its own
checkpoints, and from a checkpoint written by another number of workers (DCP reshards it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist

from bench import peers_ddp
from bench.peers_ddp import DDPConfig

pytestmark = pytest.mark.process  # gloo groups, and torchrun's workers
JOB = "tiny-gpt-small"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def world_of_one(tmp_path: Path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _fsdp() -> ModuleType:
    """``bench.peers_fsdp``, imported by the tests that use it: with it comes
    torch.distributed.checkpoint, 0.6 s of every xdist worker's collection, where one worker runs
    this file."""
    import bench.peers_fsdp

    return bench.peers_fsdp


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


def test_fsdp_peer_trains_as_the_ddp_peer_and_resumes_from_its_checkpoint_exactly(
    tmp_path: Path, world_of_one
) -> None:
    fsdp = _fsdp()
    straight = fsdp.full_state(fsdp.train(DDPConfig(str(tmp_path / "straight"), JOB, 3, steps=10)))
    ddp = peers_ddp.train(DDPConfig(str(tmp_path / "ddp"), JOB, 3, steps=10)).state_dict()
    assert set(straight) == set(ddp) and _close(straight, ddp)
    # Killed after step 7 (steps 6 and 7, after the checkpoint at 6, are lost), then restarted.
    interrupted = tmp_path / "interrupted"
    fsdp.train(DDPConfig(str(interrupted), JOB, 3, steps=8))
    assert Path(str(fsdp.latest_checkpoint(str(interrupted)))).name == "step-0000000006"
    assert sorted(p.name for p in interrupted.iterdir()) == ["step-0000000003", "step-0000000006"]
    progress = tmp_path / "progress.jsonl"
    resumed = fsdp.full_state(
        fsdp.train(DDPConfig(str(interrupted), JOB, 3, steps=10, progress_file=str(progress)))
    )
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    lines = [json.loads(line) for line in progress.read_text().splitlines()]
    assert lines[0]["start"] == 6 and [r["step"] for r in lines[1:]] == [6, 7, 8, 9]
    fresh = fsdp.full_state(fsdp.train(DDPConfig(str(tmp_path / "fresh"), JOB, 3, steps=4)))
    assert not _close(straight, fresh)  # a run that did not resume differs: the check can fail


def test_a_checkpoint_of_two_workers_resumes_on_one(tmp_path: Path) -> None:
    """Two torchrun workers train 6 steps (checkpoints at 3 and 6, each rank writing its
    shards); one worker resumes at step 6 and ends where one worker alone would have."""
    fsdp = _fsdp()
    checkpoints = tmp_path / "checkpoints"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "OMP_NUM_THREADS": "1",
    }

    def torchrun(workers: int, steps: int, progress: Path, final: Path) -> None:
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={workers}", "-m", "bench.peers_fsdp", "--job", JOB,
            "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3",
            "--steps", str(steps), "--progress", str(progress), "--final", str(final),
        ]  # fmt: skip
        done = subprocess.run(
            argv,
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    torchrun(2, 6, tmp_path / "two.jsonl", tmp_path / "two.pt")
    shards = sorted(p.name for p in (checkpoints / "step-0000000006").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    torchrun(1, 10, tmp_path / "one.jsonl", tmp_path / "one.pt")
    lines = [json.loads(line) for line in (tmp_path / "one.jsonl").read_text().splitlines()]
    assert lines[0] == {**lines[0], "start": 6, "world": 1}
    assert [r["step"] for r in lines[1:]] == [6, 7, 8, 9]

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        alone = fsdp.full_state(fsdp.train(DDPConfig(str(tmp_path / "alone"), JOB, 3, steps=10)))
    finally:
        dist.destroy_process_group()
    resumed = torch.load(tmp_path / "one.pt", weights_only=True)
    assert _close(alone, resumed)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    assert not _close(alone, two)  # 6 steps are not 10: the comparison can fail
