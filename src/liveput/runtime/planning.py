"""From the planner's :class:`MigrationPlan` to the plan the runtime executes.

The planner treats noticed instances as gone. They are still alive until their preemption, so a
layer the planner would restore from the checkpoint is sent by a noticed instance that holds it
when there is one: that is what acting before the preemption buys. A plan that still needs the
checkpoint restores *every* layer from it (all stages must be at the same step), and the steps
committed after that checkpoint are redone: the rollback is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.perf.configuration import Configuration
from liveput.perf.estimator import estimate_configs, smallest_fit
from liveput.perf.partition import partition_layers
from liveput.perf.types import ConfigTable, ModelProfile, with_instance_memory
from liveput.plan.costs import CostModel
from liveput.plan.migration import CHECKPOINT, Assignment, MigrationPlan, Slot, plan_from_holdings
from liveput.runtime.protocol import FRESH_START, RuntimePlan, Transfer


@dataclass(frozen=True)
class PlanContext:
    """What the runtime adds to a migration plan."""

    generation: int
    """Number of the new plan."""
    epoch: int
    """Restore epoch before this plan."""
    start_step: int
    """First step of the new generation when no checkpoint is restored."""
    end_step: int
    """The job's last step + 1."""
    hosts: dict[int, str]
    """Addresses of the instances."""
    latest_checkpoint: int | None
    """Step of the newest complete checkpoint (None: none yet)."""
    stages_before: int
    """P of the running plan (0: nothing runs)."""


def assignment_of(plan: RuntimePlan | None) -> Assignment:
    """The planner's view of a running plan (an empty one before the first)."""
    if plan is None:
        return Assignment({}, 0)
    return Assignment(
        {i: Slot(*s) if s is not None else None for i, s in plan.slots.items()},
        plan.pipeline_stages,
    )


def plan_generation(
    profile: ModelProfile,
    costs: CostModel,
    target: Configuration,
    context: PlanContext,
    workers: Sequence[int],
    holdings: Mapping[int, Collection[int]],
    senders: Sequence[int] = (),
    previous: RuntimePlan | None = None,
    restore: bool = False,
    on_demand: Collection[int] = (),
) -> RuntimePlan:
    """The plan of generation ``context.generation``: the coordinator's and the in-process
    cluster's one planning function.

    ``workers`` may take a slot; ``senders`` (noticed instances) may only send; ``holdings`` maps
    each of them to the layers it holds at step ``context.start_step - 1`` of the current epoch
    (what it reported, never what an earlier plan meant it to hold). ``previous`` is the plan that
    last ran (for the migration's kind); ``restore`` takes every layer from the checkpoint;
    ``on_demand`` workers are spread over the stages (:mod:`liveput.plan.migration`, (4)-(5))."""
    held = {i: tuple(holdings.get(i, ())) for i in workers}
    ran = {} if previous is None else previous.slots
    migration = plan_from_holdings(
        profile,
        costs,
        held,
        target,
        assignment_of(previous),
        0 if previous is None else previous.pipeline_stages,
        preempted=set(ran) - set(workers),
        allocated=[i for i in workers if i not in ran],
        on_demand=on_demand,
    )
    noticed_holders: dict[int, list[int]] = {}
    for instance in senders:
        for layer in holdings.get(instance, ()):
            noticed_holders.setdefault(layer, []).append(instance)
    return to_runtime_plan(profile, migration, context, noticed_holders, restore)


def to_runtime_plan(
    profile: ModelProfile,
    migration: MigrationPlan,
    context: PlanContext,
    noticed_holders: dict[int, list[int]] | None = None,
    restore: bool = False,
) -> RuntimePlan:
    """``noticed_holders``: layer -> noticed (still alive) instances holding it; ``restore``:
    every layer from the checkpoint whatever the instances hold."""
    noticed_holders = noticed_holders or {}
    transfers = []
    needs_checkpoint = False
    for transfer in migration.transfers:
        source = transfer.source
        if source == CHECKPOINT and noticed_holders.get(transfer.layer):
            source = noticed_holders[transfer.layer][0]
        if source == CHECKPOINT:
            needs_checkpoint = True
        transfers.append(Transfer(transfer.layer, int(source), transfer.destination))
    # The plan's kind on the wire: a migration kind, or "start" for a job's first plan.
    kind: str = migration.kind
    restore_step = None
    start_step = context.start_step
    epoch = context.epoch
    if needs_checkpoint or restore or context.stages_before == 0:
        restore_step = (
            FRESH_START
            if context.latest_checkpoint is None
            else min(context.latest_checkpoint, context.start_step - 1)
        )
        kind = "checkpoint-restore"
        if restore_step == FRESH_START and context.start_step == 0:
            kind = "start"
        start_step = restore_step + 1
        transfers = []
        if start_step < context.start_step:
            epoch += 1
    elif kind == "checkpoint-restore":
        # Every lost layer is still held by a noticed instance: a peer-to-peer migration.
        same_depth = context.stages_before == migration.target.pipeline_stages
        kind = "inter-stage" if same_depth else "pipeline"
    slots = {
        i: (s.pipeline, s.stage) if s is not None else None
        for i, s in migration.assignment.slots.items()
    }
    for instance in {t.source for t in transfers} - set(slots):
        slots[instance] = None  # a noticed instance joins only to send its layers
    return RuntimePlan(
        generation=context.generation,
        epoch=epoch,
        start_step=start_step,
        end_step=context.end_step,
        data_parallel=migration.target.data_parallel,
        pipeline_stages=migration.target.pipeline_stages,
        boundaries=[int(b) for b in partition_layers(profile, migration.target.pipeline_stages)],
        slots=slots,
        hosts={i: context.hosts.get(i, "127.0.0.1") for i in slots},
        transfers=transfers,
        kind=kind,
        restore_step=restore_step,
    )


def profile_job(job: Job, repeats: int = 2, device: str = "cpu") -> ModelProfile:
    """Measure the job's layers on this machine's ``device``, in the job's precision (what the
    optimizer and planner need); the profile's instance type names that device."""
    from liveput.perf.profiler import job_target, profile_model

    profile = profile_model(
        job_target(job),
        micro_batch_size=job.micro_batch_size,
        device=device,
        repeats=repeats,
        precision=job.training.precision,
    )
    # The layers are measured without recomputation; the estimator adds it (and its memory
    # saving) when the job checkpoints activations.
    return dataclasses.replace(
        profile,
        activation_checkpointing=("layer" if job.training.activation_checkpointing else "none"),
    )


def planning_profile(
    profile: ModelProfile, job: Job, instance_memory_gb: float | None = None
) -> ModelProfile:
    """The profile a job is planned with, and its agents check their stages against: the
    measured one with the job's activation checkpointing (the layers are measured without
    recomputation) and the job's per-instance memory budget, if any, for the instances' memory
    (``perf.types.with_instance_memory``)."""
    recompute = "layer" if job.training.activation_checkpointing else "none"
    profile = dataclasses.replace(profile, activation_checkpointing=recompute)
    return with_instance_memory(profile, instance_memory_gb)


def require_a_fit(table: ConfigTable, profile: ModelProfile, capacity: int) -> None:
    """A one-line error when no configuration of up to ``capacity`` instances fits the model in
    memory (naming the least memory per instance it would need there, and the shallowest
    pipeline that fits the instance memory, or budget, at all), else nothing."""
    if table.feasible.any():
        return
    memory_only = [
        i
        for i, reason in enumerate(table.reason)
        if reason is not None and reason.startswith("out of memory")
    ]
    if not memory_only:
        raise LiveputError(
            f"{profile.model} fits no configuration of up to {capacity} "
            f"instances: {table.reason[0] if table.reason else 'none exists'}"
        )
    best = min(memory_only, key=lambda i: table.memory_gb[i])
    limit_gb = profile.instance_type.gpu_memory_gb
    fit = smallest_fit(profile)
    deeper = (
        f"no pipeline of its {profile.num_layers} layers fits {limit_gb:g} GB"
        if fit is None
        else f"the smallest that fits {limit_gb:g} GB is P={fit[0]} at D=1 "
        f"({fit[1]:.3g} GB per instance, {fit[0]} instances)"
    )
    raise LiveputError(
        f"{profile.model} fits no configuration of up to {capacity} instances of "
        f"{profile.instance_type.name} ({limit_gb:g} GB each): it needs "
        f"at least {table.memory_gb[best]:.3g} GB per instance "
        f"(D={int(table.data_parallel[best])}, P={int(table.pipeline_stages[best])}); {deeper}"
    )


def require_a_fit_before_start(profile: ModelProfile, capacity: int) -> None:
    """:func:`require_a_fit` on the profile's own table, before anything starts (agents, a
    coordinator that would take the refusal for a store outage and retry it)."""
    require_a_fit(estimate_configs(profile, capacity), profile, capacity)
