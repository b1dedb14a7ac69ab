"""Tied weights: the Job contract that names them (or finds them shared), and training that keeps
the two copies one matrix, in one stage or two, as the tied model itself trains; a tied
transformers job comes back tied, with the trained layers' logits."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_support import tied_gpt2_config
from torch import nn
from torch.nn import functional as F

from liveput.errors import LiveputError
from liveput.models.hf import from_hf_causal_lm, to_hf_causal_lm
from liveput.models.job import Job
from liveput.models.tiny_gpt import language_model_loss
from liveput.models.training import TrainingConfig
from liveput.perf.configuration import Configuration
from liveput.runtime.engine import EngineConfig
from liveput.runtime.inprocess import ThreadCluster
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import profile_job
from liveput.testbed.reference import final_parameters

STEPS = 4
SEED = 3
CLIP = 0.5
"""Small enough that every step clips: the norm must count the tied matrix once, as the tied
model's ``clip_grad_norm_`` does."""


def _adamw(parameters) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-2, weight_decay=0.1)


def tied_gpt2_job() -> Job:
    tokens = torch.randint(0, 64, (64, 9), generator=torch.Generator().manual_seed(0))
    return Job(
        layers=from_hf_causal_lm(tied_gpt2_config(), seed=SEED),
        dataset=torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]),
        loss_fn=language_model_loss,
        optimizer=_adamw,
        global_batch_size=8,
        micro_batch_size=2,
        training=TrainingConfig(clip_grad_norm=CLIP),
        name="tied-gpt2",
    )


def _tied_transformers_run(job: Job) -> tuple[nn.Module, list[float]]:
    """The original tied model (the job's initial weights, in ``transformers``' own model)
    trained on the same batches with the same optimizer and clipping, in one process; its
    losses."""
    initial = nn.Sequential(*copy.deepcopy(job.layers)).state_dict()
    model = to_hf_causal_lm(job.layers, initial).train()
    assert model.lm_head.weight is model.transformer.wte.weight
    optimizer = _adamw(model.parameters())
    losses = []
    for step in range(STEPS):
        batches = [job.micro_batch(step, j) for j in range(job.num_micro_batches)]
        inputs, targets = (torch.cat([batch[i] for batch in batches]) for i in (0, 1))
        loss = language_model_loss(model(input_ids=inputs).logits, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return model.eval(), losses


@pytest.mark.process  # gloo groups in threads
@pytest.mark.parametrize(
    "configuration", [Configuration(1, 1), Configuration(1, 2), Configuration(2, 2)], ids=str
)
def test_tied_embeddings_train_as_the_tied_transformers_model(configuration, tmp_path):
    job = tied_gpt2_job()
    assert job.tied_weights == (("0.token.weight", "3.projection.weight"),)
    cluster = ThreadCluster(
        job,
        profile_job(job, repeats=1),
        str(tmp_path / "ckpt"),
        STEPS,
        EngineConfig(checkpoint_every=0, comm_timeout_s=30),
    )
    cluster.migrate(configuration, set(), list(range(configuration.num_instances)), STEPS)
    if configuration.pipeline_stages == 2:  # the embedding and the head in two stages
        assert 0 in cluster.plan.layers_of(0) and 3 in cluster.plan.layers_of(1)
    final = final_parameters(tmp_path / "ckpt", job.num_layers)
    # The engine's two copies: one matrix, to the bit.
    assert torch.equal(final[0]["token.weight"], final[3]["projection.weight"])
    assert not torch.equal(final[0]["token.weight"], job.layers[0].token.weight)

    model, losses = _tied_transformers_run(job)
    report = verify_ledger(cluster.store, job.global_batch_size, STEPS)
    assert [r["loss"] for r in report.records] == pytest.approx(losses, rel=1e-5)
    state = {f"{i}.{k}": v for i, layer in enumerate(final) for k, v in layer.items()}
    exported = to_hf_causal_lm(job.layers, state)
    assert exported.config.tie_word_embeddings is True
    assert exported.lm_head.weight is exported.transformer.wte.weight
    want = model.state_dict()
    for name, value in exported.state_dict().items():
        # AdamW turns the rounding noise of a gradient that is zero in exact arithmetic (the
        # attention's key bias: softmax ignores it) into steps of up to 1e-5 or so.
        torch.testing.assert_close(value, want[name], rtol=1e-4, atol=1e-4, msg=name)
    # The tied matrix itself, the subject here, to float tolerance.
    torch.testing.assert_close(exported.lm_head.weight, model.lm_head.weight, rtol=1e-4, atol=1e-6)

    # The export computes the trained layers' logits.
    trained = nn.Sequential(*(copy.deepcopy(layer) for layer in job.layers)).eval()
    for layer, layer_state in zip(trained, final):
        layer.load_state_dict(layer_state)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=tokens).logits, trained(tokens))


class _Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(index % 16), torch.tensor((index * 5) % 16)


def _own_layers(share: bool) -> list[nn.Module]:
    torch.manual_seed(0)
    embedding, body, head = nn.Embedding(16, 8), nn.Linear(8, 8), nn.Linear(8, 16, bias=False)
    if share:
        head.weight = embedding.weight
    return [embedding, body, head]


def _own_job(layers: list[nn.Module], **ties) -> Job:
    return Job(
        layers=layers,
        dataset=_Points(),
        loss_fn=F.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
        global_batch_size=8,
        micro_batch_size=2,
        **ties,
    )


@pytest.mark.process  # gloo groups in threads
def test_a_users_model_is_tied_by_naming_the_pair_or_by_sharing_the_parameter(tmp_path):
    named = _own_layers(share=False)
    assert not torch.equal(named[0].weight, named[2].weight)
    job = _own_job(named, tied_weights=[("2.weight", "0.weight")])
    # Normalized to the earlier layer first; the later copy starts as the earlier one.
    assert job.tied_weights == (("0.weight", "2.weight"),)
    assert torch.equal(named[0].weight, named[2].weight)
    shared = _own_job(_own_layers(share=True))
    assert shared.tied_weights == (("0.weight", "2.weight"),)
    assert _own_job(_own_layers(share=False)).tied_weights == ()

    # Trained in two stages (the embedding in one, the head in the other), the job ends where
    # the plain tied model ends.
    cluster = ThreadCluster(
        shared, profile_job(shared, repeats=1), str(tmp_path / "ckpt"), STEPS, EngineConfig()
    )
    cluster.migrate(Configuration(1, 2), set(), [0, 1], STEPS)
    assert 0 in cluster.plan.layers_of(0) and 2 in cluster.plan.layers_of(1)
    final = final_parameters(tmp_path / "ckpt", shared.num_layers)
    assert torch.equal(final[0]["weight"], final[2]["weight"])
    model = nn.Sequential(*_own_layers(share=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    for step in range(STEPS):
        batches = [shared.micro_batch(step, j) for j in range(shared.num_micro_batches)]
        inputs, targets = (torch.cat([batch[i] for batch in batches]) for i in (0, 1))
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.testing.assert_close(final[0]["weight"], model[0].weight.detach())
    torch.testing.assert_close(final[1]["weight"], model[1].weight.detach())


@pytest.mark.parametrize(
    ("ties", "message"),
    [
        ([("0.weight", "5.weight")], "the model has no parameter 5.weight"),
        ([("weight", "2.weight")], "'weight' is not a parameter name"),
        ([("1.weight", "1.bias")], "1.bias and 1.weight are of one layer"),
        ([("0.weight", "1.weight")], r"0.weight \(16, 8\) .* cannot be one matrix"),
        ([("0.weight", "2.weight"), ("2.weight", "1.weight")], "2.weight is in two ties"),
        (["0.weight"], "expected pairs of parameter names"),
    ],
)
def test_ties_that_cannot_be_one_matrix_are_refused_when_the_job_is_built(ties, message):
    with pytest.raises(LiveputError, match=message):
        _own_job(_own_layers(share=False), tied_weights=ties)
