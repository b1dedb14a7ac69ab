"""`liveput agent` (one per instance) and `liveput coordinator` (one per job), for real machines."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from liveput.cli import params
from liveput.errors import LiveputError

if TYPE_CHECKING:
    from liveput.cloud.holding import InstanceHolder
    from liveput.models.job import Job
    from liveput.policies.deadline import DeadlineContext


def _token(token: str | None) -> str:
    token = token or os.environ.get("LIVEPUT_TOKEN")
    if not token:
        raise LiveputError("a job token is required: --token or LIVEPUT_TOKEN")
    return token


def agent(
    coordinator: str = typer.Option(
        None,
        "--coordinator",
        help="HOST:PORT of the coordinator's etcd (its --listen); or give --store.",
    ),
    store: str = typer.Option(None, "--store", help="Store URL (tcp://H:P or etcd://H:P)."),
    token: str = typer.Option(None, "--token", help="Job token (or LIVEPUT_TOKEN)."),
    instance: int = typer.Option(
        None,
        "--instance",
        help="Instance id (default: from the emulator's environment, else assigned by the store).",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address other instances reach this one at."
    ),
    notices: str = typer.Option(
        "aws,gcp,sigterm",
        "--notices",
        help="Preemption notice sources: aws, gcp, sigterm, emulator.",
    ),
    connect_timeout_s: float = typer.Option(
        10.0,
        "--connect-timeout",
        parser=params.SECONDS,
        help="Longest wait for the store and the job, seconds.",
    ),
    device: str = typer.Option(
        None,
        "--device",
        help="Train on auto (CUDA where this "
        "instance has it), cpu, cuda or cuda:K (default: the job's "
        "--device). One agent uses one GPU.",
    ),
) -> None:
    """Run this instance's agent: join the job, train, follow plans, leave on preemption."""
    # Before torch loads: c10d's C++ errors (dozens of stack frames each time a heartbeat
    # cannot reach the store) would drown the agent's own one-line, condensed messages.
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    from liveput.runtime.launch import NOTICE_SOURCES, run_agent

    if (coordinator is None) == (store is None):
        raise LiveputError("give exactly one of --coordinator HOST:PORT and --store URL")
    url = store or f"etcd://{coordinator}"
    sources = [s.strip() for s in notices.split(",") if s.strip()]
    unknown = sorted(set(sources) - set(NOTICE_SOURCES))
    if unknown or not sources:
        raise LiveputError(
            f"--notices {notices!r}: unknown source(s) {', '.join(unknown)}; "
            f"known: {', '.join(NOTICE_SOURCES)}"
        )
    from liveput.runtime.comm import end_process

    try:
        state = run_agent(
            url,
            _token(token),
            instance,
            host,
            sources,
            connect_timeout_s=connect_timeout_s,
            device=device,
        )
    except LiveputError as error:
        typer.echo(f"error: {' '.join(str(error).split())}", err=True)
        end_process(2)
    typer.echo(f"agent finished: {state.value}", err=True)
    end_process(0)


def coordinator(
    listen: str = typer.Option(
        "127.0.0.1:29400",
        "--listen",
        help="HOST:PORT the store "
        "this coordinator runs listens on (its etcd; the TCPStore with "
        "--embedded); ignored with --store.",
    ),
    store: str = typer.Option(
        None, "--store", help="Use this store instead (etcd://H:P, tcp://H:P) and run none."
    ),
    etcd_dir: str = typer.Option(
        "liveput-etcd",
        "--etcd-dir",
        help="Directory of the etcd "
        "this coordinator runs (data, log, pid); a restarted "
        "coordinator given the same one resumes the job.",
    ),
    embedded: bool = typer.Option(
        False,
        "--embedded",
        metavar=params.FLAG,
        help="Host a TCPStore in this process "
        "instead of etcd (no etcd needed; the job ends if this "
        "process does).",
    ),
    token: str = typer.Option(None, "--token", help="Job token (or LIVEPUT_TOKEN)."),
    model: str = typer.Option("tiny-gpt", "--model", help="Built-in job or module:function."),
    data: str = typer.Option(
        None,
        "--data",
        help="Text, Arrow or Parquet file the job trains "
        "on (gpt2-small, llama-tiny), at a path every instance reaches.",
    ),
    steps: int = typer.Option(200, "--steps", parser=params.STEPS, help="Steps to train."),
    checkpoint_dir: str = typer.Option(
        "liveput-checkpoints",
        "--checkpoint-dir",
        help="Directory or fsspec URL every instance reaches.",
    ),
    checkpoint_every: int = typer.Option(10, "--checkpoint-every", parser=params.CHECKPOINT_EVERY),
    capacity: int = typer.Option(
        8, "--capacity", parser=params.INSTANCES, help="Most instances available."
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        parser=params.INSTANCES,
        help="Instances to wait for before the first plan (at most --start-grace seconds).",
    ),
    start_grace_s: float = typer.Option(
        30.0, "--start-grace", parser=params.NON_NEGATIVE_SECONDS, help="Longest wait, seconds."
    ),
    interval_s: float = typer.Option(
        60.0, "--interval", parser=params.SECONDS, help="Seconds between decisions."
    ),
    heartbeat_timeout_s: float = typer.Option(
        3.0,
        "--heartbeat-timeout",
        parser=params.SECONDS,
        help="Seconds of silence before an agent is dead.",
    ),
    policy: str = typer.Option(
        "liveput",
        "--policy",
        help="Policy choosing the configuration by its registered name (liveput, reactive, ...).",
    ),
    provider: str = typer.Option(
        None,
        "--provider",
        help="Rent the instances: emulated (a "
        "spot trace, agents on this machine) or aws (EC2); default: "
        "none, agents started by anything else join.",
    ),
    region: str = typer.Option("us-east-1", "--region", help="AWS region (--provider aws)."),
    instance_types: str = typer.Option(
        None,
        "--instance-types",
        help="Comma-separated "
        "instance types to rent (default with --provider "
        "emulated: c5.xlarge).",
    ),
    spot_max: int = typer.Option(
        0,
        "--spot-max",
        parser=params.SOME_INSTANCES,
        help="Spot instances the provider holds (preempted ones are asked for again).",
    ),
    on_demand_max: int = typer.Option(
        0,
        "--on-demand-max",
        parser=params.SOME_INSTANCES,
        help="On-demand instances the provider holds.",
    ),
    advertise: str = typer.Option(
        None,
        "--advertise",
        help="HOST:PORT or store URL the "
        "rented instances reach the store at (default: --store, "
        "else --listen).",
    ),
    image_id: str = typer.Option(
        None,
        "--image-id",
        help="AMI of the instances (--provider aws; default: the newest Amazon Linux 2023).",
    ),
    trace_path: str = typer.Option(
        None,
        "--trace",
        help="Spot trace the emulated provider replays (default: a generated hour).",
    ),
    deadline_hours: float = typer.Option(
        None,
        "--deadline-hours",
        parser=params.OPTIONAL_HOURS,
        help="Finish the --steps by this many hours at the least cost (with --provider): a "
        "deadline policy decides the on-demand instances (at most --on-demand-max) besides "
        "the --spot-max spot ones.",
    ),
    deadline_policy: str = typer.Option(
        "liveput",
        "--deadline-policy",
        help="Deadline policy (with --deadline-hours): "
        "liveput, uniform-progress, greedy, on-demand or spot-only.",
    ),
    store_wait_s: float = typer.Option(
        120.0,
        "--store-wait",
        parser=params.SECONDS,
        help="Longest wait for --store to answer at start, seconds: a restarted coordinator may "
        "find its etcd restarting (agents ride out as long an outage).",
    ),
    device: str = typer.Option(
        "auto",
        "--device",
        help="What every agent trains on: auto (CUDA where its instance "
        "has it), cpu, cuda or cuda:K; one agent per instance, on one GPU. The job is profiled "
        "on this device here when this machine has it.",
    ),
) -> None:
    """Run the coordinator: run the job's store (a local etcd), decide configurations, publish
    plans. Restarted with the same --etcd-dir, it resumes the job. With --provider, it also
    rents the instances (--spot-max, --on-demand-max) and gives them back at the end."""
    from pathlib import Path

    from liveput.models.jobs import resolve_job
    from liveput.models.validate import check_job
    from liveput.policies.base import Provisioning
    from liveput.runtime.coordinator import CoordinatorConfig
    from liveput.runtime.device import check_device_request
    from liveput.runtime.launch import JobSpec, run_coordinator, through_outage
    from liveput.runtime.store import open_store, parse_host_port
    from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd

    if store is not None and embedded:
        raise LiveputError("give at most one of --store URL and --embedded")
    check_device_request(device, "coordinator")
    job = resolve_job(model, data)
    check_job(job)  # a model mistake: one line naming the layer, before anything starts
    token = _token(token)
    holder = _holder(
        provider,
        region=region,
        instance_types=instance_types,
        spot_max=spot_max,
        on_demand_max=on_demand_max,
        capacity=capacity,
        address=advertise or store or (f"tcp://{listen}" if embedded else listen),
        token=token,
        image_id=image_id,
        trace=trace_path,
        work_dir=Path(etcd_dir).parent / "liveput-provider",
    )
    if holder is not None:
        _check_gpu_use(provider, holder.instance_types, device)
    deadline = None
    if deadline_hours is not None:
        if holder is None:
            raise LiveputError(
                "--deadline-hours needs --provider (emulated or aws): the job "
                "rents its on-demand instances"
            )
        deadline = _deadline(
            holder,
            job,
            steps,
            spot_max,
            on_demand_max,
            deadline_hours,
            deadline_policy,
            trace_path,
            interval_s,
        )
        holder.target = Provisioning(spot_max, 0)  # on-demand: as the deadline policy decides
    etcd = None
    if store is None and not embedded:
        try:
            host_name, port = parse_host_port(f"etcd://{listen}")
        except LiveputError:
            raise LiveputError(f"--listen {listen!r} must be HOST:PORT") from None
        etcd = LocalEtcd(EtcdConfig(Path(etcd_dir), host=host_name, client_port=port))
        etcd.start()
        typer.echo(f"store: {etcd.url} (etcd pid {etcd.pid}, data in {etcd.data_dir})", err=True)
    try:
        url = store or (etcd.url if etcd is not None else f"tcp://{listen}")
        if embedded:
            handle = open_store(url, host=True, token=token)
        else:
            handle = through_outage(
                lambda: open_store(url, token=token, timeout_s=min(30.0, store_wait_s)),
                store_wait_s,
            )
        if holder is not None:
            holder.start_background(interval_s)
        try:
            config = CoordinatorConfig(
                num_steps=steps,
                num_micro_batches=job.num_micro_batches,
                capacity=capacity,
                interval_s=interval_s,
                policy_interval_s=interval_s,
                initial_workers=workers,
                start_grace_s=start_grace_s,
                heartbeat_timeout_s=heartbeat_timeout_s,
                policy=policy,
            )
            if deadline is not None:
                from liveput.cloud.market import HolderMarket

                config = dataclasses.replace(config, policy=deadline_policy)
                spec = JobSpec(model, checkpoint_dir, checkpoint_every, data=data, device=device)
                run_coordinator(
                    handle,
                    spec,
                    config,
                    deadline=deadline[0],
                    market=HolderMarket(holder, spot_max),
                )
                elapsed_h = (time.monotonic() - deadline[1]) / 3600.0
                typer.echo(
                    f"deadline {'met' if elapsed_h <= deadline_hours else 'MISSED'}: "
                    f"done at {elapsed_h:.3f} h of {deadline_hours:g} h",
                    err=True,
                )
            else:
                run_coordinator(
                    handle,
                    JobSpec(model, checkpoint_dir, checkpoint_every, data=data, device=device),
                    config,
                )
        finally:
            if holder is not None:  # the job is done or this process stops: give them back
                released = holder.close()
                holder.provider.close()
                typer.echo(
                    f"released {len(released)} instance(s); spent "
                    f"${holder.provider.bill().usd:.2f}",
                    err=True,
                )
            handle.close()
    finally:
        if etcd is not None:
            etcd.stop()  # the job is done, or this process stops: its data stays on disk
    typer.echo("job done", err=True)


def _check_gpu_use(provider: str, instance_types: tuple[str, ...], device: str) -> None:
    """GPUs of the rented types the agents leave idle: an error with a real provider (the
    bill is real), a warning with the emulated one, whose agents run on this machine."""
    from liveput.catalog import load_catalog
    from liveput.runtime.device import idle_gpus_message, resolve_device

    catalog = load_catalog("aws")
    emulated = provider == "emulated"
    for name in instance_types:
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
        typer.echo(f"warning: {message}", err=True)


def _holder(
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
) -> InstanceHolder | None:
    """The provider and what it holds, checked before anything starts (one-line errors)."""
    if name is None:
        if spot_max or on_demand_max or instance_types:
            raise LiveputError(
                "--spot-max, --on-demand-max and --instance-types need --provider (emulated or aws)"
            )
        return None
    from liveput.cloud.build import ProviderSettings, build_provider
    from liveput.cloud.holding import InstanceHolder
    from liveput.cloud.userdata import AgentBoot
    from liveput.policies.base import Provisioning

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
        trace=trace,
        spot_max=spot_max,
        work_dir=work_dir,
    )
    provider = build_provider(name, settings)
    return InstanceHolder(provider, Provisioning(spot_max, on_demand_max), provider.instance_types)


def _deadline(
    holder: InstanceHolder,
    job: Job,
    steps: int,
    spot_max: int,
    on_demand_max: int,
    deadline_hours: float,
    policy: str,
    trace_path: str | None,
    interval_s: float,
) -> tuple[DeadlineContext, float]:
    """(the deadline policy's context, the monotonic time the deadline counts from), checked
    before anything starts: the provider's prices, the spot it holds (or its trace)."""
    import numpy as np

    from liveput.launch.deadline import DeadlineJob, deadline_context
    from liveput.runtime.planning import profile_job
    from liveput.traces import Trace, read_trace

    types = holder.instance_types
    quote = holder.provider.prices(types[0])[0]
    trace = (
        read_trace(Path(trace_path))
        if trace_path
        else Trace.from_counts("spot-max", np.array([0.0]), np.array([spot_max]), 3600.0)
    )
    context = deadline_context(
        trace,
        profile_job(job),
        DeadlineJob(deadline_hours, on_demand_max, types[0], policy),
        steps,
        interval_s=interval_s,
        prices_usd_per_hour=(quote.spot_usd_per_hour, quote.on_demand_usd_per_hour),
    )
    return context, time.monotonic()


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
    app.command("coordinator")(coordinator)
