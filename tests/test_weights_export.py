"""The trained weights out: the public checkpoint reader, `liveput export` to a state dict and to
torch.distributed.checkpoint's layout, refusals of bad checkpoints, and transformers jobs back as
`save_pretrained` folders (equal logits, embeddings tied again)."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
from hf_support import tied_gpt2_config
from torch import nn

import liveput.checkpoint
from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.models.hf import from_hf_causal_lm
from liveput.models.job import Job
from liveput.models.jobs import resolve_job
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.layer_state import fresh_layer
from liveput.runtime.model_files import write_model
from liveput.runtime.store import MemoryStore

TOKEN = "job-token"


def _trained_layers(job: Job, seed: int):
    """The job's layers, each with its own optimizer, moved off their initial weights (as
    training would)."""
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in layers:
            for parameter in layer.module.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.01)
    return layers


def _write_checkpoint(directory, job: Job, step: int, seed: int, layers=None, token=TOKEN):
    """A checkpoint of ``step`` as the agents write it (signed layer files); its layers."""
    layers = layers if layers is not None else _trained_layers(job, seed)
    checkpointer = Checkpointer(MemoryStore(), str(directory), keep=10, token=token.encode())
    checkpointer.save_async(0, step, layers, job.num_layers)
    checkpointer.close()
    return layers


def _unsplit(layers) -> nn.Sequential:
    return nn.Sequential(*(layer.module for layer in layers)).eval()


@pytest.fixture(scope="module")
def tiny():
    return resolve_job("tiny-gpt-small")


def _tokens(job: Job) -> torch.Tensor:
    return torch.stack([job.dataset[i][0] for i in range(3)])


def test_the_public_reader_gives_the_newest_complete_checkpoint_as_the_unsplit_model(
    tmp_path, tiny
):
    older = _write_checkpoint(tmp_path, tiny, 9, seed=1)
    newer = _write_checkpoint(tmp_path, tiny, 19, seed=2)
    # A newer checkpoint still being written (its last layer not there yet) is passed over.
    (tmp_path / "step-29").mkdir()
    for index in range(tiny.num_layers - 1):
        (tmp_path / "step-29" / f"layer-{index}.pt").write_bytes(
            (tmp_path / "step-19" / f"layer-{index}.pt").read_bytes()
        )

    state = liveput.checkpoint.load(str(tmp_path), token=TOKEN)
    model = nn.Sequential(*tiny.layers).eval()
    model.load_state_dict(state)  # strict: every key of the unsplit model, nothing else
    tokens = _tokens(tiny)
    with torch.no_grad():
        assert torch.equal(model(tokens), _unsplit(newer)(tokens))
        assert not torch.equal(model(tokens), _unsplit(older)(tokens))
    read = liveput.checkpoint.read(str(tmp_path / "step-9"), token=TOKEN)
    assert read.step == 9 and read.num_layers == tiny.num_layers
    assert all(
        torch.equal(read.state_dict[key], value)
        for key, value in _unsplit(older).state_dict().items()
    )
    with pytest.raises(LiveputError, match="step-29: incomplete, layer files missing"):
        liveput.checkpoint.load(str(tmp_path / "step-29"), token=TOKEN)


def test_the_reader_refuses_another_token_and_a_checkpoint_of_missing_layers(tmp_path, tiny):
    _write_checkpoint(tmp_path, tiny, 4, seed=1)
    with pytest.raises(LiveputError, match="signature does not match"):
        liveput.checkpoint.load(str(tmp_path), token="another-token")
    # Told the job's layer count, a checkpoint that lost its last layer file is incomplete.
    (tmp_path / "step-4" / f"layer-{tiny.num_layers - 1}.pt").unlink()
    with pytest.raises(LiveputError, match="no complete checkpoint"):
        liveput.checkpoint.load(str(tmp_path), token=TOKEN, num_layers=tiny.num_layers)
    with pytest.raises(LiveputError, match="no such folder"):
        liveput.checkpoint.load(str(tmp_path / "nothing"), token=TOKEN)


def test_export_writes_a_state_dict_and_a_dcp_folder_of_the_same_tensors(tmp_path, tiny, capsys):
    import torch.distributed.checkpoint as dcp

    layers = _write_checkpoint(tmp_path / "ckpt", tiny, 7, seed=3)
    want = _unsplit(layers).state_dict()

    pt = tmp_path / "model.pt"
    args = ["export", str(tmp_path / "ckpt"), "--token", TOKEN, "--model", "tiny-gpt-small"]
    assert main([*args, "-o", str(pt), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step"] == 7 and summary["format"] == "state_dict"
    assert summary["written"] == [str(pt)]
    got = torch.load(pt, weights_only=True)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)

    folder = tmp_path / "dcp"
    assert main([*args, "-o", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "dcp"
    back = {key: torch.zeros_like(value) for key, value in want.items()}
    with warnings.catch_warnings():  # loading in one process, without a group, is meant
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(back, checkpoint_id=str(folder))
    assert all(torch.equal(back[k], want[k]) for k in want)
    # Nothing already written is overwritten by a second export there.
    assert main([*args, "-o", str(folder)]) == 2
    assert "folder is not empty" in capsys.readouterr().err


def test_export_of_a_launched_jobs_folder_takes_its_token(tmp_path, tiny, capsys, monkeypatch):
    monkeypatch.delenv("LIVEPUT_TOKEN", raising=False)
    layers = _write_checkpoint(tmp_path / "job" / "checkpoints", tiny, 3, seed=4)
    (tmp_path / "job" / "token").write_text(TOKEN + "\n")
    assert main(["export", str(tmp_path / "job"), "-o", str(tmp_path / "m.pt")]) == 0
    got = torch.load(tmp_path / "m.pt", weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in _unsplit(layers).state_dict().items())
    # Its checkpoints folder too (the token is beside it); elsewhere a token is required, said
    # in one line.
    assert (
        main(["export", str(tmp_path / "job" / "checkpoints"), "-o", str(tmp_path / "c.pt")]) == 0
    )
    _write_checkpoint(tmp_path / "elsewhere", tiny, 3, seed=4)
    code = main(["export", str(tmp_path / "elsewhere"), "-o", str(tmp_path / "n.pt")])
    err = capsys.readouterr().err
    assert code == 2 and "--token" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_tampered_checkpoint_is_refused_in_one_line_and_nothing_is_written(
    tmp_path, tiny, capsys, damage
):
    _write_checkpoint(tmp_path / "ckpt", tiny, 5, seed=5)
    victim = tmp_path / "ckpt" / "step-5" / "layer-1.pt"
    data = bytearray(victim.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    victim.write_bytes(bytes(data))
    out = tmp_path / "model.pt"
    code = main(["export", str(tmp_path / "ckpt"), "-o", str(out), "--token", TOKEN])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "layer-1.pt: signature does not match" in err
    assert "Traceback" not in err and not out.exists()


def test_export_refuses_an_incomplete_checkpoint_and_weights_of_another_model(
    tmp_path, tiny, capsys
):
    _write_checkpoint(tmp_path / "ckpt", tiny, 5, seed=6)
    (tmp_path / "ckpt" / "step-5" / "layer-0.pt").unlink()
    step = str(tmp_path / "ckpt" / "step-5")
    assert main(["export", step, "-o", str(tmp_path / "m.pt"), "--token", TOKEN]) == 2
    assert "incomplete, layer files missing: 0" in capsys.readouterr().err
    _write_checkpoint(tmp_path / "other", resolve_job("tiny-gpt"), 5, seed=6)
    args = ["export", str(tmp_path / "other"), "-o", str(tmp_path / "m.pt"), "--token", TOKEN]
    assert main([*args, "--model", "tiny-gpt-small"]) == 2
    assert "another model" in capsys.readouterr().err and not (tmp_path / "m.pt").exists()
    # Weights of as many layers as the job's but of other shapes do not fit it either.
    with pytest.raises(LiveputError, match="do not fit the job's layers"):
        write_model(
            _unsplit(_trained_layers(tiny, 1)).state_dict(),
            tiny_gpt2_job().layers,
            tmp_path / "x.pt",
        )


def tiny_gpt2_job() -> Job:
    """A 2-block GPT-2 cut by the transformers adapter (``--model test_weights_export:...``)."""
    tokens = torch.randint(0, 64, (16, 9), generator=torch.Generator().manual_seed(0))
    return Job(
        layers=from_hf_causal_lm(tied_gpt2_config(), seed=3),
        dataset=torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]),
        loss_fn=lambda logits, targets: nn.functional.cross_entropy(
            logits.flatten(0, 1), targets.flatten()
        ),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        global_batch_size=4,
        name="tiny-gpt2",
    )


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def test_a_transformers_job_comes_back_as_its_own_model_with_tied_embeddings(tmp_path, capsys):
    import transformers

    job = tiny_gpt2_job()
    # Moved as training moves a tie: the embedding and the head equal.
    layers = _write_checkpoint(tmp_path / "ckpt", job, 11, seed=7)
    with torch.no_grad():
        layers[-1].module.projection.weight.copy_(layers[0].module.token.weight)
    _write_checkpoint(tmp_path / "ckpt", job, 11, seed=7, layers=layers)
    trained = _unsplit(layers)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))

    args = ["export", str(tmp_path / "ckpt"), "--token", TOKEN]
    args += ["--model", "test_weights_export:tiny_gpt2_job"]
    assert main([*args, "-o", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    assert main([*args, "-o", str(tmp_path / "m.pt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["written"] == [
        str(tmp_path / "m.pt"),
        str(tmp_path / "m.hf"),
    ]
    for folder in (tmp_path / "m.hf", tmp_path / "d" / "hf"):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        assert isinstance(model, transformers.GPT2LMHeadModel)
        assert model.config.tie_word_embeddings is True
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        with torch.no_grad():
            torch.testing.assert_close(_logits(model, tokens), trained(tokens))
        # The original key names: the state dict of the transformers model itself.
        assert "transformer.h.1.attn.c_attn.weight" in model.state_dict()


def test_tied_embeddings_that_differ_stay_untied_with_equal_logits(tmp_path, caplog):
    """Training keeps a tie equal (tests/test_tied_weights.py); weights where the two differ
    (trained before ties were kept) cannot be tied without changing the model's outputs."""
    import transformers

    job = tiny_gpt2_job()
    assert job.tied_weights == (("0.token.weight", "3.projection.weight"),)
    layers = _trained_layers(job, seed=8)  # the head moved apart from the embedding
    trained = _unsplit(layers)
    with caplog.at_level(logging.WARNING):
        write_model(trained.state_dict(), job.layers, tmp_path / "m.pt")
    assert "stay untied" in caplog.text
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "m.hf")).eval()
    assert model.config.tie_word_embeddings is False
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, tokens), trained(tokens))


def test_train_puts_the_model_beside_its_output_or_in_a_new_folder_of_its_own(tmp_path):
    from liveput.cli.train import model_output

    assert model_output(tmp_path / "run.json") == tmp_path / "run.model.pt"
    first, second = (model_output(None, root=tmp_path / "liveput-out") for _ in range(2))
    assert first.name == second.name == "model.pt" and first.parent != second.parent
    assert first.parent.is_dir() and first.parent.parent == tmp_path / "liveput-out"
    with pytest.raises(LiveputError, match="does not exist"):
        model_output(tmp_path / "missing" / "run.json")


def test_a_launched_jobs_final_layers_become_model_pt_and_its_pretrained_folder(tmp_path):
    import transformers

    from liveput.operate.export import export_model

    job = tiny_gpt2_job()
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    Checkpointer(MemoryStore(), str(tmp_path / "ckpt")).save_now("final", layers)
    out = export_model(
        str(tmp_path / "ckpt"), job.num_layers, tmp_path / "model.pt", 0.0, job.layers
    )
    got = torch.load(out, weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in _unsplit(layers).state_dict().items())
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "model.hf")).eval()
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, tokens), _unsplit(layers)(tokens))
    # The coordinator's jobs leave only final/: liveput export reads it (plain files, no token).
    assert main(["export", str(tmp_path / "ckpt" / "final"), "-o", str(tmp_path / "f.pt")]) == 0
    exported = torch.load(tmp_path / "f.pt", weights_only=True)
    assert exported.keys() == got.keys() and all(torch.equal(exported[k], got[k]) for k in got)
    with pytest.raises(LiveputError, match="lacks layer files: the job did not finish"):
        export_model(str(tmp_path / "nothing"), job.num_layers, tmp_path / "x.pt", 0.0)


def test_a_train_checkpoint_folder_keeps_its_token_and_every_step_exports(
    tmp_path, tiny, capsys, monkeypatch
):
    """`liveput train --checkpoint-dir ck` signs with a token it made up; the folder keeps it
    (mode 0600), so that `liveput export ck/step-<s>` needs no --token; a run into the same
    folder again signs with the same token; a token given wins."""
    from liveput.launch.job_token import keep_token, run_token

    monkeypatch.delenv("LIVEPUT_TOKEN", raising=False)
    folder = tmp_path / "ck"
    token = run_token(None, str(folder))
    assert not folder.exists()  # nothing written before the run is assembled
    keep_token(str(folder), token)
    assert (folder / "token").stat().st_mode & 0o777 == 0o600
    assert run_token(None, str(folder)) == token
    assert run_token("given", str(folder)) == "given"
    keep_token(str(folder), "other")  # a folder's token is never replaced
    assert (folder / "token").read_text().strip() == token
    older = _write_checkpoint(folder, tiny, 2, seed=1, token=token)
    newer = _write_checkpoint(folder, tiny, 5, seed=2, token=token)
    for source, layers in ((folder / "step-2", older), (folder, newer)):
        out = tmp_path / f"{source.name}.pt"
        assert main(["export", str(source), "-o", str(out)]) == 0, capsys.readouterr().err
        got = torch.load(out, weights_only=True)
        assert all(torch.equal(got[k], v) for k, v in _unsplit(layers).state_dict().items())
    # Another folder's token does not verify these files.
    (tmp_path / "forged").mkdir()
    _write_checkpoint(tmp_path / "forged", tiny, 2, seed=1, token="someone-else")
    (tmp_path / "forged" / "token").write_text(token + "\n")
    code = main(["export", str(tmp_path / "forged"), "-o", str(tmp_path / "f.pt")])
    assert code == 2 and not (tmp_path / "f.pt").exists()


def test_a_writability_check_leaves_no_folder_it_made(tmp_path):
    from liveput.files import check_writable_url

    check_writable_url(str(tmp_path / "a" / "b" / "c"), "train: --checkpoint-dir")
    assert not (tmp_path / "a").exists()
    (tmp_path / "kept").mkdir()
    check_writable_url(str(tmp_path / "kept"), "train: --checkpoint-dir")
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())
    (tmp_path / "file").write_text("x")
    with pytest.raises(LiveputError, match="train: --checkpoint-dir .* cannot be written"):
        check_writable_url(str(tmp_path / "file" / "sub"), "train: --checkpoint-dir")
