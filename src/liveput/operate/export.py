"""A finished job's model as one ``state_dict`` file, loadable into the unsplit model.

The agents of pipeline 0 write each layer's final weights under ``<checkpoints>/final/``
(``layer-<i>.pt``: its module and optimizer state). The unsplit model is
``torch.nn.Sequential(*job.layers)``, whose keys are ``<i>.<name>``; this joins the layer files
into those keys (:mod:`liveput.runtime.weights`)::

    model = torch.nn.Sequential(*resolve_job("tiny-gpt").layers)
    model.load_state_dict(torch.load("model.pt", weights_only=True))

Given the job's layers, a transformers job also gets its ``save_pretrained`` folder beside
(``model.hf/``; :mod:`liveput.runtime.model_files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch import nn

from liveput.runtime.model_files import write_model
from liveput.runtime.weights import final_layers_present, read_final

__all__ = ["export_model", "final_layers_present"]


def export_model(
    checkpoint_dir: str,
    num_layers: int,
    output: Path,
    wait_s: float = 20.0,
    layers: Sequence[nn.Module] | None = None,
) -> Path:
    """Write the final model to ``output``; waits up to ``wait_s`` for the last agents to
    finish writing their final layer files."""
    write_model(read_final(checkpoint_dir, num_layers, wait_s), layers, output, dcp=False)
    return output
