"""Built-in model profiles, derived from each architecture on a p3.2xlarge (one V100 16 GB).

Per layer we derive from the architecture: multiply-accumulates (MACs) of the forward pass of one
micro-batch, parameters, and the elements of the output activation. Times follow from FLOPs:

    forward_s  = 2 * MACs / V100_EFFECTIVE_FLOPS            (s)
    backward_s = 2 * forward_s                              (s; gradients of inputs and weights)
    optimizer_s = num_params * ADAM_BYTES_TOUCHED / V100_MEMORY_BANDWIDTH   (s; memory bound)

How the layers are cut into stages follows the engine the measured table came from
(``BuiltinSpec.partition_method``). The absolute scale of compute, the per-micro-batch overhead,
the stage-to-stage transfer and the all-reduce efficiency are then fitted per model to the
measured table (``perf_calibration.json``, see ``calibrate.py``); the activation memory per
output element is solved so that the smallest feasible pipeline depth matches the published one
(GPT-1.5B needs P >= 6 and GPT-6.7B P >= 12 on 16 GB V100s, per the Parcae paper; the others the
smallest P in the measured table).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from liveput.perf.estimator import stage_memory_bytes
from liveput.perf.partition import partition_table
from liveput.perf.types import InstanceType, LayerProfile, ModelProfile

V100_EFFECTIVE_FLOPS = 50e12
"""Mixed-precision FLOP/s a V100 sustains on large GEMMs (nominal 125 TFLOP/s x 0.4)."""
V100_MEMORY_BANDWIDTH = 900e9
"""HBM2 bandwidth of a V100, bytes/s."""
ADAM_BYTES_TOUCHED = 16
"""Bytes read and written per parameter by an fp32 Adam step (weights, grads, two moments)."""

P3_2XLARGE = InstanceType(
    name="p3.2xlarge",
    gpu_memory_gb=15.5,  # usable of 16 GB, the out-of-memory bound the Parcae paper uses
    network_gbps=10.0,
    spot_price_usd_per_hour=1.25,  # spotDNN paper, Jan 2023 (systems.md section 4)
    on_demand_price_usd_per_hour=3.06,
)


@dataclass(frozen=True)
class LayerShape:
    """What the architecture says about one layer for one sample."""

    name: str
    macs_per_sample: float
    num_params: int
    activation_elements_per_sample: int


def _layers_to_profile(
    model: str,
    shapes: list[LayerShape],
    global_batch_size: int,
    micro_batch_size: int,
    activation_bytes_per_element: int,
    min_pipeline_stages: int,
    partition_method: str,
    memory_bytes_per_activation_element: float,
) -> ModelProfile:
    layers = []
    for shape in shapes:
        forward_s = 2 * shape.macs_per_sample * micro_batch_size / V100_EFFECTIVE_FLOPS
        elements = shape.activation_elements_per_sample * micro_batch_size
        layers.append(
            LayerProfile(
                name=shape.name,
                forward_s=forward_s,
                backward_s=2 * forward_s,
                optimizer_s=shape.num_params * ADAM_BYTES_TOUCHED / V100_MEMORY_BANDWIDTH,
                num_params=shape.num_params,
                activation_bytes=elements * activation_bytes_per_element,
                activation_memory_bytes=int(elements * memory_bytes_per_activation_element),
            )
        )
    return ModelProfile(
        model=model,
        instance_type=P3_2XLARGE,
        layers=tuple(layers),
        global_batch_size=global_batch_size,
        micro_batch_size=micro_batch_size,
        state_bytes_per_param=12,  # fp16 weights and grads + fp32 Adam state, as Parcae counts
        min_pipeline_stages=min_pipeline_stages,
        partition_method=partition_method,
    )


def _transformer(
    hidden: int, seq: int, num_layers: int, vocab: int, embed_layers: bool
) -> list[LayerShape]:
    block_params = 12 * hidden * hidden + 13 * hidden
    block_macs = 12 * hidden * hidden * seq + 2 * seq * seq * hidden
    shapes = []
    if embed_layers:
        shapes.append(LayerShape("embedding", 0.0, vocab * hidden + seq * hidden, seq * hidden))
    shapes += [
        LayerShape(f"block.{i}", block_macs, block_params, seq * hidden) for i in range(num_layers)
    ]
    if embed_layers:
        shapes.append(LayerShape("head", vocab * hidden * seq, vocab * hidden, seq * vocab // 16))
    return shapes


def _vgg19() -> list[LayerShape]:
    """VGG-19 as the flat module sequence a pipeline engine cuts (torchvision's ``features``
    then ``avgpool``, ``flatten`` and ``classifier``): 16 convolutions, each followed by its own
    ReLU module, 5 max-pools, then 3 linear layers with their ReLU and dropout modules, 46 in
    all. The parameter-free modules carry no compute but count as layers for a uniform cut, and
    their outputs are what crosses a stage boundary there."""
    plan: list[tuple[int, int, int] | str] = [
        (224, 3, 64),
        (224, 64, 64),
        "pool",
        (112, 64, 128),
        (112, 128, 128),
        "pool",
    ]
    plan += [(56, 128, 256)] + [(56, 256, 256)] * 3 + ["pool", (28, 256, 512)]
    plan += [(28, 512, 512)] * 3 + ["pool"] + [(14, 512, 512)] * 4 + ["pool"]
    shapes: list[LayerShape] = []
    elements = 224 * 224 * 3
    for item in plan:
        if isinstance(item, str):  # "pool"
            elements //= 4
            shapes.append(LayerShape(f"pool.{len(shapes)}", 0.0, 0, elements))
            continue
        size, cin, cout = item
        elements = size * size * cout
        shapes.append(
            LayerShape(
                f"conv.{len(shapes)}", size * size * cin * cout * 9, cin * cout * 9 + cout, elements
            )
        )
        shapes.append(LayerShape(f"relu.{len(shapes)}", 0.0, 0, elements))
    shapes.append(LayerShape("avgpool", 0.0, 0, 7 * 7 * 512))
    shapes.append(LayerShape("flatten", 0.0, 0, 7 * 7 * 512))
    fcs = [(25088, 4096), (4096, 4096), (4096, 1000)]
    for i, (fan_in, fan_out) in enumerate(fcs):
        shapes.append(LayerShape(f"fc.{i}", fan_in * fan_out, fan_in * fan_out + fan_out, fan_out))
        if i < len(fcs) - 1:
            shapes.append(LayerShape(f"fc.{i}.relu", 0.0, 0, fan_out))
            shapes.append(LayerShape(f"fc.{i}.dropout", 0.0, 0, fan_out))
    return shapes


def _resnet152() -> list[LayerShape]:
    shapes = [LayerShape("stem", 112 * 112 * 3 * 64 * 49, 3 * 64 * 49, 56 * 56 * 64)]
    channels_in = 64
    for stage, (blocks, width, size) in enumerate(
        [(3, 64, 56), (8, 128, 28), (36, 256, 14), (3, 512, 7)]
    ):
        out = 4 * width
        for block in range(blocks):
            params = channels_in * width + 9 * width * width + width * out
            if block == 0:
                params += channels_in * out  # projection shortcut
            shapes.append(
                LayerShape(
                    f"layer{stage + 1}.{block}", size * size * params, params, size * size * out
                )
            )
            channels_in = out
    shapes.append(LayerShape("fc", 2048 * 1000, 2048 * 1000 + 1000, 1000))
    return shapes


@dataclass(frozen=True)
class BuiltinSpec:
    """How to derive a built-in profile."""

    shapes: tuple[LayerShape, ...]
    global_batch_size: int
    micro_batch_size: int
    activation_bytes_per_element: int
    """2 for fp16 activations sent between stages."""
    min_pipeline_stages: int
    """Smallest P that fits in memory: published (GPT-1.5B 6, GPT-6.7B 12, Parcae paper) or the
    smallest P of the measured table. The bytes of activation memory per output element are
    solved from it (``_memory_per_element``)."""
    partition_method: str = "compute"
    """How the layers are cut into stages (``partition``; the built-in profile's
    ``partition_method``), modelled on the engine of the measured runs (Parcae's DeepSpeed
    pipeline fork), and the cut liveput's planner deploys.
    VGG-19 is cut by module count (``uniform``): the cut that reproduces its measured halving of
    throughput at P = 5..7 against P = 4 and 8, where a cut then passes the 112 x 112 x 128
    activation between stages; balancing parameters (DeepSpeed's default) would put all 16
    convolutions on one stage for every P, flat in P, unlike the measurements. The fork cuts
    ResNets per bottleneck block, blocks of near-equal compute: ``compute``. It cuts GPT per
    block counting the head as a block (``transformer``), which fits GPT-1.5B's table at 1.7%
    MAPE with every pick right (the compute cut: 3.8% and 7 of 27 picks off by over 5%)."""


BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    "gpt-1.5b": BuiltinSpec(
        tuple(_transformer(1600, 1024, 48, 50257, False)), 128, 1, 2, 6, "transformer"
    ),
    "gpt-6.7b": BuiltinSpec(tuple(_transformer(4096, 1024, 32, 50257, True)), 64, 1, 2, 12),
    "bert-large": BuiltinSpec(tuple(_transformer(1024, 512, 24, 30522, False)), 1024, 8, 2, 2),
    "resnet152": BuiltinSpec(tuple(_resnet152()), 2048, 32, 2, 2),
    "vgg19": BuiltinSpec(tuple(_vgg19()), 2048, 32, 2, 2, "uniform"),
}


def _memory_per_element(profile: ModelProfile, min_stages: int, method: str) -> float:
    """Bytes per activation element that make ``min_stages`` the smallest depth that fits.

    Stage memory is linear in this coefficient x (``estimator`` docstring), so the depth P fits
    iff x <= min_s (budget - fixed_s) / elements_s; we take the midpoint between the bound of
    ``min_stages - 1`` (must not fit) and of ``min_stages`` (must fit), with D = 1 (most
    micro-batches in flight).
    """
    table = partition_table(profile, min_stages, method)
    budget = profile.instance_type.gpu_memory_gb * 1e9
    micro = profile.global_batch_size // profile.micro_batch_size

    def bound(depth: int) -> float:
        stages = np.array([depth])
        in_flight = np.clip(np.minimum(depth - np.arange(min_stages), micro), 0, None)[None, :]
        fixed = stage_memory_bytes(profile, table, stages, in_flight)[0, :depth]
        elements = table.stage_activation_memory[depth, :depth]  # built with 1 byte/element
        return float(((budget - fixed) / elements).min())

    upper = bound(min_stages)
    lower = bound(min_stages - 1) if min_stages > 1 else 0.0
    return (lower + upper) / 2 if lower < upper else upper


@cache
def builtin_profile(name: str) -> ModelProfile:
    """The derived profile of a built-in model (KeyError if unknown; see ``load_profile``)."""
    spec = BUILTIN_SPECS[name]
    args = (
        name,
        list(spec.shapes),
        spec.global_batch_size,
        spec.micro_batch_size,
        spec.activation_bytes_per_element,
        spec.min_pipeline_stages,
        spec.partition_method,
    )
    unit = _layers_to_profile(*args, memory_bytes_per_activation_element=1.0)
    per_element = _memory_per_element(unit, spec.min_pipeline_stages, unit.partition_method)
    return _layers_to_profile(*args, per_element)
