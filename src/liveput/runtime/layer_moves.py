"""Moving a generation's layers into place: from a checkpoint, or peer to peer over the
generation's process groups (the engine's state movement, :class:`~liveput.runtime.engine.
Engine`).

A receiver takes every layer's bytes before it builds any: a sender is done once its bytes
crossed the link, not once the receiver has built each layer (its first optimizer imports
``torch._dynamo``, seconds of CPU), which a sender with a notice may not have left. In
``bench peers --regime pipeline --quick`` a sender preempted 4.2 s into such a move took the
job back to its initial weights (18 steps). An idle instance builds a layer once beforehand
(:func:`warm_up`) when a move is coming (:mod:`liveput.runtime.agent`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.runtime import protocol
from liveput.runtime.checkpoint import Checkpointer, CorruptCheckpoint
from liveput.runtime.comm import Groups
from liveput.runtime.layer_state import LayerState, decode_state, encode_state, fresh_layer
from liveput.runtime.memory_copies import MemoryCopies, fetch_copy
from liveput.runtime.protocol import RuntimePlan

TRANSFER_TAG = 1 << 20
"""Tag of a plan's first transfer (the n-th is this + n)."""


def warm_up(job: Job, device: torch.device) -> float:
    """Build one layer of ``job`` (its first with parameters) and its optimizer, and drop them;
    seconds it took. The first optimizer a process builds imports ``torch._dynamo`` (3.5 CPU-s
    measured here, with torch 2.13)."""
    started = time.perf_counter()
    trained = (
        i for i, layer in enumerate(job.layers) if next(layer.parameters(), None) is not None
    )
    fresh_layer(job, next(trained, 0), device)
    return time.perf_counter() - started


def restored_layers(
    job: Job,
    device: torch.device,
    checkpointer: Checkpointer | None,
    restore_step: int,
    needed: range,
) -> dict[int, LayerState]:
    """Layers ``needed`` as of checkpoint ``restore_step`` (``FRESH_START``: as the job
    initializes them)."""
    layers = {}
    for index in needed:
        layer = fresh_layer(job, index, device, restore_step == protocol.FRESH_START)
        if restore_step != protocol.FRESH_START:
            if checkpointer is None:
                raise LiveputError("plan restores from a checkpoint but no checkpoint dir is set")
            try:
                state = checkpointer.load_layer(restore_step, index)
            except (CorruptCheckpoint, FileNotFoundError) as error:
                # Detected by its signature, or deleted: the next plan restores the one
                # before (a transient read error below is tried again instead).
                checkpointer.discard(restore_step)
                raise LiveputError(
                    f"checkpoint of step {restore_step}, layer {index}: {error}"
                ) from None
            except OSError as error:  # gone or unreadable: this plan fails, the job goes on
                raise LiveputError(
                    f"checkpoint of step {restore_step} has no readable layer {index}: {error}"
                ) from None
            layer.load_state_dict(state)
        layers[index] = layer
    return layers


def copied_layers(
    job: Job,
    device: torch.device,
    plan: RuntimePlan,
    needed: range,
    own: MemoryCopies | None,
    token: bytes | None,
) -> dict[int, LayerState]:
    """Layers ``needed`` as of the memory copies ``plan`` restores (its ``memory_*``): each
    from this instance's own copies where it keeps it, else from its source's copy server."""
    assert plan.memory_epoch is not None and plan.restore_step is not None
    epoch, step = plan.memory_epoch, plan.restore_step
    layers = {}
    for index in needed:
        data = own.get(epoch, step, index) if own is not None else None
        if data is None:
            source = plan.memory_sources.get(index)
            if source is None or source not in plan.memory_addresses:
                raise LiveputError(f"plan {plan.generation} names no memory copy of layer {index}")
            data = fetch_copy(plan.memory_addresses[source], epoch, step, index, token)
            where = f"instance {source}'s memory copy"
        else:
            where = "this instance's memory copy"
        layer = fresh_layer(job, index, device, initialize=False)
        layer.load_state_dict(decode_state(data, token, where))
        layers[index] = layer
    return layers


def send_layers(
    plan: RuntimePlan,
    groups: Groups,
    instance: int,
    layers: dict[int, LayerState],
    token: bytes | None,
) -> tuple[list[dist.Work], list[torch.Tensor]]:
    """Start sending every layer ``plan`` moves from ``instance``: the works, and the buffers to
    keep alive until they complete."""
    sends: list[dist.Work] = []
    buffers: list[torch.Tensor] = []
    for tag, transfer in enumerate(plan.transfers):
        if transfer.source == instance:
            if transfer.layer not in layers:
                raise LiveputError(
                    f"instance {instance} holds no layer {transfer.layer} at step "
                    f"{plan.start_step - 1} (epoch {plan.epoch})"
                )
            data = encode_state(layers[transfer.layer].state_dict(), token)
            works, buffer = groups.isend_bytes(
                data, plan.rank_of(transfer.destination), TRANSFER_TAG + tag
            )
            sends += works
            buffers.append(buffer)
    return sends, buffers


def receive_layers(
    plan: RuntimePlan,
    groups: Groups,
    instance: int,
    job: Job,
    device: torch.device,
    token: bytes | None,
    waiting_on: Callable[[int | None], None] = lambda source: None,
) -> dict[int, LayerState]:
    """Every layer ``plan`` moves to ``instance``, all bytes first (module docstring);
    ``waiting_on(source)`` is told which instance it waits for (None once it waits no more)."""
    arrived: list[tuple[int, int, bytes]] = []
    for tag, transfer in enumerate(plan.transfers):
        if transfer.destination == instance:
            waiting_on(transfer.source)
            data = groups.recv_bytes(plan.rank_of(transfer.source), TRANSFER_TAG + tag)
            arrived.append((transfer.layer, transfer.source, data))
    waiting_on(None)
    received = {}
    for index, source, data in arrived:
        layer = fresh_layer(job, index, device, initialize=False)
        layer.load_state_dict(decode_state(data, token, f"instance {source}"))
        received[index] = layer
    return received
