"""The README's own-model example, as a user would take it: its ``mymodel.py`` is complete code
that ``liveput profile``, ``perf`` and ``train`` take by its reference (``mymodel:target``) from
the user's folder; the model ``train`` saves loads into the plain model; the same module with a
layer the pipeline cannot carry is refused in one line.

Apart from the README's commands (tests/test_cli_docs.py): each is a long process test, and the
process tier runs a file per worker.
"""

from __future__ import annotations

import copy
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import liveput
import liveput.checkpoint

ROOT = Path(__file__).resolve().parents[1]
LIVEPUT = Path(sys.executable).with_name("liveput")


def _readme_own_model() -> str:
    """The README's ``mymodel.py``, exactly as its "Your own model" section shows it."""
    section = (ROOT / "README.md").read_text().split("### Your own model", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert found is not None and found.group(1).startswith("# mymodel.py\n")
    return found.group(1)


def _users_environment(folder: Path) -> dict[str, str]:
    """A user's shell: no ``PYTHONPATH``. Where this interpreter would then import another
    liveput than the one under test (a checkout beside the installed one), its sources' folder
    alone goes on it (it holds nothing of the user's), so that the test still tests them."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    probe = subprocess.run(
        [sys.executable, "-P", "-c", "import liveput; print(liveput.__file__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    tested = Path(liveput.__file__).resolve()
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != tested:
        env["PYTHONPATH"] = str(tested.parents[1])
    return env


# A replayed trace of one preemption: instance a alone at first, so the removal's notice (30 trace
# s ahead, at 10 s) can only go to a; b comes at 20 s; a goes at 40 s. At 10 trace s per wall
# second a goes 4 s after the start, while the 3000 steps still run (2-4 ms each here). The
# job normally starts on a and moves to b (or restores on it); on a machine so loaded that a's
# agent takes over 4 s to start, the job starts on b: either way it runs through the loss of an
# instance, and the assertions hold. b goes at the trace's end, 15 wall minutes in: long after
# the last step. (It went at 90 s: in a fresh-clone suite on a slow machine the steps took 25 ms
# each, b went 65 steps before the end, and the job waited for an instance until the timeout.)
_ONE_PREEMPTION = "0,add,a\n20000,add,b\n40000,remove,a\n9000000,remove,b\n"


@pytest.mark.process
def test_the_readmes_own_model_profiles_estimates_and_trains_as_written(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    code = _readme_own_model()
    (folder / "mymodel.py").write_text(code)
    env = _users_environment(folder)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(LIVEPUT), *args],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )

    profiled = run("profile", "--model", "mymodel:target", "-o", "my.json")
    assert profiled.returncode == 0, profiled.stderr[-2000:]
    assert len(json.loads((folder / "my.json").read_text())["layers"]) == 5
    estimated = run("perf", "mymodel:target")
    assert estimated.returncode == 0 and "1 x 1" in estimated.stdout, estimated.stderr[-2000:]

    (folder / "trace.csv").write_text(_ONE_PREEMPTION)
    trained = run(
        *("train", "--model", "mymodel:target", "--trace", "trace.csv", "--steps", "3000"),
        *("--time-scale", "10", "--notice-lead", "30", "--notice-margin", "1"),
        *("--checkpoint-dir", "ckpt", "--checkpoint-every", "100", "-o", "run.json"),
    )
    logs = "".join(p.read_text() for p in (folder / "logs").glob("*.log"))
    assert trained.returncode == 0, trained.stderr[-2000:] + logs[-2000:]
    summary = json.loads((folder / "run.json").read_text())
    assert summary["exactly_once"] is True and summary["steps_completed"] == 3000
    assert summary["preemptions"] == 1, summary
    assert summary["final_loss"] < summary["initial_loss"]

    # The model train wrote loads into the plain model of the same layers, and computes what
    # the run's final layers compute.
    job = runpy.run_path(str(folder / "mymodel.py"))["target"]()
    saved = nn.Sequential(*copy.deepcopy(job.layers))
    saved.load_state_dict(torch.load(folder / "run.model.pt", weights_only=True))
    final = nn.Sequential(*copy.deepcopy(job.layers))
    final.load_state_dict(liveput.checkpoint.load(str(folder / "ckpt" / "final")))
    inputs = torch.stack([job.dataset[i][0] for i in range(16)])
    with torch.no_grad():
        assert torch.equal(saved(inputs), final(inputs))
        assert not torch.allclose(saved(inputs), nn.Sequential(*job.layers)(inputs))

    # The same module with an LSTM: refused in one line before anything starts.
    assert "nn.Linear(8, 64)" in code
    (folder / "lstmmodel.py").write_text(code.replace("nn.Linear(8, 64)", "nn.LSTM(8, 64)", 1))
    refused = run("train", "--model", "lstmmodel:target", "--steps", "2", "-o", "lstm.json")
    err = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(err) == 1, refused.stderr[-2000:]
    assert "layer 0 (LSTM) returned a tuple" in err[0]
    assert not (folder / "lstm.json").exists()
