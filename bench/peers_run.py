"""Run one system on the emulated cloud for a wall-clock window and record its progress.

Every system meets the same :class:`~liveput.cloud.emulated.EmulatedProvider` replaying the trace at
the same time scale, the same seeded victims, preemption = SIGKILL of every process of the
instance (the agent and whatever it started: :class:`~bench.peers_hosts.TreePopen`) after the
notice lead. Notices (file and signal) go to systems that can use them: liveput's agents;
torchrun and torchft have no notice handling (a SIGUSR1 would kill their agents early), so
theirs get the file only.

A run yields a :class:`SystemRun`: the progress timeline ``(seconds since the cloud started,
samples trained)`` with rollbacks showing as drops, the kills' times, restarts or migrations, the
final loss.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.peers_hosts import BENCH_SUBNET, HostPool, shaped_hosts, start_tree
from bench.peers_storage import object_store
from liveput.cloud.emulated import EmulatedProvider, EmulatedProviderConfig, SpotModel
from liveput.cloud.loss_report import check_loss_signal_delay
from liveput.cloud.processes import Launcher, LaunchSpec
from liveput.cloud.replay import trace_schedule
from liveput.launch.local import (
    LauncherFactory,
    LocalTrainingConfig,
    Progress,
    run_local_training,
)
from liveput.models.jobs import resolve_job
from liveput.runtime.clock import MonotonicClock
from liveput.runtime.entry import LOG_FORMAT
from liveput.runtime.launch import DEFAULT_COMM_TIMEOUT_S
from liveput.testbed import free_port
from liveput.traces import Trace

REPO = Path(__file__).resolve().parent.parent

TORCHRUN_WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    # Each worker group a store of its own: torchrun's agents otherwise share one store across
    # restarts, isolated by a restart count each agent keeps for itself, and a restart after a
    # membership change read the last group's addresses from it (gloo's connectFullMesh
    # refused, every round; pytorch/pytorch#135712, the opt-out its maintainers give).
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}
"""What every torchrun peer's agents and workers run with, beside the machine's environment."""


@dataclass(frozen=True)
class RunSettings:
    """What every system of one comparison shares."""

    job: str = "tiny-gpt"
    """Built-in liveput job (model, data order, global batch, optimizer and learning rate)."""
    time_scale: float = 4.0
    """Trace seconds per wall second."""
    window_s: float = 75.0
    """Wall seconds each system trains, from the emulated cloud's start."""
    notice_lead_s: float = 120.0
    """Preemption notice lead, trace seconds (scaled like the trace)."""
    notice_margin_s: float | None = 5.0
    """liveput's ``--notice-margin``, wall seconds: a noticed instance trains until this long
    before its end; None: ``auto``, the product's default (twice the move it measured). This
    job moves in well under a second here (``bench runtime``), and ``bench chaos`` measured a
    downtime of 0.06 s median, 2.5 s p95 for a noticed kill on the loaded machine, so a user
    who measured would set 5 s, as the torchrun peer gets a careful user's rendezvous
    settings."""
    checkpoint_every: int = 10
    """K: steps between checkpoints (liveput's runtime and the peers alike)."""
    seed: int = 20
    """Seed of the emulated cloud's victims."""
    work_dir: str = ""
    """Where logs, checkpoints and progress files go (empty: a temporary directory)."""
    instance_memory_gb: float | None = None
    """Each instance's memory, GB: liveput plans only stages that fit it (``--instance-memory-gb``)
    and the FSDP peer waits for enough instances that its shards fit it; None: no budget."""
    link_mbit: float | None = None
    """Each instance's link, Mbit/s each way: instances run on network-namespace hosts
    (:mod:`bench.peers_hosts`); None: every instance on this machine's loopback."""
    subnet: str = BENCH_SUBNET
    """First three octets of those hosts' addresses (two runs at once on one machine need two)."""
    object_store: bool = False
    """Checkpoints in an S3 bucket on the hosts' gateway, written and read through each
    instance's shaped link (:mod:`bench.peers_storage`); False: a local folder. Needs
    ``link_mbit``."""

    loss_signal_delay_s: float | None = 30.0
    """Trace seconds from an instance's end until the emulated provider's list reports it
    terminated (the same cloud for every system; only liveput reads that list, the peers have
    no interface to be told of a loss: ``docs/peers.md``, "Signals"). None: never reported,
    liveput then learns of a loss from its heartbeats alone. No provider documents the lag; 30 s
    is the slow side of what they document, so that liveput is not credited with a signal
    sooner than a cloud gives:

    - Compute Engine: "there will be 120 seconds between GCE ACPI G2 Soft Off and ACPI G3
      Mechanical Off for Standard VMs and 30 seconds for Spot VMs" (the API's
      ``Scheduling.skipGuestOsShutdown``,
      https://pub.dev/documentation/googleapis/latest/compute_v1/Scheduling/skipGuestOsShutdown.html):
      a preempted Spot VM lists ``STOPPING`` ("currently stopping (either being deleted or
      killed)") for up to 30 s before ``TERMINATED``
      (https://cloud.google.com/dotnet/docs/reference/Google.Cloud.Compute.V1/latest/Google.Cloud.Compute.V1.Instance.Types.Status);
    - EC2: "The Amazon EC2 API follows an eventual consistency model", its advice to callers:
      "run the Describe command repeatedly, starting with a couple of seconds of wait time, and
      increasing gradually up to a few minutes of wait time"
      (https://docs.amazonaws.cn/ec2/latest/devguide/eventual-consistency.html); EventBridge,
      which carries its state-change events, promises "best effort or durable delivery
      attempts" and no latency
      (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-service-event-delivery-level.html).
    """

    stop_at_step: int | None = None
    """End the run once the job has committed this many steps and a checkpoint of them is
    complete (None: train the whole window; the window bounds the run either way): a check
    that needs a few steps and a checkpoint takes them and ends instead of training on to the
    window's end. At least ``checkpoint_every``."""

    def __post_init__(self) -> None:
        if (
            self.time_scale <= 0
            or self.window_s <= 0
            or self.checkpoint_every < 1
            or (self.notice_margin_s is not None and self.notice_margin_s < 0)
            or (self.instance_memory_gb is not None and not self.instance_memory_gb > 0)
            or (self.link_mbit is not None and not self.link_mbit > 0)
            or (self.stop_at_step is not None and self.stop_at_step < self.checkpoint_every)
        ):
            raise ValueError(
                "peers: time scale, window, checkpoint interval, memory and link rate must be "
                "positive, the notice margin >= 0, a step to stop at >= the checkpoint interval"
            )
        check_loss_signal_delay(self.loss_signal_delay_s, "peers")
        if self.object_store and self.link_mbit is None:
            raise ValueError("peers: the object store sits behind shaped links: set a link rate")


@dataclass
class SystemRun:
    """What one system did in the window."""

    system: str
    samples: int
    """Samples of the last step standing at the window's end (work rolled back is not counted)."""
    timeline: list[tuple[float, int]]
    """(seconds since the cloud started, samples trained) as progress was seen."""
    kills_s: list[float]
    """When the cloud SIGKILLed an instance, seconds since it started."""
    launches_s: list[float] = field(default_factory=list)
    """When the cloud added an instance (not the initial ones)."""
    restarts: int = 0
    """Worker-group restarts (torchrun) or plans after the first (liveput: migrations)."""
    final_loss: float | None = None
    extra: dict = field(default_factory=dict)
    """System-specific counts (liveput: migrations by kind)."""
    initial_instances: int = 0
    """Instances the cloud held at its start (what tells a total loss from a loss)."""
    stopped: dict | None = None
    """Why it trained nothing or stopped before the window's end, from its own logs
    (:class:`bench.peers_stops.Stop` as JSON); None: it trained to the end."""

    def downtimes_s(self) -> list[float]:
        """Per kill after the first step: from the last progress before it to the first
        progress past where the job was (so redone work counts as down time); the window's end
        if it never got there. Kills before the first step (start-up) are left out."""
        out = []
        first = next((t for t, s in self.timeline if s > 0), None)
        for kill_s in self.kills_s:
            if first is None or kill_s < first:
                continue
            before = [(t, s) for t, s in self.timeline if t <= kill_s]
            last_t, last_samples = before[-1] if before else (0.0, 0)
            after = [t for t, s in self.timeline if t > kill_s and s > last_samples]
            end = after[0] if after else (self.timeline[-1][0] if self.timeline else kill_s)
            out.append(max(end - last_t, 0.0))
        return out

    def steps(self) -> list[tuple[float, int]]:
        """(seconds, samples) of each point of the timeline where the samples grew: a step
        (a redone one after a rollback included)."""
        return [
            (t, s) for (t, s), (_, before) in zip(self.timeline[1:], self.timeline) if s > before
        ]

    def rate(self) -> float:
        """Samples per second from the run's first step to its last: start-up left out, however
        long it took (a third of a 30-s run was not past the 20-s start-up of eight pipeline
        instances, and their rate came out 40 % low). A system's own throughput; the rate of an
        instance count for the bound and the simulator also leaves the first steps out
        (:func:`bench.peers_rates.steady_rate`)."""
        steps = self.steps()
        if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
            return 0.0
        return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])


def tree_launcher(
    template: Sequence[str], env: Mapping[str, str], log_dir: Path, cwd: Path = REPO
) -> Launcher:
    """Like :func:`liveput.cloud.processes.command_launcher`, each instance's process a
    :class:`~bench.peers_hosts.TreePopen`."""

    def launch(spec: LaunchSpec) -> subprocess.Popen:
        argv = [part.format(instance_id=spec.instance_id) for part in template]
        return start_tree(argv, env, spec, log_dir, cwd)

    return launch


class WindowOver(Exception):
    """The window ended (raised from the progress callback to stop a liveput run)."""


def replayed_cloud(
    trace: Trace, launcher: Launcher, notice_dir: Path, settings: RunSettings
) -> EmulatedProvider:
    """The emulated provider replaying ``trace`` as ``liveput train`` does (signal-less notices:
    the other systems have no notice handler), its list reporting ends late as liveput's does
    (``settings.loss_signal_delay_s``; no peer reads it)."""
    return EmulatedProvider(
        trace,
        MonotonicClock(),
        EmulatedProviderConfig(
            time_scale=settings.time_scale,
            notice_lead_s=settings.notice_lead_s,
            seed=settings.seed,
            spot=SpotModel.REPLAY,
            loss_signal_delay_s=settings.loss_signal_delay_s,
        ),
        launcher=launcher,
        notice_dir=notice_dir,
        notice_signal=None,
    )


def scheduled_times(trace: Trace, settings: RunSettings) -> tuple[list[float], list[float]]:
    """(kills, additions) in wall seconds from the cloud's start: the cloud carries out the
    trace's schedule at these times (within its 50-ms poll)."""
    _, removals, additions, _ = trace_schedule(trace)
    return (
        [t / settings.time_scale for t in sorted(removals)],
        [t / settings.time_scale for t in sorted(additions)],
    )


@contextlib.contextmanager
def placement(settings: RunSettings, instances: int) -> Iterator[HostPool | None]:
    """Hosts for ``instances`` with shaped links where ``settings`` asks for them, else None
    (every instance on this machine's loopback)."""
    if settings.link_mbit is None:
        yield None
        return
    with shaped_hosts(instances, settings.link_mbit, settings.subnet) as hosts:
        yield HostPool(hosts)


@contextlib.contextmanager
def checkpoint_location(settings: RunSettings, pool: HostPool | None, work: Path) -> Iterator[str]:
    """Where one run's checkpoints go: ``<work>/checkpoints``, or with ``object_store`` a
    prefix of a bucket on the hosts' gateway."""
    if not settings.object_store or pool is None:
        yield str(work / "checkpoints")
        return
    with object_store(pool.hosts.gateway_address, work / "logs") as bucket:
        yield f"{bucket}/{work.name}/checkpoints"


def run_liveput(
    trace: Trace, settings: RunSettings, work: Path, policy: str, system: str
) -> SystemRun:
    """liveput's runtime (``liveput train``'s coordinator, agents and emulated cloud)."""
    batch = resolve_job(settings.job).global_batch_size
    timeline: list[tuple[float, int]] = []
    state: dict = {"loss": None, "plans": 0}

    def progress(update: Progress) -> None:
        # From the cloud's start, as the other systems' windows (the coordinator is built
        # after it: the first callback comes seconds later).
        elapsed = update.cloud_elapsed_s
        timeline.append((elapsed, update.step * batch))
        state["loss"] = update.loss if update.loss is not None else state["loss"]
        state["plans"] = update.events
        checkpointed = update.checkpoint_step is not None
        if elapsed >= settings.window_s or (checkpointed and reached(settings, update.step)):
            raise WindowOver

    workers = max(1, trace.max_count())
    with placement(settings, workers) as pool, checkpoint_location(settings, pool, work) as where:
        if pool is None:
            store_url, factory = None, None
        else:
            # The store on the gateway (outside every instance), each agent at its host's address.
            store_url = (
                f"tcp://{pool.hosts.gateway_address}:{free_port(pool.hosts.gateway_address)}"
            )

            def factory(template: list[str], env: Mapping[str, str], log_dir: Path) -> Launcher:
                return pool.launcher([*template, "--host", "{host}"], env, log_dir, REPO)

        _train_liveput(trace, settings, work, where, policy, progress, workers, store_url, factory)
    kills, launches = scheduled_times(trace, settings)
    return SystemRun(
        system,
        timeline[-1][1] if timeline else 0,
        timeline,
        kills,
        launches,
        restarts=max(state["plans"], 0),
        final_loss=state["loss"],
        initial_instances=trace_schedule(trace)[0],
    )


def _train_liveput(
    trace: Trace,
    settings: RunSettings,
    work: Path,
    checkpoints: str,
    policy: str,
    progress: Callable[[Progress], None],
    workers: int,
    store_url: str | None,
    factory: LauncherFactory | None,
) -> None:
    config = LocalTrainingConfig(
        model=settings.job,
        workers=workers,
        steps=10_000_000,
        time_scale=settings.time_scale,
        notice_lead_s=settings.notice_lead_s,
        notice_margin_s=settings.notice_margin_s,
        checkpoint_dir=checkpoints,
        checkpoint_every=settings.checkpoint_every,
        seed=settings.seed,
        log_dir=str(work / "logs"),
        timeout_s=settings.window_s + 600,
        policy=policy,
        # Each instance's agent imports torch as it boots, as the other systems' processes do.
        fork_agents=False,
        instance_memory_gb=settings.instance_memory_gb,
        # The planner told the links' rate, as a profile of the cloud's instance type would.
        network_gbps=None if settings.link_mbit is None else settings.link_mbit / 1000,
        store_url=store_url,
        # Told of a loss when the provider's list reports it, as the peers' cloud would.
        loss_signal_delay_s=settings.loss_signal_delay_s,
    )
    with coordinator_log(work / "logs" / "coordinator.log"):
        try:
            run_local_training(config, trace, progress, launcher_factory=factory)
        except WindowOver:
            pass


@contextlib.contextmanager
def coordinator_log(path: Path) -> Iterator[None]:
    """The coordinator's decisions (INFO and up, timestamped) in ``path`` while the block runs:
    liveput's own log of a run, beside its agents', as each peer keeps its agents' logs. The
    console still shows warnings only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter(LOG_FORMAT))
    to_console = logging.StreamHandler()
    to_console.setLevel(logging.WARNING)
    to_console.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    logger = logging.getLogger("liveput")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(to_file)
    logger.addHandler(to_console)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(to_file)
        logger.removeHandler(to_console)
        logger.setLevel(level)
        logger.propagate = propagate
        to_file.close()


def reached(settings: RunSettings, steps: int) -> bool:
    """Whether a job that committed ``steps`` steps is done (``settings.stop_at_step``). A peer
    saves its checkpoint before it writes the step's progress line, so its checkpoint of step
    ``checkpoint_every`` is complete when its progress says so."""
    return settings.stop_at_step is not None and steps >= settings.stop_at_step


def steps_in(progress_file: Path) -> int:
    """Steps a peer's progress lines say it committed so far (0 before the first): its
    timeline's samples at a batch of one."""
    return read_progress(progress_file, 0.0, 1)[0][-1][1]


def read_progress(
    path: Path, start_unix_s: float, batch: int
) -> tuple[list[tuple[float, int]], int, float | None]:
    """(timeline, worker-group starts, last loss) from a peer's progress lines."""
    timeline: list[tuple[float, int]] = [(0.0, 0)]
    starts, loss = 0, None
    if not path.exists():
        return timeline, starts, loss
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if "start" in record:
            starts += 1
        else:
            timeline.append((record["t"] - start_unix_s, (record["step"] + 1) * batch))
            loss = record["loss"]
    return timeline, starts, loss


def run_torchrun(
    trace: Trace,
    settings: RunSettings,
    work: Path,
    module: str = "bench.peers_ddp",
    system: str = "torchrun",
    minimum: int = 1,
    worker_args: Sequence[str] = (),
    comm_timeout_s: float = DEFAULT_COMM_TIMEOUT_S,
) -> SystemRun:
    """A torchrun peer (``module``: :mod:`bench.peers_ddp`, :mod:`bench.peers_fsdp` or
    :mod:`bench.peers_pp`), one torchrun agent per instance, elastic over a c10d store this
    process hosts (not on any instance); it trains on ``minimum`` instances or more.
    ``worker_args``: more of the worker's arguments, ``{instance_id}`` in them replaced by the
    instance's (``--notice-file .../{instance_id}.notice.json``); ``comm_timeout_s``: its
    process group's, the one liveput's agents have for the same job and links."""
    maximum = max(1, trace.max_count())
    worker_args = [*worker_args, "--comm-timeout-s", f"{comm_timeout_s:g}"]
    with placement(settings, maximum) as pool, checkpoint_location(settings, pool, work) as where:
        return _run_torchrun(
            trace, settings, work, where, module, system, minimum, pool, worker_args
        )


def _run_torchrun(
    trace: Trace,
    settings: RunSettings,
    work: Path,
    checkpoints: str,
    module: str,
    system: str,
    minimum: int,
    pool: HostPool | None,
    worker_args: Sequence[str] = (),
) -> SystemRun:
    from torch.distributed import TCPStore

    address = "127.0.0.1" if pool is None else pool.hosts.gateway_address
    store = TCPStore(address, 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    progress_file = work / "progress.jsonl"
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "notices").mkdir(parents=True, exist_ok=True)
    maximum = max(1, trace.max_count())
    template = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={min(minimum, maximum)}:{maximum}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={address}:{store.port}",
        "--rdzv-id=peers",
        "--max-restarts=1000000",
        "--local-addr=127.0.0.1" if pool is None else "--local-addr={host}",
        # A careful user's settings for short runs: close a round 1 s after the minimum is
        # there (default 30 s), declare a silent node dead after 3 missed 1-s keep-alives.
        "--rdzv-conf=is_host=false,last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=3",
        "-m",
        module,
        "--job",
        settings.job,
        "--checkpoint-dir",
        checkpoints,
        "--checkpoint-every",
        str(settings.checkpoint_every),
        "--progress",
        str(progress_file),
        *worker_args,
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
        ),
        **TORCHRUN_WORKER_ENV,
    }
    if pool is None:
        launcher = tree_launcher(template, env, work / "logs")
    else:
        # Gloo binds to the host's own interface (every host names it eth0).
        env["GLOO_SOCKET_IFNAME"] = "eth0"
        launcher = pool.launcher(template, env, work / "logs", REPO)
    cloud = replayed_cloud(trace, launcher, work / "notices", settings)
    start_unix = time.time()
    start = time.monotonic()
    cloud.start_background()
    try:
        while time.monotonic() - start < settings.window_s and not reached(
            settings, steps_in(progress_file)
        ):
            time.sleep(0.2)
    finally:
        cloud.close()
    return progress_run(system, trace, settings, progress_file, start_unix)


def progress_run(
    system: str, trace: Trace, settings: RunSettings, progress_file: Path, start_unix_s: float
) -> SystemRun:
    """What a peer did in the window, from its progress lines (``start_unix_s``: the cloud's
    start)."""
    batch = resolve_job(settings.job).global_batch_size
    kills, launches = scheduled_times(trace, settings)
    timeline, starts, loss = read_progress(progress_file, start_unix_s, batch)
    timeline = [(t, s) for t, s in timeline if t <= settings.window_s]
    return SystemRun(
        system,
        timeline[-1][1],
        timeline,
        kills,
        launches,
        restarts=max(starts - 1, 0),
        final_loss=loss,
        initial_instances=trace_schedule(trace)[0],
    )


def scratch(settings: RunSettings, name: str) -> Path:
    """A fresh directory for one run."""
    base = Path(settings.work_dir) if settings.work_dir else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"peers-{name}-", dir=base))
