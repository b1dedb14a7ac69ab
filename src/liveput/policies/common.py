"""Lookups and costs shared by the policies: the best configuration for a count, throughput,
what survives a loss, and the seconds of a restart or a checkpoint (from the cost model)."""

from __future__ import annotations

import numpy as np

from liveput.perf.configuration import Configuration
from liveput.policies.base import Policy, PolicyContext


class ConfigurationLookup:
    """The context's configuration table as direct lookups."""

    def __init__(self, context: PolicyContext) -> None:
        self.context = context
        self.max_instances = context.max_instances
        self.grid = context.table.throughput_grid(self.max_instances)
        self._best: list[Configuration | None] = []
        for count in range(self.max_instances + 1):
            best = context.table.best_for(count)
            self._best.append(None if best is None else Configuration(best[0], best[1]))

    def best_for(self, num_instances: int) -> Configuration | None:
        """The configuration of highest throughput on at most ``num_instances`` (None: none
        fits)."""
        return self._best[int(np.clip(num_instances, 0, self.max_instances))]

    def throughput(self, configuration: Configuration | None) -> float:
        """Samples/s of a configuration (0 for None)."""
        if configuration is None:
            return 0.0
        return float(self.grid[configuration.data_parallel, configuration.pipeline_stages])


class LookupPolicy(Policy):
    """A policy that looks configurations up in the context's table (``self.lookup``)."""

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.lookup = ConfigurationLookup(context)


def stage_state_bytes(context: PolicyContext, pipeline_stages: int) -> float:
    """Training state (parameters and optimizer) of one stage of a P-stage pipeline, bytes."""
    return model_state_bytes(context) / max(pipeline_stages, 1)


def model_state_bytes(context: PolicyContext) -> float:
    """Training state of the whole model (what a checkpoint holds), bytes."""
    return float(context.profile.layer_state_bytes().sum())


def checkpoint_save_s(context: PolicyContext, configuration: Configuration) -> float:
    """Seconds to save a checkpoint: the whole model's state through the checkpoint storage's
    bandwidth (the cost model's calibration: about 7 s each way for GPT-1.5B)."""
    del configuration  # the storage bandwidth, not the stage count, limits a checkpoint
    return context.costs.checkpoint_save_s(model_state_bytes(context))


def restart_s(context: PolicyContext, configuration: Configuration) -> float:
    """Seconds of a full restart into ``configuration``: rendezvous and rebuild of every worker
    (measured restart) plus loading the whole checkpoint."""
    return context.costs.restart_s(configuration.num_instances) + context.costs.checkpoint_load_s(
        model_state_bytes(context)
    )


def lost_per_stage(
    configuration: Configuration,
    lost_slots: tuple[tuple[int, int], ...],
) -> np.ndarray:
    """Instances lost by each stage of ``configuration``."""
    stages = np.array([stage for _, stage in lost_slots], dtype=np.int64)
    return np.bincount(stages, minlength=configuration.pipeline_stages)


def surviving_pipelines(
    configuration: Configuration, lost_slots: tuple[tuple[int, int], ...]
) -> int:
    """Complete pipelines the survivors regroup into: ``D - max_j losses_j``."""
    if not lost_slots:
        return configuration.data_parallel
    return int(configuration.data_parallel - lost_per_stage(configuration, lost_slots).max())
