"""Training options: the schedule, global-norm clipping, activation checkpointing, the loss
scaler's state on the wire, and their one-line errors."""

from __future__ import annotations

import copy
import dataclasses
import math
import threading

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from liveput.errors import LiveputError
from liveput.models.jobs import resolve_job
from liveput.models.training import LRSchedule, TrainingConfig
from liveput.runtime.comm import Groups
from liveput.runtime.layer_state import decode_state, encode_state, fresh_layer
from liveput.runtime.optimizer_step import OptimizerStep
from liveput.runtime.schedule import StagePosition, compute_gradients

JOB = "tiny-gpt-small"
WHOLE = StagePosition(0, 0, 1, 1, None, None)


def job_with(**training) -> object:
    return dataclasses.replace(resolve_job(JOB), training=TrainingConfig(**training))


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(["constant", "linear", "cosine"]),
    warmup=st.integers(0, 20),
    total=st.integers(1, 200),
    min_ratio=st.floats(0, 1),
    step=st.integers(0, 300),
)
def test_schedule_factor_against_its_definition(kind, warmup, total, min_ratio, step):
    schedule = LRSchedule(kind, warmup, total, min_ratio)
    if step < warmup:
        want = (step + 1) / warmup
    elif kind == "constant":
        want = 1.0
    else:
        progress = min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)
        shape = 1 - progress if kind == "linear" else (1 + math.cos(math.pi * progress)) / 2
        want = min_ratio + (1 - min_ratio) * shape
    assert schedule.factor(step) == pytest.approx(want, abs=1e-12)
    assert 0.0 <= schedule.factor(step) <= 1.0 + 1e-12


def test_schedule_parse_and_one_line_errors():
    assert LRSchedule.parse("cosine:warmup=20,min=0.1", total_steps=300) == LRSchedule(
        "cosine", 20, 300, 0.1
    )
    assert LRSchedule.parse("linear:steps=50") == LRSchedule("linear", 0, 50, 0.0)
    assert LRSchedule.parse("constant") == LRSchedule()
    for text, message in (
        ("step", "unknown kind 'step'"),
        ("cosine", "needs total_steps"),
        ("cosine:warm=3", "got 'warm=3'"),
        ("linear:warmup=x,steps=9", "integers"),
        ("linear:min=2,steps=9", "min ratio"),
    ):
        with pytest.raises(LiveputError, match=message) as caught:
            LRSchedule.parse(text)
        assert "\n" not in str(caught.value)
    for bad, message in (
        ({"precision": "fp8"}, "unknown precision 'fp8'"),
        ({"clip_grad_norm": 0.0}, "clip_grad_norm"),
        ({"clip_grad_norm": float("nan")}, "clip_grad_norm"),
        ({"initial_loss_scale": 0.5}, "initial_loss_scale"),
    ):
        with pytest.raises(LiveputError, match=message):
            TrainingConfig(**bad)
    with pytest.raises(LiveputError, match="Job.training"):
        dataclasses.replace(resolve_job(JOB), training={"precision": "bf16"})


@pytest.mark.process
@pytest.mark.parametrize("max_norm", [0.05, 1.0, 100.0])
def test_global_norm_clip_equals_clip_grad_norm_on_the_unsplit_model(max_norm):
    """Stages that each hold part of the layers, summing their squared norms, clip as
    ``torch.nn.utils.clip_grad_norm_`` does on the whole model."""
    job = job_with(clip_grad_norm=max_norm)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    compute_gradients(job, layers, WHOLE, None, step=0)
    model = nn.Sequential(*[copy.deepcopy(layer.module) for layer in layers])
    for mine, theirs in zip(
        [p for layer in layers for p in layer.module.parameters()], model.parameters(), strict=True
    ):
        theirs.grad = mine.grad.clone()
    want_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    # Two stages, each with its part of the layers, sum their squared norms over a real gloo
    # pipeline group (two threads of this process).
    store = dist.HashStore()
    parts = (layers[:2], layers[2:])
    decisions = {}

    def stage(rank: int) -> None:
        groups = Groups.build(
            store, 0, rank, 2, None, torch.device("cpu"), 20.0, pipeline_ranks=[0, 1]
        )
        try:
            decisions[rank] = OptimizerStep(job.training).decide(
                parts[rank], job.num_layers, groups
            )
        finally:
            groups.close()

    threads = [threading.Thread(target=stage, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    decision = decisions[0]
    assert decisions[1] == decision  # every stage decides the same, to the bit
    assert decision.grad_norm == pytest.approx(want_norm, rel=1e-5)
    assert decision.clip_coefficient == pytest.approx(
        min(1.0, max_norm / (want_norm + 1e-6)), rel=1e-5
    )
    assert (decision.clip_coefficient < 1.0) == (max_norm < want_norm)
    update = OptimizerStep(job.training)
    update.apply(layers, 0, decision)  # applied to every layer, as each stage does to its own
    reference = [p.detach().clone() for p in model.parameters()]
    optimizer = job.optimizer(list(model.parameters()))
    optimizer.step()
    for mine, theirs in zip(
        [p for layer in layers for p in layer.module.parameters()], model.parameters(), strict=True
    ):
        assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(reference, model.parameters()))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activation_checkpointing_gives_the_same_gradients(precision):
    grads = {}
    for checkpointing in (False, True):
        job = job_with(precision=precision, activation_checkpointing=checkpointing)
        layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
        loss = compute_gradients(job, layers, WHOLE, None, step=3)
        grads[checkpointing] = (
            loss,
            [p.grad.clone() for layer in layers for p in layer.module.parameters()],
        )
    assert grads[True][0] == pytest.approx(grads[False][0], rel=1e-6)
    for plain, recomputed in zip(grads[False][1], grads[True][1], strict=True):
        assert torch.allclose(plain, recomputed, rtol=1e-5, atol=1e-8)


def test_activation_checkpointing_keeps_less_for_the_backward():
    """Per layer, only the input is saved: bytes held by autograd after the forward drop."""
    job = job_with()
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    inputs = job.micro_batch(0, 0)[0]

    def saved_bytes(checkpointing: bool) -> int:
        held: list[int] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            held.append(tensor.numel() * tensor.element_size())
            return tensor

        from liveput.runtime.schedule import _forward, _Tracker

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _forward(layers, inputs, _Tracker(0), checkpointing)
        return sum(held)

    assert saved_bytes(True) < saved_bytes(False) / 3


def test_fp16_scaler_skips_an_overflow_everywhere_and_its_state_travels():
    job = job_with(precision="fp16", initial_loss_scale=2.0**24, loss_scale_growth_interval=2)
    layers = [fresh_layer(job, i, torch.device("cpu")) for i in range(job.num_layers)]
    update = OptimizerStep(job.training)
    before = [p.detach().clone() for layer in layers for p in layer.module.parameters()]
    compute_gradients(job, layers, WHOLE, None, 0, update.loss_scale)
    decision = update.decide(layers, job.num_layers)
    assert decision.skip and not math.isfinite(decision.grad_norm)
    update.apply(layers, 0, decision)
    after = [p for layer in layers for p in layer.module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # nothing applied
    assert update.loss_scale == 2.0**23
    for step in range(1, 4):
        compute_gradients(job, layers, WHOLE, None, step, update.loss_scale)
        update.apply(layers, step, update.decide(layers, job.num_layers))
    assert update.state_dict() != OptimizerStep(job.training).state_dict()
    # A layer sent to another instance carries the scaler; the receiver resumes with it.
    state = decode_state(encode_state(layers[1].state_dict(), b"t"), b"t")
    received = fresh_layer(job, 1, torch.device("cpu"))
    received.load_state_dict(state)
    other = OptimizerStep(job.training)
    assert other.loss_scale == 2.0**24
    other.adopt([received])
    assert other.state_dict() == update.state_dict()
    other.adopt([fresh_layer(job, 2, torch.device("cpu"))])  # fresh layers: the initial scale
    assert other.loss_scale == 2.0**24


def test_training_config_round_trips_through_json():
    config = TrainingConfig(
        precision="bf16",
        clip_grad_norm=1.5,
        lr_schedule=LRSchedule("cosine", 5, 100, 0.1),
        activation_checkpointing=True,
    )
    import json

    assert TrainingConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


class _AbortedOnEnqueue:
    """A process group that refuses to enqueue once aborted, as NCCL's does (gloo enqueues and
    fails in ``wait``)."""

    def __init__(self, groups_box: list) -> None:
        self.groups_box = groups_box
        self.enqueued = 0
        self.abort_while_enqueuing = False

    def allreduce(self, tensors):
        groups = self.groups_box[0]
        if self.abort_while_enqueuing:  # another thread aborts the groups meanwhile
            groups.aborted.set()
        if groups.aborted.is_set():
            raise RuntimeError("NCCL communicator was aborted on rank 0.")
        self.enqueued += 1
        raise RuntimeError("a real failure, not the abort")

    def abort(self) -> None:
        pass


def test_an_operation_enqueued_on_aborted_groups_raises_comm_aborted_and_other_errors_stay():
    from liveput.runtime.comm import CommAborted

    box: list = []
    world = _AbortedOnEnqueue(box)
    groups = Groups(world, 0, None, torch.device("cpu"), timeout_s=0.1)  # type: ignore[arg-type]
    box.append(groups)
    with pytest.raises(RuntimeError, match="a real failure"):
        groups.barrier()
    assert world.enqueued == 1
    world.abort_while_enqueuing = True
    with pytest.raises(CommAborted):
        groups.barrier()
    assert world.enqueued == 1
    groups.aborted.set()  # as abort() does, without parking a helper thread
    with pytest.raises(CommAborted):
        groups.barrier()
    with pytest.raises(CommAborted):
        groups.issue(lambda: world.allreduce([torch.zeros(1)]))
    assert world.enqueued == 1
