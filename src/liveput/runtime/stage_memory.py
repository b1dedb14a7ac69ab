"""An agent's check of the stage a plan gives it against the job's per-instance memory budget.

The coordinator plans only configurations whose every stage fits the budget (the estimator's
memory model, ``perf.estimator``); an agent checks the stage it is actually given with the same
model, before it allocates a layer: its weights, gradients and optimizer state, and the
activations of the micro-batches it keeps in flight. A stage over the budget is refused with one
line (the engine ends the job with it, as it does a layer that raises: the coordinator planned
with the same budget, so planning again would give the same stage) instead of being allocated and
swapped or killed by the operating system.

The agent reads the profile the coordinator plans with from the store (``job/profile``, kept
there before the first plan) when its first plan comes; a job whose store keeps none (a
coordinator handed its profile) goes unchecked, and the agent says so once.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.perf.estimator import stage_peak_bytes
from liveput.perf.types import ModelProfile
from liveput.runtime import keys
from liveput.runtime.planning import planning_profile
from liveput.runtime.protocol import JobFailure, RuntimePlan
from liveput.runtime.store import Store

__all__ = ["StageBudget", "StageCheck", "stage_need_gb", "stage_refusal"]

LOG = logging.getLogger(__name__)

_ROUNDING = 1e-9
"""Relative slack of the comparison: the planner sums the same bytes in another order."""


@dataclass(frozen=True)
class StageBudget:
    """What an agent checks each stage it is given against."""

    profile: ModelProfile
    """The profile the job is planned with (``planning.planning_profile``): its layers' memory
    figures, and the budget as its instance memory, GB."""

    def __post_init__(self) -> None:
        if not self.profile.instance_type.gpu_memory_gb > 0:
            raise LiveputError(
                f"stage budget of {self.profile.model}: the instance memory must be > 0 GB"
            )

    @property
    def limit_gb(self) -> float:
        """The budget per instance, GB."""
        return self.profile.instance_type.gpu_memory_gb


def stage_need_gb(budget: StageBudget, plan: RuntimePlan, stage: int) -> float:
    """Predicted peak memory of stage ``stage`` of ``plan``, GB (``perf.estimator``)."""
    layers = plan.layers_of(stage)
    if layers.stop > budget.profile.num_layers:
        raise LiveputError(
            f"plan {plan.generation} has layers up to {layers.stop - 1}; the job's profile "
            f"has {budget.profile.num_layers}"
        )
    peak = stage_peak_bytes(budget.profile, layers, stage, plan.pipeline_stages, plan.data_parallel)
    return peak / 1e9


def stage_refusal(budget: StageBudget, plan: RuntimePlan, instance: int) -> str | None:
    """The one line refusing ``instance``'s stage of ``plan`` when its predicted peak memory is
    over the budget; None when it fits, or the instance has no stage (a spare only sends)."""
    slot = plan.slots.get(instance)
    if slot is None:
        return None
    stage = slot[1]
    layers = plan.layers_of(stage)
    need_gb = stage_need_gb(budget, plan, stage)
    if need_gb <= budget.limit_gb * (1 + _ROUNDING):
        return None
    return (
        f"stage {stage} of plan {plan.generation} (D={plan.data_parallel}, "
        f"P={plan.pipeline_stages}: layers {layers.start}-{layers.stop - 1}) needs "
        f"{need_gb:.3g} GB per instance, over the instance memory budget of "
        f"{budget.limit_gb:g} GB (--instance-memory-gb); instance {instance} refused it"
    )


class StageCheck:
    """One agent's check of each stage it is given (module docstring): nothing without a
    budget."""

    def __init__(
        self, job: Job, store: Store, instance: int, instance_memory_gb: float | None
    ) -> None:
        self.job = job
        self.store = store
        self.instance = instance
        self.instance_memory_gb = instance_memory_gb
        self.budget: StageBudget | None = None
        """The budget with the job's profile, once read from the store."""
        self._warned = False

    def _read(self) -> StageBudget | None:
        from liveput.perf.profile_io import profile_from_dict

        assert self.instance_memory_gb is not None
        raw = self.store.get(keys.job_profile())
        if raw is None:
            if not self._warned:
                LOG.warning(
                    "instance %d: the store keeps no profile of the job: its stages are not "
                    "checked against the %g GB instance memory budget",
                    self.instance,
                    self.instance_memory_gb,
                )
                self._warned = True
            return None
        profile = profile_from_dict(json.loads(raw)["profile"])
        return StageBudget(planning_profile(profile, self.job, self.instance_memory_gb))

    def check(self, plan: RuntimePlan) -> None:
        """Raise the job's failure (one line) when this instance's stage of ``plan`` is over
        the budget."""
        if self.instance_memory_gb is None:
            return
        if self.budget is None:
            self.budget = self._read()
            if self.budget is None:
                return
        refusal = stage_refusal(self.budget, plan, self.instance)
        if refusal is not None:
            raise JobFailure(refusal)
        slot = plan.slots.get(self.instance)
        if slot is not None:
            LOG.info(
                "instance %d: stage %d of plan %d needs %.3g GB of the %g GB budget",
                self.instance,
                slot[1],
                plan.generation,
                stage_need_gb(self.budget, plan, slot[1]),
                self.budget.limit_gb,
            )
