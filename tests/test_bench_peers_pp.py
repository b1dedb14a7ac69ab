"""The pipeline-parallel torchrun peer: ``torch.distributed.pipelining`` stages over real gloo
groups train the same job as one process does, resume from their per-stage DCP checkpoints under
another cut, leave the ranks past ``D * P`` idle without breaking a step, and checkpoint on any
rank's notice."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed as dist
from forked_ranks import fork_ranks

from bench.peers_ddp import build_model, local_batch
from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job

if TYPE_CHECKING:
    # Imported where used: with bench.peers_pp come torch.distributed.pipelining and
    # torch.distributed.checkpoint, about a second of every xdist worker's collection, where
    # one worker runs this file.
    from bench.peers_pp import PPConfig

JOB = "tiny-gpt-small"  # 4 layers (embedding, 2 blocks, head), 4 micro-batches of 2 samples


def _reference(steps: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """A plain single-process run of ``steps`` steps (the DDP peer's computation at a world of
    one): its weights, named as the unsplit model's, and its losses."""
    job = resolve_job(JOB)
    model = build_model(job)
    optimizer = job.optimizer(list(model.parameters()))
    losses = []
    for step in range(steps):
        inputs, targets = local_batch(job, step, 0, 1)
        loss = job.loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return model.state_dict(), losses


def _worker(rank: int, world: int, where: str, config: PPConfig) -> None:
    if config.notice_file is not None:
        # One notice file per instance, as the benchmark's launcher formats one per instance.
        config = dataclasses.replace(config, notice_file=config.notice_file.format(rank=rank))
    from bench import peers_pp

    rendezvous = f"file://{where}/rendezvous"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        module, lay = peers_pp.train(config)
        role = lay.role(rank)
        if role is not None and role[0] == 0:
            torch.save(module.state_dict(), f"{where}/stage-{role[1]}.pt")
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, name: str, world: int, **fields: Any) -> dict[str, torch.Tensor]:
    """``world`` ranks (processes forked from this one, gloo over a file rendezvous) train
    ``PPConfig(**fields)``; pipeline 0's stages' weights, merged."""
    from bench.peers_pp import PPConfig

    where = tmp_path / name
    where.mkdir()
    config = PPConfig(job=JOB, **fields)
    # Forked: the test process has imported torch and the job already (spawned, two ranks took
    # 22 s where the training took 0.3, importing them on the loaded machine). A failed rank
    # raises here with its traceback.
    fork_ranks(_worker, (world, str(where), config), world)
    merged: dict[str, torch.Tensor] = {}
    for part in sorted(where.glob("stage-*.pt")):
        merged.update(torch.load(part, weights_only=True))
    return merged


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.process  # gloo groups in processes of their own
def test_two_stages_train_as_one_process_does(tmp_path: Path) -> None:
    """P = 2 on 2 ranks (1F1B over the 4 micro-batches), 5 steps: the weights and the losses of
    a plain run of the same steps; the checkpoint at step 3 complete, with both stages."""
    reference, losses = _reference(5)
    progress = tmp_path / "progress.jsonl"
    checkpoints = tmp_path / "checkpoints"
    trained = _run(
        tmp_path,
        "two",
        2,
        checkpoint_dir=str(checkpoints),
        cuts={2: (0, 2, 4)},
        checkpoint_every=3,
        steps=5,
        progress_file=str(progress),
    )
    assert _equal(trained, reference)
    lines = _lines(progress)
    assert lines[0] == {**lines[0], "start": 0, "world": 2, "pipelines": 1, "stages": 2}
    assert [r["step"] for r in lines[1:]] == [0, 1, 2, 3, 4]
    assert [r["loss"] for r in lines[1:]] == pytest.approx(losses, abs=1e-5)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-0000000003"]
    assert (checkpoints / "step-0000000003" / ".metadata").is_file()
    fresh, _ = _reference(2)
    assert not _equal(trained, fresh)  # fewer steps differ: the comparison can fail


@pytest.mark.process  # gloo groups in processes of their own
def test_three_pipelines_of_one_stage_split_four_micro_batches(tmp_path: Path) -> None:
    """D = 3 pipelines of one stage: 1, 1 and 2 micro-batches, the gradients summed over the
    pipelines with each micro-batch weighted 1 / M, as one process's mean loss."""
    reference, losses = _reference(3)
    progress = tmp_path / "progress.jsonl"
    trained = _run(
        tmp_path,
        "three",
        3,
        checkpoint_dir=str(tmp_path / "checkpoints"),
        cuts={1: (0, 4)},
        checkpoint_every=10,
        steps=3,
        progress_file=str(progress),
    )
    assert _equal(trained, reference)
    assert [r["loss"] for r in _lines(progress)[1:]] == pytest.approx(losses, abs=1e-5)


@pytest.mark.process  # gloo groups in processes of their own
def test_a_resume_under_another_cut_ends_where_a_straight_run_does(tmp_path: Path) -> None:
    """2 ranks (P = 2) train to step 5 with K = 3 (steps 3 and 4 are lost with them); 3 ranks
    (P = 3: another cut) load step 3's checkpoint, each its own layers, and train to 7: the
    plain run's 7 steps."""
    reference, losses = _reference(7)
    checkpoints = str(tmp_path / "checkpoints")
    _run(
        tmp_path,
        "first",
        2,
        checkpoint_dir=checkpoints,
        cuts={2: (0, 2, 4)},
        checkpoint_every=3,
        steps=5,
    )
    progress = tmp_path / "progress.jsonl"
    resumed = _run(
        tmp_path,
        "second",
        3,
        checkpoint_dir=checkpoints,
        cuts={3: (0, 1, 3, 4)},
        checkpoint_every=3,
        steps=7,
        progress_file=str(progress),
    )
    assert _equal(resumed, reference)
    lines = _lines(progress)
    assert lines[0] == {**lines[0], "start": 3, "world": 3, "stages": 3}
    assert [r["step"] for r in lines[1:]] == [3, 4, 5, 6]
    assert [r["loss"] for r in lines[1:]] == pytest.approx(losses[3:], abs=1e-5)


@pytest.mark.process  # gloo groups in processes of their own
def test_an_idle_rank_waits_and_a_notice_makes_every_pipeline_rank_checkpoint(
    tmp_path: Path,
) -> None:
    """3 ranks, P = 2: D = 1, rank 2 idle; the steps are the plain run's. Rank 1's instance's
    notice file is there from the start: after the first step both stages take part in a
    checkpoint (K = 10 would take none in 3 steps), and only once."""
    reference, _ = _reference(3)
    notices = tmp_path / "notices"
    notices.mkdir()
    (notices / "1").write_text("{}")  # what the emulated cloud writes does not matter here
    checkpoints = tmp_path / "checkpoints"
    trained = _run(
        tmp_path,
        "idle",
        3,
        checkpoint_dir=str(checkpoints),
        cuts={2: (0, 2, 4)},
        checkpoint_every=10,
        steps=3,
        notice_file=str(notices / "{rank}"),
    )
    assert _equal(trained, reference)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-0000000001"]
    assert (checkpoints / "step-0000000001" / ".metadata").is_file()  # both stages in it


def test_the_layout_caps_pipelines_at_the_micro_batches_and_idles_the_rest() -> None:
    from bench.peers_pp import PPConfig, layout

    config = PPConfig("unused", cuts={4: (0, 4, 7, 10, 14), 6: (0, 5, 9, 14)})
    four = layout(config, 5, num_micro_batches=4)  # 5 instances: the cut of 4, one idle
    assert (four.stages, four.pipelines, four.active) == (4, 1, 4)
    assert [four.role(r) for r in range(5)] == [(0, 0), (0, 1), (0, 2), (0, 3), None]
    assert list(four.layers(1)) == [4, 5, 6]
    seven = layout(config, 7, num_micro_batches=4)
    assert (seven.stages, seven.pipelines) == (3, 2) and seven.role(4) == (1, 1)
    assert seven.role(6) is None
    # More pipelines than micro-batches: capped at the micro-batches, the others idle.
    wide = layout(PPConfig("unused", cuts={1: (0, 4)}), 6, num_micro_batches=4)
    assert (wide.pipelines, wide.active) == (4, 4)
    with pytest.raises(LiveputError, match="no stage cut for 3"):
        layout(config, 3, num_micro_batches=4)


def test_cuts_come_from_a_plan_file_or_one_boundary_list(tmp_path: Path) -> None:
    from bench.peers_pp import PlannedCuts, parse_cuts, write_plan

    plan = tmp_path / "plan.json"
    write_plan(plan, PlannedCuts({4: (0, 4, 7, 10, 14), 8: (0, 4, 7, 10, 14)}, {4: (1, 4)}))
    assert parse_cuts(str(plan), None) == {4: (0, 4, 7, 10, 14), 8: (0, 4, 7, 10, 14)}
    assert parse_cuts(None, "0,2,4") == {2: (0, 2, 4)}
    for bad in [(None, None), (str(plan), "0,4"), (None, "0,two"), (str(tmp_path / "no"), None)]:
        with pytest.raises(LiveputError):
            parse_cuts(*bad)


@pytest.mark.parametrize(
    "cuts", [{}, {2: (1, 2, 4)}, {2: (0, 2, 2, 4)}, {2: (0, 1, 2, 4)}, {0: (0, 4)}]
)
def test_a_cut_that_is_not_one_is_refused(cuts: dict) -> None:
    from bench.peers_pp import PPConfig

    with pytest.raises(LiveputError):
        PPConfig("unused", cuts=cuts)
