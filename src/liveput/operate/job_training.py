"""A job file as ``liveput train``'s local training: the one mapping, for ``liveput train --job``
and for ``liveput launch`` / ``resume`` (which add their own store, token, logs and limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from liveput.launch.deadline import DeadlineJob
from liveput.launch.local import LocalTrainingConfig, default_trace
from liveput.operate.jobfile import JobFile
from liveput.traces import IntervalTrace, Trace, read_trace


def training_config(job: JobFile, num_steps: int, **overrides: Any) -> LocalTrainingConfig:
    """The local training ``job`` describes, ``num_steps`` long (its ``target_samples`` in
    whole global batches, the caller's to count); ``overrides``: fields of
    :class:`LocalTrainingConfig` the caller sets (its store, token, log folder, ...)."""
    provider, objective = job.provider, job.objective
    deadline = (
        None
        if objective.deadline_hours is None
        else DeadlineJob(
            objective.deadline_hours,
            provider.on_demand_max,
            provider.instance_type,
            objective.policy,
        )
    )
    fields: dict[str, Any] = {
        "model": job.model,
        "workers": provider.workers,
        "steps": num_steps,
        "time_scale": provider.time_scale,
        "notice_lead_s": job.notices.lead_s,
        "notice_margin_s": job.notices.margin_seconds,
        "checkpoint_dir": job.checkpoint.url,
        "checkpoint_every": job.checkpoint.every,
        "keep_checkpoints": job.checkpoint.keep,
        "seed": provider.trace_seed,
        "device": job.device,
        "instance_memory_gb": job.instance_memory_gb,
        "deadline": deadline,
    }
    return LocalTrainingConfig(**{**fields, **overrides})


def job_trace(job: JobFile) -> Trace | IntervalTrace:
    """The trace the job file names, or the default one of its workers and seed."""
    provider = job.provider
    if provider.trace:
        return read_trace(Path(provider.trace))
    return default_trace(provider.workers, provider.trace_seed)
