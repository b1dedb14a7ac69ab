"""One training step of one pipeline stage: a 1F1B schedule over the replica's micro-batches.

Stage p (of P) of pipeline d computes the micro-batches ``replica_micro_batches(M, D, d)`` of the
step. It runs ``w = min(P - 1 - p, m)`` forwards first (warm-up), then alternates one forward
(receiving activations from stage p - 1, sending to p + 1) with one backward of its oldest
micro-batch in flight (receiving gradients from p + 1, sending to p - 1), and ends with the
backwards left. A stage so keeps at most ``P - p`` micro-batches' activations, where GPipe (all
forwards, then all backwards) keeps all m; the bubble is the same ``P - 1`` slots. This is the
schedule ``perf.estimator`` models. With P = 1 the replica's samples go through in one batch,
unless a layer normalizes over the batch (BatchNorm): then the micro-batch stays the unit, so that
every (D, P) normalizes over the same samples.

Sends are asynchronous and waited at the end, and every receive waits only on work that an
earlier slot of the schedule produced, so no stage blocks on a send and the schedule cannot
deadlock. The last stage scales each micro-batch's mean loss by ``micro / global`` so that the
sum over all replicas (the stage all-reduce) is the gradient of the mean loss over the global
batch, the same for every (D, P).

Forwards and the loss run under the job's precision (``optimizer_step.autocast``); backwards run
outside autocast, as PyTorch recommends. With activation checkpointing each layer runs under
``torch.utils.checkpoint`` (non-reentrant: it recomputes under the same autocast state).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.utils.checkpoint

from liveput.errors import LiveputError
from liveput.models.job import Job, replica_micro_batches
from liveput.runtime.comm import CommAborted, Groups
from liveput.runtime.layer_state import LayerState
from liveput.runtime.optimizer_step import autocast
from liveput.runtime.protocol import JobFailure


@dataclass(frozen=True)
class StagePosition:
    """Where this instance sits in the running configuration."""

    pipeline: int
    """d: its pipeline."""
    stage: int
    """p: its stage."""
    data_parallel: int
    """D of the configuration."""
    pipeline_stages: int
    """P of the configuration."""
    previous_rank: int | None
    """World rank of stage p - 1 of the same pipeline (None for the first stage)."""
    next_rank: int | None
    """World rank of stage p + 1 of the same pipeline (None for the last stage)."""

    @property
    def is_first(self) -> bool:
        return self.previous_rank is None

    @property
    def is_last(self) -> bool:
        return self.next_rank is None


FORWARD, BACKWARD = "forward", "backward"


def stage_order(num_micro: int, pipeline_stages: int, stage: int) -> list[tuple[str, int]]:
    """The 1F1B slots of one stage: ``(FORWARD | BACKWARD, k)``, k the replica's k-th
    micro-batch; backwards run oldest first."""
    warmup = min(pipeline_stages - 1 - stage, num_micro)
    order: list[tuple[str, int]] = []
    done = 0
    for index in range(num_micro):
        order.append((FORWARD, index))
        if index >= warmup:
            order.append((BACKWARD, done))
            done += 1
    return order + [(BACKWARD, index) for index in range(done, num_micro)]


class _Tracker:
    """Which layer a step is in, to name the one that raises: in forward, the layer called; in
    backward, the layer whose output's gradient was computed last (its own backward runs next)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.in_backward: int | None = None

    def mark(self, index: int) -> None:
        self.in_backward = index

    def failure(self, index: int | None, phase: str, error: Exception) -> JobFailure:
        text = str(error).strip().splitlines()
        where = "the loss" if index is None else f"layer {index}"
        return JobFailure(
            f"{where} raised in {phase} at step {self.step}: "
            f"{type(error).__name__}: {text[0] if text else ''}"[:400]
        )


def _forward(
    layers: list[LayerState], x: torch.Tensor, tracker: _Tracker, checkpointing: bool = False
) -> torch.Tensor:
    for layer in layers:
        try:
            if checkpointing and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(layer.module, x, use_reentrant=False)
            else:
                x = layer.module(x)
        except CommAborted:
            raise
        except Exception as error:  # noqa: BLE001 - the user's code: named, then the job stops
            raise tracker.failure(layer.index, "forward", error) from None
        if x.requires_grad:
            x.register_hook(lambda grad, index=layer.index: tracker.mark(index))
    return x


def _backward(tracker: _Tracker, run: Callable[[], None]) -> None:
    tracker.in_backward = None
    try:
        run()
    except CommAborted:
        raise
    except Exception as error:  # noqa: BLE001 - the user's code: named, then the job stops
        raise tracker.failure(tracker.in_backward, "backward", error) from None


def compute_gradients(
    job: Job,
    layers: list[LayerState],
    position: StagePosition,
    groups: Groups | None,
    step: int,
    loss_scale: float = 1.0,
) -> float:
    """Run forward and backward of this replica's micro-batches; gradients accumulate in the
    layers' ``.grad``, multiplied by ``loss_scale`` (fp16). Returns the replica's part of the
    step's loss, unscaled (last stage; else 0)."""
    device = groups.device if groups is not None else _device_of(layers)
    micro = replica_micro_batches(job.num_micro_batches, position.data_parallel, position.pipeline)
    checkpointing = job.training.activation_checkpointing
    if position.is_first and position.is_last and _one_batch_is_the_same(job, layers):
        return _whole_replica(job, layers, micro, device, step, loss_scale)
    scale = job.micro_batch_size / job.global_batch_size
    tracker = _Tracker(step)
    in_flight: deque[tuple[int, torch.Tensor | None, torch.Tensor]] = deque()
    sends: list[dist.Work] = []
    loss_sum = 0.0

    def forward(j: int) -> None:
        nonlocal loss_sum
        if position.previous_rank is None:
            x = job.micro_batch(step, j)[0].to(device)
            source = None
        else:
            x = _required(groups).recv_tensor(position.previous_rank, 2 * j)
            if x.is_floating_point():
                x.requires_grad_(True)
            source = x
        with autocast(job.training, device):
            y = _forward(layers, x, tracker, checkpointing)
            if position.is_last:
                loss = _loss(job, y, job.micro_batch(step, j)[1].to(device), tracker) * scale
        if position.next_rank is None:
            loss_sum += float(loss.detach())
            in_flight.append((j, source, loss * loss_scale if loss_scale != 1.0 else loss))
        else:
            sends.extend(_required(groups).isend_tensor(y, position.next_rank, 2 * j))
            in_flight.append((j, source, y))

    def backward() -> None:
        j, source, output = in_flight.popleft()
        if position.next_rank is None:
            _backward(tracker, output.backward)
        else:
            gradient = _required(groups).recv_tensor(position.next_rank, 2 * j + 1)
            _backward(tracker, lambda: output.backward(gradient))
        if source is not None and source.grad is not None:
            # A source is the input received from the previous stage, which there is.
            assert position.previous_rank is not None, "a received input has a previous stage"
            sends.extend(
                _required(groups).isend_tensor(source.grad, position.previous_rank, 2 * j + 1)
            )

    for kind, index in stage_order(len(micro), position.pipeline_stages, position.stage):
        if kind == FORWARD:
            forward(micro[index])
        else:
            backward()
    for work in sends:
        _required(groups).wait(work)
    return loss_sum


def _device_of(layers: list[LayerState]) -> torch.device:
    """Where the layers live (a lone instance has no groups to say it): the device of their
    first parameter or buffer, else the CPU."""
    for layer in layers:
        for tensor in (*layer.module.parameters(), *layer.module.buffers()):
            return tensor.device
    return torch.device("cpu")


def _required(groups: Groups | None) -> Groups:
    """The process groups, which a stage that talks to another stage has (a plan of more than one
    instance builds them)."""
    if groups is None:
        raise LiveputError("a pipeline stage talks to another stage but has no process groups")
    return groups


def _one_batch_is_the_same(job: Job, layers: list[LayerState]) -> bool:
    return job.training.precision == "fp32" and not any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
        for layer in layers
        for m in layer.module.modules()
    )


def _whole_replica(
    job: Job,
    layers: list[LayerState],
    micro: range,
    device: torch.device,
    step: int,
    loss_scale: float = 1.0,
) -> float:
    """Without a pipeline (P = 1) micro-batches buy nothing in fp32: the replica's samples go
    through in one batch (the same mean loss, up to fp32 rounding). Not when the batch's
    statistics enter the computation (BatchNorm), nor under bf16 or fp16 (a weight gradient
    summed over a batch in 16 bits rounds, and in fp16 overflows, differently from one summed
    per micro-batch): then P = 1 runs its micro-batches one by one as a pipeline stage does
    (:func:`_one_batch_is_the_same`), and every (D, P) computes the same thing."""
    batches = [job.micro_batch(step, j) for j in micro]
    inputs = torch.cat([b[0] for b in batches]).to(device)
    targets = torch.cat([b[1] for b in batches]).to(device)
    tracker = _Tracker(step)
    with autocast(job.training, device):
        loss = _loss(
            job,
            _forward(layers, inputs, tracker, job.training.activation_checkpointing),
            targets,
            tracker,
        ) * (len(inputs) / job.global_batch_size)
    _backward(tracker, (loss * loss_scale if loss_scale != 1.0 else loss).backward)
    return float(loss.detach())


def _loss(
    job: Job, outputs: torch.Tensor, targets: torch.Tensor, tracker: _Tracker
) -> torch.Tensor:
    try:
        return job.loss_fn(outputs, targets)
    except Exception as error:  # noqa: BLE001 - the user's code: named, then the job stops
        raise tracker.failure(None, "forward", error) from None


def flat_gradients(layers: list[LayerState], extra: float) -> tuple[torch.Tensor, list]:
    """All gradients of the stage in one buffer (plus ``extra`` as the last element)."""
    parameters = [p for layer in layers for p in layer.module.parameters()]
    pieces = [
        p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
        for p in parameters
    ]
    device = parameters[0].device if parameters else torch.device("cpu")
    pieces.append(torch.tensor([extra], dtype=torch.float32, device=device))
    return torch.cat([piece.float() for piece in pieces]), parameters


def unflatten_gradients(flat: torch.Tensor, parameters: list) -> float:
    """Write the reduced gradients back; returns the reduced ``extra``."""
    offset = 0
    for parameter in parameters:
        count = parameter.numel()
        parameter.grad = flat[offset : offset + count].view_as(parameter).to(parameter.dtype)
        offset += count
    return float(flat[offset])


def apply_step(layers: list[LayerState]) -> None:
    """A plain update (fp32, no clipping, no schedule); :class:`OptimizerStep` does the rest."""
    for layer in layers:
        if layer.optimizer is not None:
            layer.optimizer.step()
            layer.optimizer.zero_grad(set_to_none=True)


def discard_gradients(layers: list[LayerState]) -> None:
    for layer in layers:
        for parameter in layer.module.parameters():
            parameter.grad = None
