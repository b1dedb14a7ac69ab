"""Measure a real PyTorch model, layer by layer, on the local device (CPU, or CUDA when present).

A model to profile is a sequence of layers (each maps one tensor to one tensor) with a way to make
an input batch and a loss: :class:`ProfileTarget`. Built-in: ``tiny-gpt``; a user's model is
``module:function`` returning a ``ProfileTarget``. For each layer we time ``repeats`` forward and
backward passes of one micro-batch (after a warm-up) and one Adam step over its parameters, and
record its parameters and output activation size; on CUDA, peak memory too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.perf.types import InstanceType, LayerProfile, ModelProfile
from liveput.registry import call_spec

LOCAL_CPU = InstanceType("local-cpu", gpu_memory_gb=8.0, network_gbps=10.0,
                         spot_price_usd_per_hour=0.0, on_demand_price_usd_per_hour=0.0)


@dataclass(frozen=True)
class ProfileTarget:
    """A model given as layers, with its input and loss."""

    name: str
    """Model name written in the profile."""
    layers: list[nn.Module]
    """The layers in order."""
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]
    """``make_batch(n)`` -> (inputs, targets) of n samples."""
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """Loss of the last layer's output against the targets."""
    global_batch_size: int = 32
    """Samples per training iteration."""


def tiny_gpt_target() -> ProfileTarget:
    from liveput.models.corpus import ByteWindows, load_stdlib_corpus
    from liveput.models.tiny_gpt import TinyGPTConfig, build_tiny_gpt, language_model_loss

    config = TinyGPTConfig()
    dataset = ByteWindows(load_stdlib_corpus(200_000), config.seq_len)

    def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [dataset[i] for i in range(size)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    return ProfileTarget("tiny-gpt", build_tiny_gpt(config), make_batch, language_model_loss)


TARGETS: dict[str, Callable[[], ProfileTarget]] = {"tiny-gpt": tiny_gpt_target}


def resolve_target(spec: str) -> ProfileTarget:
    """A built-in name or ``module:function``."""
    if spec in TARGETS:
        return TARGETS[spec]()
    return call_spec(spec, ProfileTarget, "model", TARGETS)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_model(
    target: ProfileTarget, micro_batch_size: int = 8, device: str = "cpu", repeats: int = 5
) -> ModelProfile:
    """Measure every layer of ``target`` for one micro-batch on ``device``."""
    if micro_batch_size < 1 or repeats < 1:
        raise LiveputError("profile: micro-batch and repeats must be >= 1")
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise LiveputError("profile: --device cuda requested but no CUDA device is available")
    inputs, targets = target.make_batch(micro_batch_size)
    activation = inputs.to(torch_device)
    layers_out: list[LayerProfile] = []
    for index, layer in enumerate(target.layers):
        layer = layer.to(torch_device)
        optimizer = torch.optim.Adam(layer.parameters(), lr=1e-4) if any(
            True for _ in layer.parameters()) else None
        source = activation.detach()
        if source.is_floating_point():
            source.requires_grad_(True)
        if torch_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(torch_device)
        forward_s = backward_s = optimizer_s = 0.0
        for attempt in range(repeats + 1):
            _sync(torch_device)
            start = time.perf_counter()
            output = layer(source)
            _sync(torch_device)
            middle = time.perf_counter()
            output.backward(torch.ones_like(output) / output.numel())
            _sync(torch_device)
            end = time.perf_counter()
            step_s = 0.0
            if optimizer is not None:
                before = time.perf_counter()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                _sync(torch_device)
                step_s = time.perf_counter() - before
            if attempt:  # the first pass is a warm-up
                forward_s += (middle - start) / repeats
                backward_s += (end - middle) / repeats
                optimizer_s += step_s / repeats
        if index == len(target.layers) - 1:
            # The loss is part of the last layer's forward and backward.
            start = time.perf_counter()
            target.loss_fn(layer(source), targets.to(torch_device)).backward()
            _sync(torch_device)
            forward_s += (time.perf_counter() - start) / 3
        num_params = sum(p.numel() for p in layer.parameters())
        activation_bytes = output.numel() * output.element_size()
        memory = (torch.cuda.max_memory_allocated(torch_device) if torch_device.type == "cuda"
                  else 4 * activation_bytes)  # on CPU: saved tensors are a few outputs' worth
        layers_out.append(LayerProfile(
            name=f"{type(layer).__name__.lower()}.{index}", forward_s=forward_s,
            backward_s=backward_s, optimizer_s=optimizer_s, num_params=num_params,
            activation_bytes=activation_bytes, activation_memory_bytes=int(memory),
        ))
        activation = output.detach()
    instance = LOCAL_CPU
    if torch_device.type == "cuda":
        properties = torch.cuda.get_device_properties(torch_device)
        instance = InstanceType(f"local-{properties.name}", properties.total_memory / 1e9, 10.0,
                                0.0, 0.0)
    return ModelProfile(
        model=target.name, instance_type=instance, layers=tuple(layers_out),
        global_batch_size=max(target.global_batch_size, micro_batch_size),
        micro_batch_size=micro_batch_size, state_bytes_per_param=16,
    )


@lru_cache(maxsize=1)
def tiny_gpt_profile() -> ModelProfile:
    """tiny-gpt measured on this machine (cached for the process)."""
    return profile_model(tiny_gpt_target(), micro_batch_size=8, repeats=3)
