"""Read a liveput checkpoint back as the unsplit model's ``state_dict``.

::

    import torch
    import liveput.checkpoint

    state = liveput.checkpoint.load("ckpts/", token=os.environ["LIVEPUT_TOKEN"])
    model = torch.nn.Sequential(*job.layers)
    model.load_state_dict(state)

:func:`load` verifies every layer file's signature before anything is unpickled (and unpickles
with ``weights_only=True``); :func:`read` also says which step the checkpoint is of. Why
checkpoints stay in liveput's own signed format, and how to get them in
``torch.distributed.checkpoint``'s (``liveput export CHECKPOINT -o DIR``): ``docs/training.md``.
"""

from __future__ import annotations

from liveput.runtime.weights import CheckpointWeights, join_layers, load
from liveput.runtime.weights import read_checkpoint as read

__all__ = ["CheckpointWeights", "join_layers", "load", "read"]
