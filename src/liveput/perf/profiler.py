"""Measure a real PyTorch model, layer by layer, on the local device (CPU, or CUDA when present).

A model to profile is a sequence of layers (each maps one tensor to one tensor) with a way to make
an input batch and a loss: :class:`ProfileTarget`. Built-in: ``tiny-gpt`` and every built-in
job (``gpt2-small``, ``llama-tiny``, ``resnet50``, ...); a user's model is ``module:function``
returning a :class:`liveput.Job` (profiled on batches of its own dataset) or a
``ProfileTarget``. For each layer we time ``repeats`` passes of
forwards and backwards of a few micro-batches in flight, as a pipeline stage runs them (after a
warm-up), and one Adam step over its parameters, and record its parameters and output activation
size, and the bytes its forward keeps for the backward.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.adam import adam

from liveput.errors import LiveputError
from liveput.perf.types import InstanceType, LayerProfile, ModelProfile

if TYPE_CHECKING:
    from liveput.models.job import Job

_AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each precision the profiler measures in."""


def local_cpu_instance() -> InstanceType:
    """This machine as an instance type: its RAM as the device memory; loopback links, which
    measured 9-20 Gb/s for gloo here, priced as the 10 Gb/s of the cloud types."""
    ram_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return InstanceType(
        "local-cpu",
        gpu_memory_gb=round(ram_gb, 1),
        network_gbps=10.0,
        spot_price_usd_per_hour=0.0,
        on_demand_price_usd_per_hour=0.0,
    )


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
    micro_batch_size: int | None = None
    """Samples per micro-batch the model trains with (None: the caller chooses)."""


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


def job_target(job: Job) -> ProfileTarget:
    """What to profile of a training job: its layers (copies), batches and loss."""

    def make_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [job.dataset[i] for i in range(size)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    return ProfileTarget(
        job.name,
        [copy.deepcopy(layer) for layer in job.layers],
        make_batch,
        job.loss_fn,
        job.global_batch_size,
        job.micro_batch_size,
    )


def resolve_target(spec: str) -> ProfileTarget:
    """A built-in name (a target, else a built-in job) or ``module:function`` returning a
    :class:`liveput.Job` (or a :class:`ProfileTarget`), checked on one micro-batch on the CPU
    (:mod:`liveput.models.validate`): a model mistake is one line, before any measurement."""
    from liveput.models.job import Job
    from liveput.models.jobs import JOBS, resolve_job
    from liveput.models.reference import is_reference, load_reference
    from liveput.models.validate import PROBE_SAMPLES, check_job, check_layers

    if spec in TARGETS:
        return TARGETS[spec]()
    if not (spec in JOBS or is_reference(spec)):
        raise LiveputError(
            f"unknown model {spec!r}: give a built-in ({', '.join(sorted({*TARGETS, *JOBS}))}) "
            "or module:function returning a liveput.Job"
        )
    if spec in JOBS:
        made: Job | ProfileTarget = resolve_job(spec)
    else:
        made = load_reference(spec, (Job, ProfileTarget), "model")
    if isinstance(made, Job):
        check_job(made)
        return job_target(made)
    check_layers(made.layers, *made.make_batch(PROBE_SAMPLES), made.loss_fn, spec)
    return made


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def saved_for_backward_bytes(
    layer: nn.Module,
    source: torch.Tensor,
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Bytes that one forward of ``layer`` (and ``loss`` on its output) keeps for the backward:
    the distinct storages autograd saves, parameters excluded. Measured the same way on every
    device (the CPU allocator keeps no statistics)."""
    parameters = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = layer(source)
        if loss is not None:
            loss(output)
    return int(sum(storages.values()))


def _torch_device(
    micro_batch_size: int, device: str, repeats: int, in_flight: int, precision: str
) -> torch.device:
    """The device to measure on, once the options are checked."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if micro_batch_size < 1 or repeats < 1 or in_flight < 1:
        raise LiveputError("profile: micro-batch, repeats and in-flight must be >= 1")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise LiveputError(f"profile: --device {device!r}: expected cpu, cuda, cuda:K or auto")
    torch_device = torch.device(device)
    if torch_device.type == "cuda" and not torch.cuda.is_available():
        raise LiveputError("profile: --device cuda requested but no CUDA device is available")
    if precision not in _AUTOCAST_DTYPES:
        raise LiveputError(
            f"profile: precision {precision!r}: expected {', '.join(_AUTOCAST_DTYPES)}"
        )
    return torch_device


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context the forwards run in: autocast to ``precision``'s dtype, or nothing."""
    dtype = _AUTOCAST_DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _clock(device: torch.device) -> Callable[[], float]:
    """The clock a layer is timed on. On the CPU, the thread's CPU time: the layer runs on this
    one thread (``_agents_threads``), so that is what it costs a core of its own, however many
    other processes share the machine (its wall time grows with them). On a GPU, wall time,
    around synchronizations."""
    return time.thread_time if device.type == "cpu" else time.perf_counter


@contextlib.contextmanager
def _agents_threads(device: torch.device) -> Iterator[None]:
    """On the CPU, one intra-op thread for the measurement, as every agent trains
    (``runtime.launch``). Timed with more threads, a layer measured as it would not run, and a
    machine shared with other processes slowed those threads' joint operations 10 to 30 times
    (tiny-gpt-small beside three busy processes), where one thread slowed by the load alone."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Timing:
    """One layer's medians per micro-batch, and its outputs of the last pass."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    outputs: list[torch.Tensor]


class _AdamStep:
    """What ``torch.optim.Adam(parameters, lr).step()`` then ``zero_grad(set_to_none=True)``
    do, through the functional form that ``Adam.step`` itself calls, with its defaults and its
    state (so the same kernels on the same tensors). Building a ``torch.optim.Adam`` imports
    ``torch._dynamo`` (its methods are wrapped to be left out of compilation): about 1 CPU-s
    in every process that profiles, where nothing else a coordinator does needs it."""

    def __init__(self, parameters: list[nn.Parameter], lr: float) -> None:
        self.parameters = parameters
        self.lr = lr
        self.exp_avgs = [
            torch.zeros_like(p, memory_format=torch.preserve_format) for p in parameters
        ]
        self.exp_avg_sqs = [
            torch.zeros_like(p, memory_format=torch.preserve_format) for p in parameters
        ]
        self.steps = [torch.tensor(0.0, dtype=torch.get_default_dtype()) for _ in parameters]

    def step(self) -> None:
        held = [i for i, p in enumerate(self.parameters) if p.grad is not None]
        with torch.no_grad():
            adam(
                [self.parameters[i] for i in held],
                [self.parameters[i].grad for i in held],  # type: ignore[misc]
                [self.exp_avgs[i] for i in held],
                [self.exp_avg_sqs[i] for i in held],
                [],
                [self.steps[i] for i in held],
                has_complex=any(torch.is_complex(self.parameters[i]) for i in held),
                amsgrad=False,
                beta1=0.9,
                beta2=0.999,
                lr=self.lr,
                weight_decay=0.0,
                eps=1e-8,
                maximize=False,
            )
        for parameter in self.parameters:
            parameter.grad = None


def _time_layer(
    layer: nn.Module, sources: list[torch.Tensor], repeats: int, precision: str
) -> _Timing:
    """``repeats`` passes (after a warm-up) of the forwards of every source, then their
    backwards, then one Adam step, as a pipeline stage runs them."""
    device = sources[0].device
    in_flight = len(sources)
    parameters = list(layer.parameters())
    optimizer = _AdamStep(parameters, lr=1e-4) if parameters else None
    clock = _clock(device)
    forwards, backwards, steps = [], [], []
    outputs: list[torch.Tensor] = []
    for attempt in range(repeats + 1):
        _sync(device)
        start = clock()
        with _autocast(precision, device):
            outputs = [layer(source) for source in sources]
        _sync(device)
        middle = clock()
        for output in outputs:
            # The mean's gradient is ones / numel, bit for bit, a gradient of the output's
            # size as a stage gets one; given explicitly, torch's check of its shape imports
            # sympy (0.2-0.5 CPU-s in every process that profiles), which a scalar's skips.
            # A complex scalar has no implicit gradient: that output still gets it given.
            if output.is_complex():
                output.backward(torch.ones_like(output) / output.numel())
            else:
                output.mean().backward()
        _sync(device)
        end = clock()
        step_s = 0.0
        if optimizer is not None:
            before = clock()
            optimizer.step()
            _sync(device)
            step_s = clock() - before
        if attempt:  # the first pass is a warm-up
            forwards.append((middle - start) / in_flight)
            backwards.append((end - middle) / in_flight)
            steps.append(step_s)
    return _Timing(
        statistics.median(forwards),
        statistics.median(backwards),
        statistics.median(steps),
        outputs,
    )


def _loss_forward_s(
    layer: nn.Module,
    source: torch.Tensor,
    loss: Callable[[torch.Tensor], torch.Tensor],
    precision: str,
) -> float:
    """What the loss adds to the last layer's forward (it is part of its forward and backward)."""
    clock = _clock(source.device)
    start = clock()
    with _autocast(precision, source.device):
        last_loss = loss(layer(source))
    last_loss.backward()
    _sync(source.device)
    return (clock() - start) / 3


def _measured_instance(device: torch.device) -> InstanceType:
    """The instance type a profile measured on ``device`` describes."""
    if device.type != "cuda":
        return local_cpu_instance()
    properties = torch.cuda.get_device_properties(device)
    return InstanceType(f"local-{properties.name}", properties.total_memory / 1e9, 10.0, 0.0, 0.0)


def _profile_layer(
    index: int,
    layer: nn.Module,
    activations: list[torch.Tensor],
    loss: Callable[[torch.Tensor], torch.Tensor] | None,
    repeats: int,
    precision: str,
) -> tuple[LayerProfile, list[torch.Tensor]]:
    """Layer ``index`` measured on ``activations`` (``loss``: the last layer's); its profile
    and its outputs, the next layer's inputs."""
    sources = [activation.detach() for activation in activations]
    for source in sources:
        if source.is_floating_point():
            source.requires_grad_(True)
    timing = _time_layer(layer, sources, repeats, precision)
    forward_s = timing.forward_s
    if loss is not None:
        forward_s += _loss_forward_s(layer, sources[0], loss, precision)
    output = timing.outputs[0]
    with _autocast(precision, sources[0].device):
        memory = saved_for_backward_bytes(layer, sources[0], loss)
    profile = LayerProfile(
        name=f"{type(layer).__name__.lower()}.{index}",
        forward_s=forward_s,
        backward_s=timing.backward_s,
        optimizer_s=timing.optimizer_s,
        num_params=sum(p.numel() for p in layer.parameters()),
        activation_bytes=output.numel() * output.element_size(),
        activation_memory_bytes=int(memory),
    )
    return profile, [output.detach() for output in timing.outputs]


def profile_model(
    target: ProfileTarget,
    micro_batch_size: int = 8,
    device: str = "cpu",
    repeats: int = 5,
    in_flight: int = 4,
    on_layer: Callable[[int, int], None] | None = None,
    precision: str = "fp32",
) -> ModelProfile:
    """Measure every layer of ``target`` per micro-batch on ``device``.

    Each timed pass runs the layer the way a pipeline stage does: the forwards of ``in_flight``
    distinct micro-batches, then their backwards, each micro-batch's output kept until its
    backward. A layer's figure is the median over ``repeats`` passes (after a warm-up) divided
    by ``in_flight``: timing one cached input over and over measured up to 20% faster than the
    runtime computes, and single slow passes (a shared machine) must not move the profile. On
    the CPU the layers run on one thread, as each agent trains, timed by that thread's CPU time,
    so a machine busy with other work measures what a core of its own would.
    ``device`` is ``cpu``, ``cuda[:k]`` or ``auto`` (CUDA when present); ``precision`` ``fp32``,
    ``bf16`` or ``fp16`` (forwards under ``torch.autocast``, as the engine trains);
    ``on_layer(done, total)`` reports progress.
    """
    torch_device = _torch_device(micro_batch_size, device, repeats, in_flight, precision)
    inputs, targets = target.make_batch(micro_batch_size * in_flight)
    activations = [part.to(torch_device) for part in inputs.split(micro_batch_size)]
    micro_targets = targets[:micro_batch_size].to(torch_device)

    def loss(y: torch.Tensor) -> torch.Tensor:
        return target.loss_fn(y, micro_targets)

    layers_out: list[LayerProfile] = []
    last = len(target.layers) - 1
    with _agents_threads(torch_device):
        for index, layer in enumerate(target.layers):
            measured, activations = _profile_layer(
                index,
                layer.to(torch_device),
                activations,
                loss if index == last else None,
                repeats,
                precision,
            )
            layers_out.append(measured)
            if on_layer is not None:
                on_layer(index + 1, len(target.layers))
    return ModelProfile(
        model=target.name,
        instance_type=_measured_instance(torch_device),
        layers=tuple(layers_out),
        global_batch_size=max(target.global_batch_size, micro_batch_size),
        micro_batch_size=micro_batch_size,
        state_bytes_per_param=16,
    )


@lru_cache(maxsize=4)
def local_profile(name: str) -> ModelProfile:
    """Built-in model ``name`` measured on this machine at its micro-batch (8 where it has
    none), cached for the process."""
    target = resolve_target(name)
    return profile_model(target, micro_batch_size=target.micro_batch_size or 8, repeats=3)


def tiny_gpt_profile() -> ModelProfile:
    """tiny-gpt measured on this machine (cached for the process)."""
    return local_profile("tiny-gpt")
