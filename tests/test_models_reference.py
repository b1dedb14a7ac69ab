"""A user's own model: one ``module:function`` reference found the same way by every command,
its mistakes refused in one line naming the layer, and the trainer's conventions (optimizers
built from named parameters, the order the dataset is read in).

The user's module is written into a fresh temporary folder; the tests that run the CLI in a
process of its own do so as the console script runs it (``python -P``: the current folder is
not on ``sys.path`` by itself), with only liveput's own sources on ``PYTHONPATH``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import liveput
from liveput.cli.main import main
from liveput.errors import LiveputError
from liveput.models.job import Job, build_optimizer, epoch_order, replica_micro_batches
from liveput.models.jobs import resolve_job
from liveput.models.validate import check_job
from liveput.operate.jobfile import parse_job_file
from liveput.runtime.layer_state import fresh_layer

MODULE = """
import torch
from torch import nn

import liveput


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=64):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=generator)
        self.y = torch.randint(0, 4, (n,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class LastStep(nn.Module):
    def forward(self, x):
        return x[:, -1]


def target() -> liveput.Job:
    torch.manual_seed(0)
    return liveput.Job(
        layers=[nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)],
        dataset=Pairs(),
        loss_fn=nn.functional.cross_entropy,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        global_batch_size=8,
        micro_batch_size=4,
        name="mlp",
    )


def old_target():
    from liveput.perf.profiler import ProfileTarget

    job = target()
    return ProfileTarget(
        "old", job.layers, lambda n: (torch.randn(n, 8), torch.zeros(n, dtype=torch.long)),
        job.loss_fn,
    )


def needs(width):
    return target()


def lstm() -> liveput.Job:
    job = target()
    job.layers = [nn.Linear(8, 16), nn.LSTM(16, 16, batch_first=True), LastStep(), nn.Linear(16, 4)]
    return job
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A folder holding ``mymodel.py``, the current folder; ``sys.path`` and ``sys.modules``
    restored afterwards."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mymodel.py").write_text(MODULE)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    sys.modules.pop("mymodel", None)


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``liveput ARGS`` in a process of its own, run from ``cwd`` as the console script runs."""
    source = str(Path(liveput.__file__).resolve().parents[1])
    code = "import sys; from liveput.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-P", "-c", code, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": source},
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- one reference ------------------------------------------------------------------------


def test_a_users_module_is_found_in_the_current_folder_and_a_missing_one_named(user_module):
    assert "mymodel" not in sys.modules
    job = resolve_job("mymodel:target")
    assert job.name == "mlp" and len(job.layers) == 3
    with pytest.raises(LiveputError) as missing:
        resolve_job("nomodel:target")
    message = str(missing.value)
    assert "'nomodel'" in message and str(user_module) in message and "\n" not in message
    with pytest.raises(LiveputError, match="has no function 'nothing'"):
        resolve_job("mymodel:nothing")
    with pytest.raises(LiveputError, match=r"needs\(width\) must be callable without arguments"):
        resolve_job("mymodel:needs")
    with pytest.raises(LiveputError, match="expected \\[FOLDER/\\]module:function"):
        resolve_job("mymodel:")


def test_profile_still_takes_a_profile_target_and_checks_it(user_module):
    from liveput.perf.profiler import ProfileTarget, resolve_target

    target = resolve_target("mymodel:old_target")
    assert isinstance(target, ProfileTarget) and target.name == "old"
    assert resolve_target("mymodel:target").name == "mlp"  # a Job: its own dataset and loss
    with pytest.raises(LiveputError, match=r"layer 1 \(LSTM\) returned a tuple"):
        resolve_target("mymodel:lstm")


def test_a_reference_may_name_its_folder(tmp_path, monkeypatch):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "theirmodel.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert resolve_job(f"{folder}/theirmodel.py:target").name == "mlp"
        assert resolve_job("elsewhere/theirmodel:target").name == "mlp"
    finally:
        sys.modules.pop("theirmodel", None)


def test_a_job_file_in_another_folder_finds_its_own_module(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    (project / "jobmodel.py").write_text(MODULE)
    job_file = project / "job.yaml"
    text = "model: jobmodel:target\nsteps: 4\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        job = parse_job_file(text, str(job_file))
        # The folder form: what the agents read in the published job spec finds the module
        # whatever folder they run in.
        assert job.model == f"{project}/jobmodel:target"
        assert resolve_job(job.model).name == "mlp"
    finally:
        sys.modules.pop("jobmodel", None)
    with pytest.raises(LiveputError) as missing:
        parse_job_file("steps: 4\nmodel: gone:target\n", str(job_file))
    message = str(missing.value)
    assert message.startswith(f"{job_file}:2: model:")
    assert str(elsewhere) in message and str(project) in message


def test_models_lists_the_profilers_targets() -> None:
    from liveput.perf.profiler import TARGETS
    from liveput.perf.targets import TARGET_NAMES

    assert sorted(TARGET_NAMES) == sorted(TARGETS)


def test_models_lists_no_command_that_refuses_a_job(user_module, capsys):
    assert main(["models", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs (trained for real)"]
    assert {"profile", "perf", "train", "launch"} <= set(jobs["commands"])
    assert main(["profile", "--model", "mymodel:target", "--repeats", "1", "-o", "p.json"]) == 0
    assert json.loads((user_module / "p.json").read_text())["micro_batch_size"] == 4


@pytest.mark.process
def test_profile_and_perf_take_a_users_job_from_the_current_folder(user_module):
    profiled = cli(
        ["profile", "--model", "mymodel:target", "--repeats", "1", "-o", "out.json"], user_module
    )
    assert profiled.returncode == 0, profiled.stderr
    profile = json.loads((user_module / "out.json").read_text())
    assert profile["model"] == "mlp" and len(profile["layers"]) == 3
    estimated = cli(["perf", "mymodel:target", "--nodes", "2", "--json"], user_module)
    assert estimated.returncode == 0, estimated.stderr
    assert json.loads(estimated.stdout)["model"] == "mlp"
    refused = cli(["profile", "--model", "mymodel:lstm", "-o", "lstm.json"], user_module)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: model mlp: layer 1 (LSTM) returned a tuple (tensor (2, 16) float32, tuple "
        "(tensor (1, 16) float32, tensor (1, 16) float32)), not a tensor: each layer maps one "
        "tensor to one tensor (wrap it in a module that keeps the part the next layer needs)"
    ]
    assert not (user_module / "lstm.json").exists()


# --- model mistakes in one line -----------------------------------------------------------


def small_job(layers: list[nn.Module], **changes) -> Job:
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, generator=generator), torch.tensor(i % 4)) for i in range(16)]
    fields = {
        "layers": layers,
        "dataset": data,
        "loss_fn": nn.functional.cross_entropy,
        "optimizer": lambda params: torch.optim.SGD(params, lr=0.1),
        "global_batch_size": 8,
        "micro_batch_size": 4,
        "name": "small",
    }
    return Job(**{**fields, **changes})


def refusal(job: Job) -> str:
    with pytest.raises(LiveputError) as refused:
        check_job(job)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_layer_returning_a_tuple_is_named():
    message = refusal(small_job([nn.Linear(8, 16), nn.LSTM(16, 4), nn.Linear(4, 4)]))
    assert message.startswith("model small: layer 1 (LSTM) returned a tuple (tensor (2, 4)")


def test_shapes_that_do_not_chain_name_both_layers():
    message = refusal(small_job([nn.Linear(8, 16), nn.ReLU(), nn.Linear(32, 4)]))
    assert message.startswith(
        "model small: layer 2 (Linear) does not accept layer 1's (ReLU) output "
        "(tensor (2, 16) float32): RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )
    first = refusal(small_job([nn.Linear(5, 4)]))
    assert first.startswith("model small: layer 0 (Linear) does not accept the dataset's input")


def test_a_layer_that_is_random_in_training_mode_is_named():
    message = refusal(small_job([nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 4)]))
    assert message.startswith("model small: layer 1 (Dropout) is not deterministic")
    # In eval mode (the engine never changes a layer's mode) or off, it passes; and the check
    # leaves the job's own layers as they were.
    check_job(small_job([nn.Linear(8, 16), nn.Dropout(0.5).eval(), nn.Linear(16, 4)]))
    job = small_job([nn.Linear(8, 16), nn.Dropout(0.0), nn.BatchNorm1d(16), nn.Linear(16, 4)])
    check_job(job)
    assert int(job.layers[2].num_batches_tracked) == 0


@pytest.mark.parametrize(
    ("item", "said"),
    [
        (torch.zeros(8), "tensor (8,) float32"),
        ((torch.zeros(8), 1), "tuple (tensor (8,) float32, int)"),
        ({"x": torch.zeros(8)}, "dict with keys ['x']"),
    ],
)
def test_a_dataset_item_of_the_wrong_form_is_named_by_its_index(item, said):
    generator = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, generator=generator), torch.tensor(0)) for _ in range(16)]
    data[2] = item
    message = refusal(small_job([nn.Linear(8, 4)], dataset=data))
    assert message == (
        f"job small: dataset[2] is a {said}; expected an (input, target) pair of tensors"
    )


def test_a_loss_that_is_not_a_scalar_is_refused():
    def per_sample(y, t):
        return nn.functional.cross_entropy(y, t, reduction="none")

    message = refusal(small_job([nn.Linear(8, 4)], loss_fn=per_sample))
    assert message.startswith("model small: the loss is a tensor (2,) float32, expected a scalar")


def test_train_refuses_a_model_mistake_in_one_line_before_anything_starts(user_module, capsys):
    assert main(["train", "--model", "mymodel:lstm", "--steps", "2", "-o", "run.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model mlp: layer 1 (LSTM) returned")
    assert not (user_module / "run.json").exists()


# --- trainer conventions ------------------------------------------------------------------


def test_an_optimizer_factory_may_take_named_parameters_for_weight_decay_by_name():
    seen: list[str] = []

    def optimizer(named_parameters):
        named = list(named_parameters)
        seen.extend(name for name, _ in named)
        decay = [p for name, p in named if name.endswith("weight")]
        rest = [p for name, p in named if not name.endswith("weight")]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.5}, {"params": rest, "weight_decay": 0.0}],
            lr=0.1,
        )

    job = small_job([nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)], optimizer=optimizer)
    state = fresh_layer(job, 2, torch.device("cpu"))
    assert seen == ["2.weight", "2.bias"]  # the unsplit model's names
    weight, bias = state.module.weight.detach().clone(), state.module.bias.detach().clone()
    for parameter in state.module.parameters():
        parameter.grad = torch.zeros_like(parameter)
    assert state.optimizer is not None
    state.optimizer.step()
    # Zero gradients: only the decay moves the weights, and only the weights.
    assert torch.allclose(state.module.weight, weight * (1 - 0.1 * 0.5))
    assert torch.equal(state.module.bias, bias)
    # The list-of-parameters form still works; a layer without parameters gets none.
    plain = small_job([nn.Linear(8, 4)])
    assert isinstance(build_optimizer(plain.optimizer, 0, plain.layers[0]), torch.optim.SGD)
    assert build_optimizer(plain.optimizer, 1, nn.ReLU()) is None


def test_a_seeded_shuffle_gives_each_epoch_its_own_permutation():
    first, second = epoch_order(7, 0, 50), epoch_order(7, 1, 50)
    assert sorted(first.tolist()) == list(range(50)) == sorted(second.tolist())
    assert first.tolist() != second.tolist() and first.tolist() != list(range(50))
    assert epoch_order(7, 1, 50).tolist() == second.tolist()  # a pure function of its inputs
    job = small_job([nn.Linear(8, 4)], shuffle_seed=7)
    size = len(job.dataset)
    epoch_one = [job.dataset_index(g, size) for g in range(size, 2 * size)]
    assert epoch_one == epoch_order(7, 1, size).tolist()
    unshuffled = small_job([nn.Linear(8, 4)])
    assert [unshuffled.dataset_index(g, size) for g in range(20)] == [g % size for g in range(20)]
    with pytest.raises(LiveputError, match="shuffle_seed"):
        small_job([nn.Linear(8, 4)], shuffle_seed=-1)


def test_the_samples_of_a_step_are_the_same_whatever_configuration_runs_them():
    job = small_job([nn.Linear(8, 4)], shuffle_seed=3, global_batch_size=16, micro_batch_size=2)
    for step in (0, 1, 5):
        seen = {}
        for data_parallel in (1, 2, 4, 8):
            inputs = []
            for pipeline in range(data_parallel):
                for micro in replica_micro_batches(job.num_micro_batches, data_parallel, pipeline):
                    inputs.append(job.micro_batch(step, micro)[0])
            seen[data_parallel] = torch.cat(inputs)
        assert all(torch.equal(batch, seen[1]) for batch in seen.values())
    # One step reads B distinct samples of its epoch (16 samples, batch 16: the whole epoch).
    first_step = torch.cat([job.micro_batch(0, m)[0] for m in range(job.num_micro_batches)])
    assert torch.allclose(first_step.sum(0), torch.stack([x for x, _ in job.dataset]).sum(0))
    assert not torch.equal(first_step, torch.stack([x for x, _ in job.dataset]))  # shuffled


@pytest.mark.process
def test_train_from_a_job_file_in_another_folder_reaches_the_agents(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "jobmodel.py").write_text(MODULE)
    (project / "job.yaml").write_text(
        "model: jobmodel:target\nsteps: 3\ndevice: cpu\n"
        "provider:\n  workers: 2\n  time_scale: 30\ncheckpoint:\n  every: 0\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = cli(
        ["train", "--job", str(project / "job.yaml"), "--log-dir", "logs", "-o", "run.json"],
        elsewhere,
    )
    logs = "".join(p.read_text() for p in (elsewhere / "logs").glob("*.log"))
    assert run.returncode == 0, run.stderr[-2000:] + logs[-2000:]
    assert json.loads((elsewhere / "run.json").read_text())["steps_completed"] == 3


def shuffled_named_job() -> Job:
    """An MLP read in a seeded shuffle, with SGD whose weight decay is chosen by name."""
    from test_models_training import Blobs

    torch.manual_seed(0)

    def optimizer(named_parameters):
        named = list(named_parameters)
        return torch.optim.SGD(
            [
                {"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.01},
                {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0},
            ],
            lr=0.05,
            momentum=0.9,
        )

    return Job(
        [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)],
        Blobs(),
        nn.functional.cross_entropy,
        optimizer,
        global_batch_size=8,
        micro_batch_size=2,
        name="mlp",
        shuffle_seed=11,
    )


@pytest.mark.process
def test_a_shuffled_job_with_named_groups_trains_the_same_through_migrations(tmp_path):
    """(2, 2), then (1, 2), then a checkpoint restore onto (1, 1): the final parameters equal
    one uninterrupted process's, so every configuration read the same shuffled samples and the
    optimizer's named groups travelled with the layers."""
    from test_models_training import parameters_only, run_through_preemptions

    from liveput.testbed.reference import parameter_mismatches, reference_parameters

    steps = 8
    job = shuffled_named_job()
    cluster = run_through_preemptions(job, tmp_path, steps)
    got = [
        cluster.checkpointer.load_layer_file(f"final/layer-{i}.pt")["module"]
        for i in range(job.num_layers)
    ]
    want = reference_parameters(shuffled_named_job(), steps)
    assert not parameter_mismatches(parameters_only(job, got), parameters_only(job, want))
    unshuffled = dataclasses.replace(shuffled_named_job(), shuffle_seed=None)
    other = reference_parameters(unshuffled, steps)
    assert parameter_mismatches(parameters_only(job, other), parameters_only(job, want))


def test_launch_refuses_a_model_mistake_from_the_job_files_folder_in_one_line(
    tmp_path, monkeypatch, capsys
):
    project = tmp_path / "project"
    project.mkdir()
    (project / "lstmmodel.py").write_text(MODULE)
    job_file = project / "job.yaml"
    job_file.write_text("model: lstmmodel:lstm\nsteps: 3\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        assert main(["launch", str(job_file)]) == 2
    finally:
        sys.modules.pop("lstmmodel", None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model mlp: layer 1 (LSTM) returned")
    assert not (project / ".liveput").exists()  # nothing started, no state written
