"""Any ``nn.Sequential`` as liveput layers: each child is one layer (a pipeline cut point)."""

from __future__ import annotations

from torch import nn

from liveput.errors import LiveputError


def from_sequential(model: nn.Sequential) -> list[nn.Module]:
    """The children of ``model`` in order (the same modules, not copies). Each must map one
    tensor to one tensor, as the layers of a :class:`liveput.Job` do."""
    if not isinstance(model, nn.Sequential):
        raise LiveputError(
            f"from_sequential: expected a torch.nn.Sequential, got {type(model).__name__}"
        )
    layers = list(model.children())
    if not layers:
        raise LiveputError("from_sequential: the Sequential has no layers")
    return layers
