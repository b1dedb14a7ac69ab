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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from liveput.runtime.comm import Groups
from liveput.runtime.job import Job, replica_micro_batches
from liveput.runtime.layer_state import LayerState


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


def _forward(layers: list[LayerState], x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        x = layer.module(x)
    return x


def compute_gradients(job: Job, layers: list[LayerState], position: StagePosition,
                      groups: Groups | None, step: int) -> float:
    """Run forward and backward of this replica's micro-batches; gradients accumulate in the
    layers' ``.grad``. Returns the replica's part of the step's loss (last stage; else 0)."""
    device = groups.device if groups is not None else torch.device("cpu")
    micro = replica_micro_batches(job.num_micro_batches, position.data_parallel, position.pipeline)
    if position.is_first and position.is_last:
        return _whole_replica(job, layers, micro, device, step)
    scale = job.micro_batch_size / job.global_batch_size
    in_flight: deque[tuple[int, torch.Tensor | None, torch.Tensor]] = deque()
    sends = []
    loss_sum = 0.0

    def forward(j: int) -> None:
        nonlocal loss_sum
        if position.is_first:
            x = job.micro_batch(step, j)[0].to(device)
            source = None
        else:
            x = groups.recv_tensor(position.previous_rank, 2 * j)
            if x.is_floating_point():
                x.requires_grad_(True)
            source = x
        y = _forward(layers, x)
        if position.is_last:
            loss = job.loss_fn(y, job.micro_batch(step, j)[1].to(device)) * scale
            loss_sum += float(loss.detach())
            in_flight.append((j, source, loss))
        else:
            sends.extend(groups.isend_tensor(y, position.next_rank, 2 * j))
            in_flight.append((j, source, y))

    def backward() -> None:
        j, source, output = in_flight.popleft()
        if position.is_last:
            output.backward()
        else:
            output.backward(groups.recv_tensor(position.next_rank, 2 * j + 1))
        if source is not None and source.grad is not None:
            sends.extend(groups.isend_tensor(source.grad, position.previous_rank, 2 * j + 1))

    for kind, index in stage_order(len(micro), position.pipeline_stages, position.stage):
        if kind == FORWARD:
            forward(micro[index])
        else:
            backward()
    for work in sends:
        work.wait()
    return loss_sum


def _whole_replica(job: Job, layers: list[LayerState], micro: range, device: torch.device,
                   step: int) -> float:
    """Without a pipeline (P = 1) micro-batches buy nothing: the replica's samples go through in
    one batch (the same mean loss, up to floating-point rounding), unless the batch's statistics
    enter the computation (BatchNorm): then one micro-batch at a time, as a pipeline runs them."""
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
           for layer in layers for m in layer.module.modules()):
        loss_sum = 0.0
        for j in micro:
            inputs, targets = job.micro_batch(step, j)
            loss = job.loss_fn(_forward(layers, inputs.to(device)), targets.to(device))
            loss = loss * (len(inputs) / job.global_batch_size)
            loss.backward()
            loss_sum += float(loss.detach())
        return loss_sum
    batches = [job.micro_batch(step, j) for j in micro]
    inputs = torch.cat([b[0] for b in batches]).to(device)
    targets = torch.cat([b[1] for b in batches]).to(device)
    loss = job.loss_fn(_forward(layers, inputs), targets) * (len(inputs) / job.global_batch_size)
    loss.backward()
    return float(loss.detach())


def flat_gradients(layers: list[LayerState], extra: float) -> tuple[torch.Tensor, list]:
    """All gradients of the stage in one buffer (plus ``extra`` as the last element)."""
    parameters = [p for layer in layers for p in layer.module.parameters()]
    pieces = [p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
              for p in parameters]
    device = parameters[0].device if parameters else torch.device("cpu")
    pieces.append(torch.tensor([extra], dtype=torch.float32, device=device))
    return torch.cat([piece.float() for piece in pieces]), parameters


def unflatten_gradients(flat: torch.Tensor, parameters: list) -> float:
    """Write the reduced gradients back; returns the reduced ``extra``."""
    offset = 0
    for parameter in parameters:
        count = parameter.numel()
        parameter.grad = flat[offset:offset + count].view_as(parameter).to(parameter.dtype)
        offset += count
    return float(flat[offset])


def apply_step(layers: list[LayerState]) -> None:
    for layer in layers:
        if layer.optimizer is not None:
            layer.optimizer.step()
            layer.optimizer.zero_grad(set_to_none=True)


def discard_gradients(layers: list[LayerState]) -> None:
    for layer in layers:
        for parameter in layer.module.parameters():
            parameter.grad = None
