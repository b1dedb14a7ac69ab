"""A job built without its weights: each layer materialized alone equals the whole model's.

An agent builds the job on the ``meta`` device and initializes only the layers it holds
(``liveput.models.lazy``); every agent must start from the weights of the whole model's seeded
build, for every built-in job and the README's own model.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
import torch
from torch import nn

import liveput
from liveput.errors import LiveputError
from liveput.models.jobs import JOBS, resolve_empty_job, resolve_job
from liveput.models.lazy import is_empty
from liveput.runtime.layer_state import fresh_layer

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _assert_layers_equal(eager: liveput.Job, lazy: liveput.Job, order: list[int]) -> None:
    for index in order:
        alone = lazy.own_layer(index, CPU).state_dict()
        whole = eager.layers[index].state_dict()
        assert alone.keys() == whole.keys()
        for key, value in whole.items():
            assert torch.equal(alone[key], value), f"layer {index} {key}"


@pytest.mark.parametrize("name", sorted(JOBS.names()))
def test_every_built_in_jobs_layer_built_alone_equals_the_whole_models(name: str) -> None:
    eager = resolve_job(name)
    lazy = resolve_empty_job(name)
    assert all(
        is_empty(layer) for layer in lazy.layers if next(layer.parameters(), None) is not None
    )
    assert sum(p.numel() for layer in eager.layers for p in layer.parameters()) == sum(
        p.numel() for layer in lazy.layers for p in layer.parameters()
    )
    # Last first: nothing a layer's initialization draws depends on the layers built before it.
    _assert_layers_equal(eager, lazy, list(reversed(range(eager.num_layers))))


def _readme_module(folder: Path) -> dict:
    section = (ROOT / "README.md").read_text().split("### Your own model", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert found is not None
    path = folder / "mymodel.py"
    path.write_text(found.group(1))
    return runpy.run_path(str(path))


def test_the_readmes_own_model_built_alone_equals_its_whole_build(tmp_path, monkeypatch) -> None:
    module = _readme_module(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    eager = module["target"]()
    assert eager.init_layer is not None and not any(is_empty(layer) for layer in eager.layers)
    lazy = resolve_empty_job("mymodel:target")
    assert is_empty(lazy.layers[0])
    _assert_layers_equal(eager, lazy, [4, 2, 0])
    # Seeded per layer: the two linear layers of one shape start apart.
    assert not torch.equal(eager.layers[2].weight[:, :8], eager.layers[0].weight.T[:8, :8])


def _tied_gpt2_job(seed: int = 5) -> liveput.Job:
    transformers = pytest.importorskip("transformers")
    from liveput.models.hf import hf_causal_lm

    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=True
    )
    layers, init_layer = hf_causal_lm(config, seed)
    return liveput.Job(
        layers=layers,
        init_layer=init_layer,
        dataset=torch.utils.data.TensorDataset(torch.zeros(8, 16, dtype=torch.long)),
        loss_fn=nn.functional.mse_loss,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        global_batch_size=4,
        micro_batch_size=2,
    )


def test_a_tied_heads_matrix_built_alone_is_the_embeddings_initial_one() -> None:
    from liveput.models.lazy import empty_job

    eager = _tied_gpt2_job()
    with empty_job():
        lazy = _tied_gpt2_job()
    assert lazy.tied_weights == eager.tied_weights == (("0.token.weight", "3.projection.weight"),)
    head = lazy.own_layer(3, CPU)
    assert torch.equal(head.projection.weight, eager.layers[0].token.weight)
    _assert_layers_equal(eager, lazy, [3, 0, 1, 2])


def _job(layers: list[nn.Module], **extra: object) -> liveput.Job:
    return liveput.Job(
        layers=layers,
        dataset=torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, 4)),
        loss_fn=nn.functional.mse_loss,
        optimizer=lambda parameters: torch.optim.SGD(parameters, lr=0.1),
        global_batch_size=4,
        micro_batch_size=2,
        **extra,  # type: ignore[arg-type]
    )


def test_layers_built_without_weights_and_no_init_layer_are_refused_in_one_line() -> None:
    with liveput.empty_parameters():
        layers: list[nn.Module] = [nn.Linear(4, 4), nn.Linear(4, 4)]
    with pytest.raises(LiveputError, match="layer 0 was built without weights"):
        _job(layers)


def test_an_init_layer_that_leaves_a_parameter_out_is_refused_naming_it() -> None:
    def weights_only(index: int, layer: nn.Module) -> None:
        nn.init.ones_(layer.weight)

    with liveput.empty_parameters():
        layers: list[nn.Module] = [nn.Linear(4, 4), nn.Linear(4, 4)]
    with pytest.raises(LiveputError, match=r"left parameter 0\.bias uninitialized"):
        _job(layers, init_layer=weights_only)


def test_seeded_initialization_leaves_the_callers_random_state_as_it_was() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with liveput.empty_parameters():
        layers: list[nn.Module] = [nn.Linear(4, 4), nn.Linear(4, 4)]
    job = _job(layers, init_layer=liveput.seeded_init(7))
    assert torch.equal(torch.rand(3), expected)
    assert not torch.equal(job.layers[0].weight, job.layers[1].weight)


def test_a_job_without_init_layer_is_built_whole_for_an_agent(tmp_path, monkeypatch) -> None:
    (tmp_path / "plainmodel.py").write_text(
        "import torch\nfrom torch import nn\nimport liveput\n"
        "def target():\n"
        "    torch.manual_seed(0)\n"
        "    return liveput.Job(layers=[nn.Linear(4, 4)],\n"
        "        dataset=torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, 4)),\n"
        "        loss_fn=nn.functional.mse_loss,\n"
        "        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),\n"
        "        global_batch_size=4, micro_batch_size=2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    job = resolve_empty_job("plainmodel:target")
    assert not is_empty(job.layers[0])
    torch.manual_seed(0)
    assert torch.equal(job.layers[0].weight, nn.Linear(4, 4).weight)


def test_a_layer_whose_state_is_loaded_next_is_not_initialized(monkeypatch) -> None:
    lazy = resolve_empty_job("tiny-gpt-small")
    calls: list[int] = []
    initialize = lazy.init_layer
    assert initialize is not None
    monkeypatch.setattr(
        lazy, "init_layer", lambda k, layer: (calls.append(k), initialize(k, layer))
    )
    fresh_layer(lazy, 1, CPU, initialize=False)
    assert calls == []
    fresh_layer(lazy, 1, CPU)
    assert calls == [1]
