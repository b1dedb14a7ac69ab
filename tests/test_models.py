"""Model adapters (transformers causal LMs, nn.Sequential, ResNet-50), the text dataset and the
built-in jobs of real models: what they compute, what they read, how they refuse bad input.

Models here are small (2 blocks, 32-64 wide) so each test takes a second or less; the built-in
sizes are checked by parameter count only.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.models.extras import require
from liveput.models.hf import from_hf_causal_lm, hf_causal_lm_layers
from liveput.models.jobs import resolve_job
from liveput.models.resnet import ResNet, SyntheticImages, build_resnet50, resnet_layers
from liveput.models.sequential import from_sequential
from liveput.models.text import TextDataset, Tokenizer


def small_config(family: str, **extra):
    import transformers

    if family == "gpt2":
        return transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=256,
            n_positions=32,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            **extra,
        )
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **extra,
    )


def run_layers(layers: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer(x)
    return x


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_layers_compute_what_the_whole_transformers_model_computes(family, attention):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        small_config(family, tie_word_embeddings=False), attn_implementation=attention
    )
    layers = hf_causal_lm_layers(copy.deepcopy(model))
    assert len(layers) == 4  # embedding, 2 blocks, head
    tokens = torch.randint(0, 256, (3, 19))
    logits = run_layers(layers, tokens)
    assert torch.allclose(logits, model(input_ids=tokens).logits, atol=1e-5)
    # Each block builds the causal mask (and Llama's rotary embeddings) from the hidden states'
    # shape: a later token moves no earlier logit, and moves its own.
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 256
    moved = (run_layers(layers, changed) - logits).abs().amax(dim=(0, 2))
    assert moved[:12].max() == 0 and moved[12] > 0


def test_from_hf_causal_lm_is_seeded_keeps_ties_and_refuses_what_it_cannot_cut():
    import transformers

    first, again, other = (from_hf_causal_lm(small_config("gpt2"), seed=s) for s in (1, 1, 2))
    state = [layer.state_dict() for layer in first]
    assert all(
        torch.equal(state[i][k], again[i].state_dict()[k])
        for i in range(len(state))
        for k in state[i]
    )
    assert not torch.equal(
        first[1].state_dict()["block.attn.c_attn.weight"],
        other[1].state_dict()["block.attn.c_attn.weight"],
    )
    # GPT-2 ties its head to its embedding by default: the two layers share the one matrix
    # (a job built from them trains it as one); untied, the head has its own.
    assert first[-1].projection.weight is first[0].token.weight
    untied = from_hf_causal_lm(small_config("gpt2", tie_word_embeddings=False))
    assert untied[-1].projection.weight is not untied[0].token.weight
    # 2 blocks of 49,984, token and position embeddings, final norm, and the head's matrix.
    assert (
        sum(p.numel() for layer in untied for p in layer.parameters())
        == 2 * 49_984 + 256 * 64 + 32 * 64 + 128 + 256 * 64
    )
    tied = transformers.AutoModelForCausalLM.from_config(small_config("gpt2"))
    layers = hf_causal_lm_layers(tied)
    assert layers[-1].projection.weight is tied.transformer.wte.weight
    with pytest.raises(LiveputError, match="family 'bert' is not supported; known: gpt2, llama"):
        from_hf_causal_lm(transformers.BertConfig())
    with pytest.raises(LiveputError, match="expected a transformers config, got dict"):
        from_hf_causal_lm({"model_type": "llama"})


def test_from_sequential_gives_its_children_and_refuses_anything_else():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    layers = from_sequential(model)
    assert [id(layer) for layer in layers] == [id(child) for child in model]
    x = torch.randn(5, 4)
    assert torch.equal(run_layers(layers, x), model(x))
    with pytest.raises(LiveputError, match="expected a torch.nn.Sequential, got list"):
        from_sequential([nn.Linear(1, 1)])
    with pytest.raises(LiveputError, match="has no layers"):
        from_sequential(nn.Sequential())


def test_resnet50_has_torchvisions_shape_and_its_layers_compute_the_whole_network():
    layers = build_resnet50()
    # torchvision.models.resnet50(): 25,557,032 parameters.
    assert len(layers) == 18
    assert sum(p.numel() for layer in layers for p in layer.parameters()) == 25_557_032
    torch.manual_seed(0)
    model = ResNet(width=8, num_classes=10).eval()
    keys = set(model.state_dict())
    assert {"layer1.0.downsample.1.running_var", "layer4.2.bn3.weight", "fc.bias"} <= keys
    images = torch.randn(2, 3, 64, 64)
    assert torch.allclose(run_layers(resnet_layers(model), images), model(images), atol=1e-5)
    with pytest.raises(LiveputError, match="is not a ResNet"):
        resnet_layers(nn.Linear(2, 2))


def test_synthetic_images_are_seeded_and_their_classes_differ():
    images = SyntheticImages(num_samples=64, image_size=16, num_classes=3, seed=4)
    image, label = images[5]
    again, label_again = SyntheticImages(64, 16, 3, seed=4)[5]
    assert torch.equal(image, again) and label == label_again and 0 <= int(label) < 3
    assert not torch.equal(image, SyntheticImages(64, 16, 3, seed=5)[5][0])
    # The class pattern is what a model can learn: images of a class share it.
    by_class: dict[int, list[torch.Tensor]] = {}
    for i in range(60):
        x, y = images[i]
        by_class.setdefault(int(y), []).append(x)
    means = [torch.stack(xs).mean(0) for xs in by_class.values()]
    assert min((a - b).abs().mean() for i, a in enumerate(means) for b in means[i + 1 :]) > 0.3


def test_a_text_file_is_read_as_bytes(tmp_path):
    path = tmp_path / "corpus.txt"
    text = "héllo, liveput! " * 20
    path.write_text(text, encoding="utf-8")
    data = TextDataset(path, seq_len=8)
    stream = np.frombuffer(text.encode(), dtype=np.uint8)
    assert data.vocab_size == 256 and len(data) == len(stream) - 9
    inputs, targets = data[3]
    start = (3 * 2_654_435_761) % len(data)  # sample i's window, as ByteWindows places it
    assert inputs.tolist() == stream[start : start + 8].tolist()
    assert targets.tolist() == stream[start + 1 : start + 9].tolist()
    with pytest.raises(LiveputError, match="fewer than one sample of 1001"):
        TextDataset(path, seq_len=1000)
    with pytest.raises(LiveputError, match="no such file"):
        TextDataset(tmp_path / "missing.txt")


@pytest.mark.parametrize("form", ["parquet", "arrow-file", "arrow-stream"])
def test_a_column_of_an_arrow_or_parquet_table_is_read(tmp_path, form):
    rows = ["first document", None, "second one", ""]
    table = pa.table({"id": [1, 2, 3, 4], "text": rows})
    path = tmp_path / ("data.parquet" if form == "parquet" else "data.arrow")
    if form == "parquet":
        pq.write_table(table, path)
    else:
        writer = (pa.ipc.new_file if form == "arrow-file" else pa.ipc.new_stream)(
            str(path), table.schema
        )
        writer.write_table(table)
        writer.close()
    data = TextDataset(path, seq_len=4)
    assert bytes(data.corpus.numpy().astype(np.uint8)) == b"first document\nsecond one"
    with pytest.raises(LiveputError, match=r"no column 'body' \(columns: id, text\)"):
        TextDataset(path, column="body")
    with pytest.raises(LiveputError, match="column 'id' is not text"):
        TextDataset(path, column="id")


def test_a_tokenizer_json_given_as_a_path_tokenizes(tmp_path):
    tokenizers = require("tokenizers", "this test")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    text = "the cat sat on the mat and the dog sat on the log " * 30
    tokenizer.train_from_iterator(
        [text], tokenizers.trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"])
    )
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    data = TextDataset(corpus, tokenizer=tokenizer_path, seq_len=6)
    assert data.vocab_size == tokenizer.get_vocab_size()
    assert data.corpus.tolist() == tokenizer.encode(text, add_special_tokens=False).ids
    assert data.vocab_size < 256 and len(data.corpus) < len(text) / 2
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{}")
    with pytest.raises(LiveputError, match="not a tokenizer.json"):
        Tokenizer(garbage)
    with pytest.raises(LiveputError, match="give 'byte' or a tokenizer.json"):
        Tokenizer(tmp_path / "none.json")


def test_a_missing_optional_package_names_the_extra_to_install():
    with pytest.raises(LiveputError) as caught:
        require("liveput_no_such_package.sub", "the llama-tiny job")
    assert str(caught.value) == (
        "the llama-tiny job needs the Python package "
        "'liveput_no_such_package': pip install 'liveput[models]'"
    )


def test_builtin_jobs_have_their_sizes_and_the_text_jobs_take_data(tmp_path):
    sizes = {"llama-tiny": (6, 3_033_344), "resnet50": (18, 25_557_032)}
    for name, (num_layers, num_params) in sizes.items():
        job = resolve_job(name)
        assert (
            job.num_layers,
            sum(p.numel() for layer in job.layers for p in layer.parameters()),
        ) == (num_layers, num_params)
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(256)) * 4)
    job = resolve_job("llama-tiny", str(corpus))
    assert isinstance(job.dataset, TextDataset) and job.dataset.path == str(corpus)
    inputs, _ = job.micro_batch(0, 0)
    assert inputs.shape == (4, 128)
    with pytest.raises(
        LiveputError,
        match="job 'resnet50' takes no --data; the built-in jobs that do: gpt2-small, llama-tiny",
    ):
        resolve_job("resnet50", str(corpus))


def test_liveput_profile_and_perf_measure_a_builtin_job(tmp_path, capsys):
    out = tmp_path / "llama.json"
    assert main(["profile", "--model", "llama-tiny", "--repeats", "1", "-o", str(out)]) == 0
    profile = json.loads(out.read_text())
    assert profile["model"] == "llama-tiny" and len(profile["layers"]) == 6
    assert profile["micro_batch_size"] == 4  # the job's, not the command's default of 8
    assert sum(layer["num_params"] for layer in profile["layers"]) == 3_033_344
    capsys.readouterr()
    assert main(["perf", str(out), "--nodes", "4", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["model"] == "llama-tiny" and table["best"]["1"] == [1, 1]
    # A job by name is profiled here first (tiny-gpt-small: the same path, at less cost).
    assert main(["perf", "tiny-gpt-small", "--nodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "tiny-gpt"


def test_train_refuses_data_for_a_job_without_it_in_one_line(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text " * 100)
    assert main(["train", "--model", "resnet50", "--data", str(corpus)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: job 'resnet50' takes no --data; the built-in jobs that do: gpt2-small, llama-tiny"
    )
    assert main(["train", "--model", "llama-tiny", "--data", str(tmp_path / "none.txt")]) == 2
    assert "no such file" in capsys.readouterr().err
