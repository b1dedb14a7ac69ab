"""Types of the performance model, shared by the estimator, the optimizer and the planner.

Units: seconds, bytes, samples. A configuration (D, P) is D data-parallel pipelines of P stages,
using D * P instances, each instance holding one stage of one pipeline.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError

ACTIVATION_CHECKPOINTING = ("stage", "none", "layer")
"""Values of :attr:`ModelProfile.activation_checkpointing`."""
PARTITION_METHODS = ("compute", "parameters", "uniform", "transformer")
"""Values of :attr:`ModelProfile.partition_method` (``partition`` module docstring)."""


@dataclass(frozen=True)
class LayerProfile:
    """One layer measured (or derived) for one micro-batch on one instance type."""

    name: str
    """Layer name (e.g. ``block.3``)."""
    forward_s: float
    """Forward time of one micro-batch, seconds."""
    backward_s: float
    """Backward time of one micro-batch, seconds."""
    optimizer_s: float
    """Optimizer step time for the layer's parameters, seconds (once per iteration)."""
    num_params: int
    """Parameters of the layer."""
    activation_bytes: int
    """Bytes of the layer's output activation for one micro-batch (sent to the next stage)."""
    activation_memory_bytes: int
    """Bytes kept for the backward pass per micro-batch in flight."""


@dataclass(frozen=True)
class InstanceType:
    """The machine a profile was measured on."""

    name: str
    """Cloud name, e.g. ``p3.2xlarge``."""
    gpu_memory_gb: float
    """Usable accelerator memory per instance, GB (1e9 bytes)."""
    network_gbps: float
    """Network bandwidth between instances, Gb/s."""
    spot_price_usd_per_hour: float
    """Spot price per instance-hour."""
    on_demand_price_usd_per_hour: float
    """On-demand price per instance-hour."""


@dataclass(frozen=True)
class ModelProfile:
    """A model as the estimator sees it: its layers, batch sizes and training-state bytes."""

    model: str
    """Model name (``gpt-1.5b``, ``tiny-gpt`` or a user's)."""
    instance_type: InstanceType
    """Where it was measured or for which it was derived."""
    layers: tuple[LayerProfile, ...]
    """The layers in order."""
    global_batch_size: int
    """Samples per training iteration, fixed whatever the configuration."""
    micro_batch_size: int
    """Samples per micro-batch."""
    state_bytes_per_param: int = 16
    """Bytes of training state per parameter: fp32 weights 4 + grads 4 + Adam moments 8."""
    min_pipeline_stages: int = 1
    """Smallest pipeline depth known to run (published or measured); shallower ones are
    infeasible whatever the memory model says."""
    activation_checkpointing: str = "stage"
    """What the training engine keeps for the backward pass (``estimator`` docstring):
    ``stage`` (the built-in tables' DeepSpeed runs: each stage's input, its forward recomputed,
    the recompute inside the calibrated compute scale), ``none`` (every layer's activations per
    micro-batch in flight) or ``layer`` (liveput's per-layer checkpointing: each layer's input,
    each layer's forward run again in the backward)."""
    partition_method: str = "compute"
    """How the training engine cuts the layers into stages (``partition`` module docstring): the
    cut the estimator scores and the planner deploys. A built-in profile names the method of the
    engine its measured table came from (``builtin.BuiltinSpec``); a measured one is cut by
    ``compute``."""

    def __post_init__(self) -> None:
        if self.activation_checkpointing not in ACTIVATION_CHECKPOINTING:
            raise LiveputError(
                f"profile {self.model}: activation_checkpointing must be one of "
                f"{', '.join(ACTIVATION_CHECKPOINTING)}, not "
                f"{self.activation_checkpointing!r}"
            )
        if self.partition_method not in PARTITION_METHODS:
            raise LiveputError(
                f"profile {self.model}: unknown partition method "
                f"{self.partition_method!r}; one of "
                f"{', '.join(PARTITION_METHODS)}"
            )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(layer.num_params for layer in self.layers)

    def layer_state_bytes(self) -> np.ndarray:
        """Bytes of parameters and optimizer state of each layer (what a migration moves)."""
        return np.array([layer.num_params for layer in self.layers], dtype=np.int64) * (
            self.state_bytes_per_param
        )


def check_instance_memory_gb(memory_gb: float | None, name: str = "instance_memory_gb") -> None:
    """A per-instance memory budget is None (none) or a finite number of GB > 0; anything else
    is a one-line LiveputError naming the setting (``name``, e.g. ``job: instance_memory_gb``)."""
    if memory_gb is not None and not (math.isfinite(memory_gb) and memory_gb > 0):
        raise LiveputError(f"{name} must be a finite number of GB > 0, got {memory_gb:g}")


def with_instance_memory(profile: ModelProfile, memory_gb: float | None) -> ModelProfile:
    """``profile`` planned for instances of ``memory_gb`` GB each (a job's per-instance memory
    budget, ``--instance-memory-gb``) instead of its instance type's own memory; None: as it is.

    The budget replaces the memory the profile was measured with (the estimator's feasibility,
    the planner's refusal, Bamboo's extra copy all read ``instance_type.gpu_memory_gb``): lower,
    it makes a job that fits one instance need several; higher, it plans for instances larger
    than the machine that measured the profile."""
    check_instance_memory_gb(memory_gb, f"profile {profile.model}: instance memory")
    if memory_gb is None or memory_gb == profile.instance_type.gpu_memory_gb:
        return profile
    instance = dataclasses.replace(profile.instance_type, gpu_memory_gb=float(memory_gb))
    return dataclasses.replace(profile, instance_type=instance)


def with_network(profile: ModelProfile, network_gbps: float | None) -> ModelProfile:
    """``profile`` planned for instances linked at ``network_gbps`` Gb/s each way instead of
    its instance type's own rate (the estimator's gradient all-reduce and activation transfers,
    the migration costs' state moves all read ``instance_type.network_gbps``); None: as it is."""
    if network_gbps is not None and not (math.isfinite(network_gbps) and network_gbps > 0):
        raise LiveputError(
            f"profile {profile.model}: network must be > 0 Gb/s, got {network_gbps:g}"
        )
    if network_gbps is None or network_gbps == profile.instance_type.network_gbps:
        return profile
    instance = dataclasses.replace(profile.instance_type, network_gbps=float(network_gbps))
    return dataclasses.replace(profile, instance_type=instance)


@dataclass(frozen=True)
class ConfigTable:
    """Throughput and memory of every candidate configuration, scored at once."""

    model: str
    instance_type: str
    data_parallel: np.ndarray
    """D of each configuration, shape (K,)."""
    pipeline_stages: np.ndarray
    """P of each configuration, shape (K,)."""
    samples_per_s: np.ndarray
    """Estimated training throughput, samples/s, shape (K,) (0 where infeasible)."""
    memory_gb: np.ndarray
    """Peak memory of the most loaded stage, GB, shape (K,)."""
    feasible: np.ndarray
    """Whether the configuration fits in memory and has enough layers/micro-batches, (K,)."""
    reason: tuple[str | None, ...]
    """Why an infeasible configuration is infeasible (None when feasible)."""

    def throughput_grid(self, max_nodes: int) -> np.ndarray:
        """``grid[D, P]`` = samples/s of (D, P) (0 when infeasible or absent), shape
        (max_nodes + 1, max_nodes + 1)."""
        grid = np.zeros((max_nodes + 1, max_nodes + 1))
        keep = (self.data_parallel * self.pipeline_stages <= max_nodes) & self.feasible
        grid[self.data_parallel[keep], self.pipeline_stages[keep]] = self.samples_per_s[keep]
        return grid

    def best_for(self, num_nodes: int) -> tuple[int, int, float] | None:
        """The feasible (D, P, samples/s) with the highest throughput using at most
        ``num_nodes`` instances; ties go to the shallower pipeline. None if nothing fits."""
        fits = self.feasible & (self.data_parallel * self.pipeline_stages <= num_nodes)
        if not fits.any():
            return None
        order = np.lexsort((self.pipeline_stages, -self.samples_per_s))
        best = next(i for i in order if fits[i])
        return (
            int(self.data_parallel[best]),
            int(self.pipeline_stages[best]),
            float(self.samples_per_s[best]),
        )


@dataclass(frozen=True)
class Measurement:
    """The measured iteration time of one configuration."""

    data_parallel: int
    """D."""
    pipeline_stages: int
    """P."""
    iteration_s: float
    """Seconds per training step (the median of its measured intervals)."""
    steps: int = 1
    """Intervals the figure summarizes."""

    def __post_init__(self) -> None:
        if self.data_parallel < 1 or self.pipeline_stages < 1:
            raise LiveputError(
                f"measurement: D and P must be >= 1, not "
                f"({self.data_parallel}, {self.pipeline_stages})"
            )
        if not (math.isfinite(self.iteration_s) and self.iteration_s > 0):
            raise LiveputError(
                f"measurement of ({self.data_parallel}, {self.pipeline_stages}): "
                f"iteration time must be positive, not {self.iteration_s}"
            )
