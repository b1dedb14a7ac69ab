"""A layer's training state (parameters and optimizer state) and its wire format.

Each layer has its own optimizer (optimizers are element-wise, so this equals one optimizer over
the whole model), which makes a layer the unit that moves between instances. Serialized state is
``torch.save`` bytes, optionally signed with the job token (HMAC-SHA256), and is only ever read
back with ``torch.load(..., weights_only=True)``: nothing from the network is unpickled.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import io
from dataclasses import dataclass, field

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.job import Job, build_optimizer

_DIGEST_BYTES = 32


@dataclass
class LayerState:
    """One layer held by this instance, with its optimizer."""

    index: int
    """Position of the layer in the model."""
    module: nn.Module
    """The layer (this instance's own copy)."""
    optimizer: torch.optim.Optimizer | None
    """Its optimizer; ``None`` for a layer without parameters."""
    training: dict = field(default_factory=dict)
    """The job-wide training state as of this layer's step (the fp16 loss scaler's:
    ``optimizer_step.OptimizerStep.state_dict``); empty for a fresh layer."""

    def state_dict(self) -> dict:
        return {
            "module": {k: v.detach().clone() for k, v in self.module.state_dict().items()},
            "optimizer": _copied(self.optimizer.state_dict()) if self.optimizer else {},
            "training": dict(self.training),
        }

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        if self.optimizer is not None and state["optimizer"]:
            self.optimizer.load_state_dict(state["optimizer"])
        self.training = dict(state.get("training", {}))


def _copied(value: object) -> object:
    """A copy of a state dict whose tensors are cloned (less than half ``copy.deepcopy``'s time
    for tiny-gpt's Adam state: it runs at a step boundary, on the training's critical path)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    return copy.deepcopy(value)


def fresh_layer(job: Job, index: int, device: torch.device, initialize: bool = True) -> LayerState:
    """Layer ``index`` as the job initializes it, with a new optimizer; with ``initialize``
    false, the memory of a layer whose state is loaded next (a job built without its weights
    skips initializing it: ``liveput.models.lazy``)."""
    module = job.own_layer(index, device, initialize)
    return LayerState(index, module, build_optimizer(job.optimizer, index, module))


def encode_state(state: dict, token: bytes | None = None) -> bytes:
    """``torch.save`` bytes, prefixed by an HMAC under ``token`` when given."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    if token is None:
        return payload
    return hmac.new(token, payload, hashlib.sha256).digest() + payload


def decode_state(data: bytes, token: bytes | None = None, where: str = "peer") -> dict:
    """The inverse of :func:`encode_state`; refuses a forged or unsigned payload."""
    if token is not None:
        digest, data = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
        if not hmac.compare_digest(digest, hmac.new(token, data, hashlib.sha256).digest()):
            raise LiveputError(f"layer state from {where} is not signed with the job token")
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - any unpickling failure is refused the same way
        raise LiveputError(f"layer state from {where} cannot be loaded: {error}") from None
