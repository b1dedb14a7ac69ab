"""`liveput coordinator` (one per job, on a real machine): the job's store, its plans and, with
a provider, the instances it rents."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from liveput.cli import params
from liveput.errors import LiveputError
from liveput.launch.assemble import DEFAULTS, JobRequest, assemble_job
from liveput.runtime import keys

if TYPE_CHECKING:
    from liveput.launch.remote import RemoteRun
    from liveput.runtime.store import Store


Listen = Annotated[
    str,
    typer.Option(
        "--listen",
        help="HOST:PORT the store this coordinator runs listens on (its etcd; the TCPStore with "
        "--embedded); ignored with --store.",
    ),
]
UseStore = Annotated[
    str | None,
    typer.Option("--store", parser=params.store_url, help="Use this store (etcd, tcp); run none."),
]
EtcdDir = Annotated[
    str,
    typer.Option(
        "--etcd-dir",
        help="Directory of the etcd this coordinator runs (data, log, pid); a restarted "
        "coordinator given the same one resumes the job.",
    ),
]
Embedded = Annotated[
    bool,
    typer.Option(
        "--embedded",
        metavar=params.FLAG,
        help="Host a TCPStore in this process instead of etcd (no etcd needed; the job ends if "
        "this process does).",
    ),
]
Data = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="Text, Arrow or Parquet file the job trains on (gpt2-small, llama-tiny), at a path "
        "every instance reaches.",
    ),
]
Steps = Annotated[int, typer.Option("--steps", parser=params.STEPS, help="Steps to train.")]
CheckpointDir = Annotated[
    str, typer.Option("--checkpoint-dir", help="Directory or fsspec URL every instance reaches.")
]
CheckpointEvery = Annotated[int, typer.Option("--checkpoint-every", parser=params.CHECKPOINT_EVERY)]
Capacity = Annotated[
    int, typer.Option("--capacity", parser=params.INSTANCES, help="Most instances available.")
]
Workers = Annotated[
    int,
    typer.Option(
        "--workers",
        parser=params.INSTANCES,
        help="Instances to wait for before the first plan (at most --start-grace seconds).",
    ),
]
StartGrace = Annotated[
    float,
    typer.Option(
        "--start-grace", parser=params.NON_NEGATIVE_SECONDS, help="Longest wait, seconds."
    ),
]
Interval = Annotated[
    float,
    typer.Option("--interval", parser=params.SECONDS, help="Seconds between decisions."),
]
HeartbeatTimeout = Annotated[
    float,
    typer.Option(
        "--heartbeat-timeout",
        parser=params.SECONDS,
        help="Seconds of silence before an agent is dead.",
    ),
]
Policy = Annotated[
    str,
    typer.Option(
        "--policy",
        help="Policy choosing the configuration by its registered name (liveput, reactive, ...).",
    ),
]
ProviderName = Annotated[
    str | None,
    typer.Option(
        "--provider",
        help="Rent the instances: emulated (a spot trace, agents on this machine) or aws (EC2); "
        "default: none, agents started by anything else join.",
    ),
]
Region = Annotated[str, typer.Option("--region", help="AWS region (--provider aws).")]
InstanceTypes = Annotated[
    str | None,
    typer.Option(
        "--instance-types",
        parser=params.INSTANCE_TYPES,
        help="Comma-separated instance types to rent (default with --provider emulated: "
        "c5.xlarge).",
    ),
]
SpotMax = Annotated[
    int,
    typer.Option(
        "--spot-max",
        parser=params.SOME_INSTANCES,
        help="Spot instances the provider holds (preempted ones are asked for again).",
    ),
]
OnDemandMax = Annotated[
    int,
    typer.Option(
        "--on-demand-max",
        parser=params.SOME_INSTANCES,
        help="On-demand instances the provider holds.",
    ),
]
Advertise = Annotated[
    str | None,
    typer.Option(
        "--advertise",
        help="HOST:PORT or store URL the rented instances reach the store at (default: "
        "--store, else --listen).",
    ),
]
ImageId = Annotated[
    str | None,
    typer.Option(
        "--image-id",
        help="AMI of the instances (--provider aws; default: the newest Amazon Linux 2023).",
    ),
]
InstanceProfile = Annotated[
    str | None,
    typer.Option(
        "--instance-profile",
        help="IAM instance profile of the instances (--provider aws, required): its role "
        "reads the job token from SSM Parameter Store (docs/providers.md gives the policy).",
    ),
]
TracePath = Annotated[
    str | None,
    typer.Option(
        "--trace", help="Spot trace the emulated provider replays (default: a generated hour)."
    ),
]
DeadlineHours = Annotated[
    float | None,
    typer.Option(
        "--deadline-hours",
        parser=params.OPTIONAL_HOURS,
        help="Finish the --steps by this many hours at the least cost (with --provider): a "
        "deadline policy decides the on-demand instances (at most --on-demand-max) besides "
        "the --spot-max spot ones.",
    ),
]
StoreWait = Annotated[
    float,
    typer.Option(
        "--store-wait",
        "--connect-timeout",
        parser=params.SECONDS,
        help="Longest wait for --store to answer at start, seconds: a restarted coordinator may "
        "find its etcd restarting (agents ride out as long an outage); then it gives up.",
    ),
]
Device = Annotated[
    str,
    typer.Option(
        "--device",
        help="What every agent trains on: auto (CUDA where its instance has it), cpu, cuda or "
        "cuda:K; one agent per instance, on one GPU. The job is profiled on this device here "
        "when this machine has it.",
    ),
]


def coordinator(
    listen: Listen = "127.0.0.1:29400",
    store: UseStore = None,
    etcd_dir: EtcdDir = "liveput-etcd",
    embedded: Embedded = False,
    token: params.Token = None,
    model: params.Model = "tiny-gpt",
    data: Data = None,
    steps: Steps = 200,
    checkpoint_dir: CheckpointDir = "liveput-checkpoints",
    checkpoint_every: CheckpointEvery = DEFAULTS.checkpoint_every,
    capacity: Capacity = 8,
    workers: Workers = 1,
    start_grace_s: StartGrace = DEFAULTS.start_grace_s,
    interval_s: Interval = DEFAULTS.interval_s,
    heartbeat_timeout_s: HeartbeatTimeout = DEFAULTS.heartbeat_timeout_s,
    notice_margin_s: params.NoticeMargin = DEFAULTS.notice_margin_s,
    policy: Policy = DEFAULTS.policy,
    provider: ProviderName = None,
    region: Region = "us-east-1",
    instance_types: InstanceTypes = None,
    spot_max: SpotMax = 0,
    on_demand_max: OnDemandMax = 0,
    advertise: Advertise = None,
    image_id: ImageId = None,
    instance_profile: InstanceProfile = None,
    trace_path: TracePath = None,
    deadline_hours: DeadlineHours = None,
    deadline_policy: params.DeadlinePolicy = DEFAULTS.policy,
    store_wait_s: StoreWait = 120.0,
    device: Device = DEFAULTS.device,
    instance_memory_gb: params.InstanceMemory = None,
) -> None:
    """Run the coordinator: run the job's store (a local etcd), decide configurations, publish
    plans. Restarted with the same --etcd-dir, it resumes the job. With --provider, it also
    rents the instances (--spot-max, --on-demand-max) and gives them back at the end."""
    from liveput.launch.remote import (
        assemble_deadline_job,
        build_holder,
        check_gpu_use,
        run_remote_job,
    )
    from liveput.models.jobs import resolve_job
    from liveput.models.validate import check_job
    from liveput.runtime.device import check_device_request

    if store is not None and embedded:
        raise LiveputError("give at most one of --store URL and --embedded")
    check_device_request(device, "coordinator")
    request = JobRequest(
        model,
        steps,
        checkpoint_dir,
        data=data,
        checkpoint_every=checkpoint_every,
        device=device,
        policy=policy,
        capacity=capacity,
        initial_workers=workers,
        interval_s=interval_s,
        start_grace_s=start_grace_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        notice_margin_s=notice_margin_s,
        instance_memory_gb=instance_memory_gb,
    )
    job = resolve_job(model, data)  # an unknown model: one line, before anything starts
    check_job(job)  # a model mistake: one line naming the layer, before anything starts
    # A restart may resume where it cannot write checkpoints now (a full disk): said once the
    # store shows whether it holds the job.
    unwritable = _check_checkpoint_dir(checkpoint_dir, store, embedded, etcd_dir)
    token = params.required_token(token)
    address = advertise or store or (f"tcp://{listen}" if embedded else listen)
    holder = build_holder(
        provider, **_rent_options(region, instance_types, spot_max, on_demand_max, capacity),
        address=address, token=token, image_id=image_id, instance_profile=instance_profile,
        trace=trace_path, work_dir=Path(etcd_dir).parent / "liveput-provider",
    )  # fmt: skip
    for warning in check_gpu_use(provider, holder, device):
        typer.echo(f"warning: {warning}", err=True)
    assembled = (
        assemble_job(request)
        if deadline_hours is None
        else assemble_deadline_job(
            holder, job, request, (deadline_hours, on_demand_max, deadline_policy), trace_path
        )
    )
    started_unix_s = time.time()  # a deadline counts from the job's first coordinator
    with _job_store(listen, store, etcd_dir, embedded, token, store_wait_s) as handle:
        _resume_unwritable(handle, unwritable)
        _say(run_remote_job(handle, assembled, holder, spot_max))
        kept = handle.get(keys.coordinator_deadline())
        if kept is not None:
            started_unix_s = json.loads(kept)["started_unix_s"]
    _say_deadline(started_unix_s, deadline_hours)
    typer.echo("job done", err=True)


def _resume_unwritable(handle: Store, unwritable: LiveputError | None) -> None:
    """A checkpoint folder that cannot be written now: a restart (the store holds the job)
    resumes with a warning; a first start is refused."""
    if unwritable is None:
        return
    if handle.get(keys.job_spec()) is None:  # no job there to resume: a first start
        raise unwritable
    typer.echo(
        f"warning: {unwritable}; resuming the job, whose checkpoints fail until then", err=True
    )


def _rent_options(
    region: str, instance_types: str | None, spot_max: int, on_demand_max: int, capacity: int
) -> dict:
    """What the provider holds and where (``build_holder``'s keywords)."""
    return {
        "region": region,
        "instance_types": instance_types,
        "spot_max": spot_max,
        "on_demand_max": on_demand_max,
        "capacity": capacity,
    }


def _say_deadline(started_unix_s: float, deadline_hours: float | None) -> None:
    """Whether a deadline job met its deadline, counted from its first coordinator."""
    if deadline_hours is None:
        return
    elapsed_h = (time.time() - started_unix_s) / 3600.0
    typer.echo(
        f"deadline {'met' if elapsed_h <= deadline_hours else 'MISSED'}: "
        f"done at {elapsed_h:.3f} h of {deadline_hours:g} h",
        err=True,
    )


def _say(ran: RemoteRun) -> None:
    if ran.checkpoints_failed:
        typer.echo(f"warning: checkpoints failed: {ran.checkpoints_failed}", err=True)
    if ran.released is not None:
        typer.echo(f"released {ran.released} instance(s); spent ${ran.usd:.2f}", err=True)


def _check_checkpoint_dir(
    checkpoint_dir: str, store: str | None, embedded: bool, etcd_dir: str
) -> LiveputError | None:
    """Refuse an unwritable --checkpoint-dir on a first start; where the coordinator may be a
    restart (an earlier coordinator's etcd data, or an external store), the error to say once
    the store shows it holds the job (None: writable)."""
    from liveput.files import check_writable_url

    try:
        check_writable_url(checkpoint_dir, "coordinator: --checkpoint-dir")
    except LiveputError as error:
        restart = store is not None or (Path(etcd_dir) / "data" / "member").is_dir()
        if embedded or not restart:
            raise
        return error
    return None


@contextmanager
def _job_store(
    listen: str,
    store: str | None,
    etcd_dir: str,
    embedded: bool,
    token: str,
    store_wait_s: float,
) -> Iterator[Store]:
    """The job's store: ``store``, else a TCPStore hosted here (``embedded``), else a local etcd
    started here (stopped at the end; its data stays on disk, so a restart resumes the job)."""
    from liveput.launch.job_store import StorePlace, open_job_store
    from liveput.runtime.store import parse_host_port
    from liveput.runtime.store.etcd_server import EtcdConfig

    if embedded:
        place = StorePlace(store or f"tcp://{listen}", host=True)
    elif store is not None:
        place = StorePlace(store, wait_s=store_wait_s)
    else:
        try:
            host_name, port = parse_host_port(f"etcd://{listen}")
        except LiveputError:
            raise LiveputError(f"--listen {listen!r} must be HOST:PORT") from None
        etcd = EtcdConfig(Path(etcd_dir), host=host_name, client_port=port)
        place = StorePlace(etcd=etcd, wait_s=store_wait_s)
    with open_job_store(place, token) as opened:
        if opened.etcd is not None:
            where = opened.etcd
            typer.echo(
                f"store: {where.url} (etcd pid {where.pid}, data in {where.data_dir})", err=True
            )
        yield opened.store  # the job is done, or this process stops: etcd's data stays on disk


def register(app: typer.Typer) -> None:
    app.command("coordinator")(coordinator)
