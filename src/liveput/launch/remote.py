"""A job on real machines (``liveput coordinator``): the instances a provider holds for it, and
a deadline job's assembly, both checked before anything starts (one-line errors)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
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
    from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)

__all__ = ["assemble_deadline_job", "build_holder", "check_gpu_use", "run_remote_job", "RemoteRun"]


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


@dataclass(frozen=True)
class RemoteRun:
    """What running a job on real machines left to say."""

    checkpoints_failed: int = 0
    """Checkpoint writes that failed, on any instance."""
    released: int | None = None
    """Instances given back at the end (None: no provider rented any)."""
    usd: float = 0.0
    """What the provider billed."""


def run_remote_job(
    store: Store, assembled: AssembledJob, holder: InstanceHolder | None, spot_max: int
) -> RemoteRun:
    """Rent (with a provider), run the coordinator until the job is done, then give the
    instances back (also when this process stops or the job fails)."""
    from liveput.cloud.market import HolderMarket
    from liveput.runtime.checkpoint import final_weights_written
    from liveput.runtime.launch import run_coordinator

    if holder is not None:
        holder.start_background(assembled.config.interval_s)
    released: list[str] | None = None
    try:
        run_coordinator(
            store,
            assembled.spec,
            assembled.config,
            deadline=assembled.deadline,
            # A deadline job has a provider (assemble_deadline_job checks): its policy drives it.
            market=None
            if assembled.deadline is None or holder is None
            else HolderMarket(holder, spot_max),
        )
        failed = final_weights_written(store, "coordinator")
    finally:
        if holder is not None:
            released = holder.close()
            holder.provider.close()
            LOG.info(
                "released %d instance(s); spent $%.2f", len(released), holder.provider.bill().usd
            )
    return RemoteRun(
        failed,
        None if released is None else len(released),
        0.0 if holder is None else holder.provider.bill().usd,
    )


def check_gpu_use(
    provider: str | None, rented: InstanceHolder | tuple[str, ...] | None, device: str
) -> list[str]:
    """GPUs of the rented types (a holder's, or names) the agents leave idle: a one-line error
    with a real provider (the bill is real); with the emulated one, whose agents run on this
    machine, the warnings to show (none without a provider)."""
    from liveput.catalog import load_catalog
    from liveput.runtime.device import idle_gpus_message, resolve_device

    if provider is None or rented is None:
        return []
    names = rented.instance_types if isinstance(rented, InstanceHolder) else rented
    catalog = load_catalog("aws")
    emulated = provider == "emulated"
    warnings = []
    for name in names:
        spec = catalog.get(name)
        if emulated:
            used = resolve_device(device, "coordinator")
        else:  # ``auto`` on the instance: its GPU when it has one
            used = "cpu" if device == "cpu" or not spec.gpus else "cuda"
        message = idle_gpus_message(spec.name, spec.gpus, spec.gpu, used)
        if message is None:
            continue
        if not emulated:
            raise LiveputError(f"--instance-types: {message}")
        warnings.append(message)
    return warnings
