"""The model families train through preemptions as one uninterrupted run would: exactly once, and
final parameters allclose to a fault-free single-process run (as tests/test_runtime_engine.py
checks for tiny-gpt).

Models are reduced so that a step takes milliseconds on CPU: Llama and GPT-2 with 2 blocks, 32
wide, 16-token contexts, byte tokens from 50 kB of the standard library's sources; ResNet-50 (all
16 bottlenecks, 18 layers) at width 4 (ResNet-50's is 64) on 32x32 synthetic images of 10
classes, in micro-batches of 4 (BatchNorm over 2 samples is ill-conditioned); an
``nn.Sequential`` MLP. GPT-2 keeps its head tied to its token embedding (its default), so its
two copies must stay equal. SGD with momentum, as the engine test uses (bit-stable across
configurations).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from liveput.models.job import Job
from liveput.models.jobs import (
    CausalLMJobConfig,
    ResNetJobConfig,
    causal_lm_job,
    gpt2_config,
    llama_config,
    resnet50_job,
)
from liveput.models.sequential import from_sequential
from liveput.models.ties import members
from liveput.perf.configuration import Configuration
from liveput.runtime.engine import Ending, EngineConfig
from liveput.runtime.inprocess import ThreadCluster
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import profile_job
from liveput.testbed.reference import parameter_mismatches, reference_parameters

TEXT = CausalLMJobConfig(
    seq_len=16,
    global_batch_size=8,
    micro_batch_size=2,
    learning_rate=0.05,
    sgd=True,
    corpus_bytes=50_000,
)


def llama_job() -> Job:
    return causal_lm_job(
        "llama-test", llama_config(layers=2, width=32, heads=4, kv_heads=2, intermediate=64), TEXT
    )


def gpt2_job() -> Job:
    """GPT-2 as it is by default: its head tied to its token embedding."""
    config = gpt2_config(layers=2, width=32, heads=4, positions=16, tied=True)
    return causal_lm_job("gpt2-test", config, TEXT)


def resnet_job() -> Job:
    return resnet50_job(
        ResNetJobConfig(
            width=4,
            image_size=32,
            num_classes=10,
            num_samples=256,
            global_batch_size=8,
            micro_batch_size=4,
            learning_rate=0.01,
        )
    )


class Blobs(torch.utils.data.Dataset):
    """Seeded points of 4 Gaussian blobs in 8 dimensions."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        label = index % 4
        return torch.randn(8, generator=generator) + 2.0 * label, torch.tensor(label)


def sequential_job() -> Job:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)
    )
    return Job(
        from_sequential(model),
        Blobs(),
        F.cross_entropy,
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        global_batch_size=8,
        micro_batch_size=2,
        name="mlp",
    )


def parameters_only(job: Job, states: list[dict[str, torch.Tensor]]) -> list[dict]:
    """Each layer's parameters, without buffers: BatchNorm's running statistics are each data-
    parallel replica's own (no gradient is reduced for them), so they are no part of the
    same-computation promise."""
    names = [{name for name, _ in layer.named_parameters()} for layer in job.layers]
    return [{k: v for k, v in state.items() if k in keep} for state, keep in zip(states, names)]


def run_through_preemptions(job: Job, tmp_path, steps: int = 8) -> ThreadCluster:
    """(2, 2) on four instances; one preempted (intra-stage migration onto (1, 2), no rollback);
    all but the first stage's instance preempted: the last stage's layers are lost, so (1, 1)
    restores the checkpoint after step 3 and steps 4-5 are redone."""
    cluster = ThreadCluster(
        job,
        profile_job(job, repeats=1),
        str(tmp_path / "ckpt"),
        steps,
        EngineConfig(checkpoint_every=4, comm_timeout_s=30),
    )
    for target, preempted, allocated, until in (
        (Configuration(2, 2), set(), [0, 1, 2, 3], 3),
        (Configuration(1, 2), {3}, [], 6),
        (Configuration(1, 1), "all but stage 0", [], steps),
    ):
        if preempted == "all but stage 0":
            preempted = set(cluster.plan.world) - {cluster.plan.instance_at(0, 0)}
        results = cluster.migrate(target, preempted, allocated, until)
        working = [r for i, r in results.items() if cluster.plan.slots[i] is not None]
        expected = Ending.FINISHED if until >= steps else Ending.FENCED
        assert {r.ending for r in working} == {expected}
    assert cluster.kinds == ["start", "intra-stage", "checkpoint-restore"]
    return cluster


@pytest.mark.parametrize(
    "make_job",
    [llama_job, gpt2_job, resnet_job, sequential_job],
    ids=["llama", "gpt2", "resnet50", "sequential"],
)
def test_a_model_family_trains_through_preemptions_as_one_uninterrupted_run(make_job, tmp_path):
    steps = 8
    job = make_job()
    cluster = run_through_preemptions(job, tmp_path, steps)
    report = verify_ledger(cluster.store, job.global_batch_size, steps)
    assert report.exactly_once, report.problems
    assert report.steps_rolled_back == 2 and report.restores == 1
    got = [
        cluster.checkpointer.load_layer_file(f"final/layer-{i}.pt")["module"]
        for i in range(job.num_layers)
    ]
    want = reference_parameters(make_job(), steps)
    assert not parameter_mismatches(parameters_only(job, got), parameters_only(job, want))
    for earlier, later in (members(tie) for tie in job.tied_weights):
        # Tied weights stay one matrix through the migrations and the restore, to the bit.
        assert torch.equal(got[earlier[0]][earlier[1]], got[later[0]][later[1]])
    initial = [layer.state_dict() for layer in make_job().layers]
    assert parameter_mismatches(parameters_only(job, got), parameters_only(job, initial)), (
        "training moved no parameter"
    )
    losses = [r["loss"] for r in report.records]
    assert all(loss == loss and loss < float("inf") for loss in losses)


def test_liveput_train_gives_the_users_file_to_the_agent_processes(tmp_path):
    """`liveput train --model llama-tiny --data FILE`: the agent processes train on the file (the
    first step's loss is the initial model's loss on the file's first samples), exactly once.
    (Preemptions are the in-process tests' part above: agents importing transformers are slow
    to start on a shared 2-core machine, so this run is short.)"""
    import json

    from liveput.cli.main import main
    from liveput.models.jobs import resolve_job

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "".join(f"line {i}: the quick brown fox jumps over {i % 7} lazy dogs\n" for i in range(400))
    )
    out = tmp_path / "run.json"
    assert (
        main(
            [
                "train",
                "--model",
                "llama-tiny",
                "--data",
                str(corpus),
                "--workers",
                "2",
                "--steps",
                "4",
                "--time-scale",
                "10",
                "--seed",
                "1",
                "--checkpoint-every",
                "2",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.read_text())
    assert summary["exactly_once"] is True and summary["steps_completed"] == 4
    job = resolve_job("llama-tiny", str(corpus))
    with torch.no_grad():
        losses = []
        for j in range(job.num_micro_batches):
            inputs, targets = job.micro_batch(0, j)
            for layer in job.layers:
                inputs = layer(inputs)
            losses.append(float(job.loss_fn(inputs, targets)))
    first = json.loads(out.with_suffix(".jsonl").read_text().splitlines()[0])
    assert first["step"] == 0
    assert first["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-4)
