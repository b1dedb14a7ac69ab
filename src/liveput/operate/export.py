"""A finished job's model as one ``state_dict`` file, loadable into the unsplit model.

The agents of pipeline 0 write each layer's final weights under ``<checkpoints>/final/``
(``layer-<i>.pt``: its module and optimizer state). The unsplit model is
``torch.nn.Sequential(*job.layers)``, whose keys are ``<i>.<name>``; this joins the layer files
into those keys::

    model = torch.nn.Sequential(*resolve_job("tiny-gpt").layers)
    model.load_state_dict(torch.load("model.pt"))
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import fsspec
import torch

from liveput.errors import LiveputError
from liveput.files import write_bytes_atomic


def final_layers_present(checkpoint_dir: str, num_layers: int) -> bool:
    fs, root = fsspec.core.url_to_fs(checkpoint_dir.rstrip("/"))
    return all(fs.exists(f"{root}/final/layer-{i}.pt") for i in range(num_layers))


def export_model(checkpoint_dir: str, num_layers: int, output: Path, wait_s: float = 20.0) -> Path:
    """Write the final model to ``output``; waits up to ``wait_s`` for the last agents to
    finish writing their final layer files."""
    deadline = time.monotonic() + wait_s
    while not final_layers_present(checkpoint_dir, num_layers):
        if time.monotonic() > deadline:
            raise LiveputError(
                f"export: {checkpoint_dir}/final/ lacks layer files: the job did not finish"
            )
        time.sleep(0.2)
    fs, root = fsspec.core.url_to_fs(checkpoint_dir.rstrip("/"))
    joined: dict[str, torch.Tensor] = {}
    for index in range(num_layers):
        with fs.open(f"{root}/final/layer-{index}.pt", "rb") as handle:
            state = torch.load(io.BytesIO(handle.read()), weights_only=True, map_location="cpu")
        for name, tensor in state["module"].items():
            joined[f"{index}.{name}"] = tensor
    buffer = io.BytesIO()
    torch.save(joined, buffer)
    write_bytes_atomic(output, buffer.getvalue())
    return output
