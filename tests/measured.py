"""Profiles measured on this machine, once per test process and only when a test asks.

Measuring at import time made every pytest worker pay for it while collecting, whichever tests it
then ran.
"""

from __future__ import annotations

import functools

from liveput.models.jobs import resolve_job
from liveput.perf.types import ModelProfile
from liveput.runtime.planning import profile_job


@functools.cache
def tiny_gpt_profile() -> ModelProfile:
    """tiny-gpt's layers, timed once (one repeat: the tests need its shape, not a precise rate)."""
    return profile_job(resolve_job("tiny-gpt"), repeats=1)


@functools.cache
def gpt2_small_profile() -> ModelProfile:
    """gpt2-small (86 M parameters) as the memory model sees it, without timing it: each layer's
    parameters, output bytes and the bytes its forward keeps for the backward, measured on one
    micro-batch (the same figures whatever the machine's load), and times in proportion to the
    parameters, as a quiet machine measures its identical blocks. Timed on a busy machine, the
    compute cut, and with it each stage's memory, moves from run to run."""
    import torch

    from liveput.perf.profiler import job_target, saved_for_backward_bytes
    from liveput.perf.types import InstanceType, LayerProfile

    job = resolve_job("gpt2-small")
    target = job_target(job)
    inputs, targets = target.make_batch(job.micro_batch_size)
    layers = []
    x = inputs
    last = len(target.layers) - 1
    with torch.no_grad():
        outputs = []
        for layer in target.layers:
            x = layer(x)
            outputs.append(x)
    source = inputs
    for index, layer in enumerate(target.layers):
        if source.is_floating_point():
            source = source.detach().requires_grad_(True)
        loss = (lambda y: target.loss_fn(y, targets)) if index == last else None
        memory = saved_for_backward_bytes(layer, source, loss)
        params = sum(p.numel() for p in layer.parameters())
        output = outputs[index]
        layers.append(
            LayerProfile(
                name=f"{type(layer).__name__.lower()}.{index}",
                forward_s=1e-9 * params,
                backward_s=2e-9 * params,
                optimizer_s=1e-10 * params,
                num_params=params,
                activation_bytes=output.numel() * output.element_size(),
                activation_memory_bytes=memory,
            )
        )
        source = output
    return ModelProfile(
        model="gpt2-small",
        instance_type=InstanceType("test-cpu", 16.0, 10.0, 0.0, 0.0),
        layers=tuple(layers),
        global_batch_size=job.global_batch_size,
        micro_batch_size=job.micro_batch_size,
        state_bytes_per_param=16,
        activation_checkpointing="none",
    )
