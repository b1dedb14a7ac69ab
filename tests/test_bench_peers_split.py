"""The peers' step split by samples: any number of ranks up to the batch trains the global
batch exactly once, more ranks than micro-batches included (gpt2-small's 4 micro-batches on 8
instances crashed every peer), and ranks beyond the batch are spares that add nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from forked_ranks import fork_ranks

from bench import peers_ddp
from bench.peers_ddp import DDPConfig, local_batch, loss_weight, sample_share
from liveput.models.jobs import resolve_job
from liveput.testbed import free_port

JOB = "tiny-gpt-small"  # a global batch of 8 in 4 micro-batches of 2, as gpt2-small's


@pytest.mark.parametrize("world", range(1, 11))
def test_the_ranks_shares_are_the_global_batch_once(world: int) -> None:
    job = resolve_job(JOB)
    whole = torch.cat([job.micro_batch(3, m)[0] for m in range(job.num_micro_batches)])
    shares = [sample_share(job.global_batch_size, rank, world) for rank in range(world)]
    assert [i for share in shares for i in share] == list(range(job.global_batch_size))
    trained = [local_batch(job, 3, rank, world)[0] for rank in range(world) if shares[rank]]
    assert torch.equal(torch.cat(trained), whole)
    # DDP averages the ranks' gradients: the weights make that average the batch's mean.
    weights = [loss_weight(job, rank, world) for rank in range(world)]
    assert sum(weights) / world == pytest.approx(1.0)
    spares = [rank for rank in range(world) if not shares[rank]]
    assert spares == list(range(job.global_batch_size, world))
    assert all(weights[r] == 0 and len(local_batch(job, 3, r, world)[0]) == 1 for r in spares)


def _rank(rank: int, world: int, rendezvous: str, directory: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        model = peers_ddp.train(DDPConfig(directory, JOB, checkpoint_every=2, steps=3))
        if rank == 0:
            torch.save(model.state_dict(), out)
    finally:
        dist.destroy_process_group()


def _trained(world: int, tmp_path: Path) -> dict[str, torch.Tensor]:
    out = tmp_path / f"world-{world}.pt"
    rendezvous = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    # Forked from this process (torch imported once): nine gloo ranks cost a fork each.
    fork_ranks(_rank, (world, rendezvous, str(tmp_path / f"ck-{world}"), str(out)), world)
    return torch.load(out, weights_only=True)


def test_the_ddp_peer_on_more_ranks_than_micro_batches_trains_as_one_rank(
    tmp_path: Path, process_tier: None
) -> None:
    """9 ranks (more than the 4 micro-batches, and a spare beyond the batch of 8) end where one
    rank does."""
    alone = _trained(1, tmp_path)
    many = _trained(9, tmp_path)
    assert all(torch.allclose(alone[k], many[k], rtol=1e-4, atol=1e-6) for k in alone)
    untrained = peers_ddp.build_model(resolve_job(JOB)).state_dict()
    assert not all(torch.equal(alone[k], untrained[k]) for k in alone)  # it did train
