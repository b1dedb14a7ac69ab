"""A job on real machines (``liveput coordinator``): the instances a provider holds for it, and
a deadline job's assembly, both checked before anything starts (one-line errors)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from liveput.cloud.build import ProviderSettings, build_provider
from liveput.cloud.holding import InstanceHolder
from liveput.cloud.userdata import AgentBoot
from liveput.errors import LiveputError
from liveput.launch.assemble import AssembledJob, JobRequest, assemble_job
from liveput.launch.deadline import DeadlineJob
from liveput.policies.base import Provisioning
from liveput.traces import Trace, read_trace

if TYPE_CHECKING:
    from liveput.models.job import Job

__all__ = ["assemble_deadline_job", "build_holder"]


def build_holder(
    name: str | None,
    *,
    region: str,
    instance_types: str | None,
    spot_max: int,
    on_demand_max: int,
    capacity: int,
    address: str,
    token: str,
    image_id: str | None,
    trace: str | None,
    work_dir: Path,
    instance_profile: str | None = None,
) -> InstanceHolder | None:
    """The provider and what it holds, checked before anything starts (one-line errors)."""
    if name is None:
        if spot_max or on_demand_max or instance_types:
            raise LiveputError(
                "--spot-max, --on-demand-max and --instance-types need --provider (emulated or aws)"
            )
        return None
    if spot_max + on_demand_max == 0:
        raise LiveputError(f"--provider {name}: give --spot-max and/or --on-demand-max")
    if spot_max + on_demand_max > capacity:
        raise LiveputError(
            f"--spot-max {spot_max} + --on-demand-max {on_demand_max} exceed --capacity {capacity}"
        )
    types = tuple(t.strip() for t in (instance_types or "").split(",") if t.strip())
    settings = ProviderSettings(
        instance_types=types,
        boot=AgentBoot(address, token),
        region=region,
        image_id=image_id,
        instance_profile=instance_profile,
        trace=trace,
        spot_max=spot_max,
        work_dir=work_dir,
    )
    provider = build_provider(name, settings)
    return InstanceHolder(provider, Provisioning(spot_max, on_demand_max), provider.instance_types)


def assemble_deadline_job(
    holder: InstanceHolder | None,
    job: Job,
    request: JobRequest,
    deadline: tuple[float, int, str],
    trace_path: str | None,
) -> AssembledJob:
    """The deadline job (``deadline``: hours, most on-demand instances, policy) assembled,
    checked before anything starts: it needs a provider, whose first instance type, prices and
    spot count (or trace) its policy plans with. The provider
    then holds the spot instances; the deadline policy decides the on-demand ones."""
    from liveput.runtime.planning import profile_job  # imports PyTorch: only for a deadline

    if holder is None:
        raise LiveputError(
            "--deadline-hours needs --provider (emulated or aws): the job "
            "rents its on-demand instances"
        )
    hours, on_demand_max, policy = deadline
    types = holder.instance_types
    quote = holder.provider.prices(types[0])[0]
    spot_max = holder.target.spot
    trace = (
        read_trace(Path(trace_path))
        if trace_path
        else Trace.from_counts("spot-max", np.array([0.0]), np.array([spot_max]), 3600.0)
    )
    assembled = assemble_job(
        dataclasses.replace(request, deadline=DeadlineJob(hours, on_demand_max, types[0], policy)),
        profile=profile_job(job),
        trace=trace,
        prices_usd_per_hour=(quote.spot_usd_per_hour, quote.on_demand_usd_per_hour),
    )
    holder.target = Provisioning(spot_max, 0)  # on-demand: as the deadline policy decides
    return assembled
