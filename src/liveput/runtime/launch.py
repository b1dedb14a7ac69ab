"""Starting the runtime's processes: an agent on an instance, a coordinator on one machine.

The coordinator publishes the job's spec in the store (``job/spec``: the job's name, the
checkpoint directory, K); an agent needs only the store's address and the job token, and learns
everything else from there. Every value the agents read is signed with the token
(:class:`~liveput.runtime.store.SignedStore`), so an agent without it is refused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import torch

from liveput.errors import LiveputError
from liveput.models.jobs import resolve_empty_job, resolve_job
from liveput.models.training import TrainingConfig
from liveput.perf.types import check_instance_memory_gb, with_instance_memory
from liveput.runtime import keys
from liveput.runtime.agent import Agent, AgentConfig, AgentState
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.copy_keeper import CopyKeeper
from liveput.runtime.device import check_device_request, describe_device, resolve_device
from liveput.runtime.engine import Engine, EngineConfig
from liveput.runtime.evaluation import Evaluation
from liveput.runtime.instance_env import (
    INSTANCE_ID_ENV,
    MARKET_ENV,
    NOTICE_FILE_ENV,
    NOTICE_SOURCES,
    instance_number,
)
from liveput.runtime.notices import (
    AwsNoticeWatcher,
    EmulatorNoticeWatcher,
    GcpNoticeWatcher,
    NoticeWatcher,
    SignalNoticeWatcher,
)
from liveput.runtime.rendezvous import StoreRendezvous
from liveput.runtime.store import Store, open_store
from liveput.runtime.store.base import StoreAddressError

if TYPE_CHECKING:
    from liveput.perf.types import ModelProfile
    from liveput.policies.deadline import DeadlineContext
    from liveput.runtime.coordinator import Coordinator, CoordinatorConfig, MarketView

LOG = logging.getLogger(__name__)


DEFAULT_COMM_TIMEOUT_S = 30.0
"""A process-group operation's timeout where nothing says the links are slow, seconds."""


def comm_timeout_s(model_state_bytes: float, network_gbps: float | None) -> float:
    """The timeout of one process-group operation for a job whose layers hold
    ``model_state_bytes`` in all (weights and optimizer state), on links of ``network_gbps``.

    A migration sends each layer's state as one message, an instance's layers one after the
    other over its one link, so the receive of its last layer waits for all of them: at most
    the whole model's state, ``t_move = 8 * model_state_bytes / (network_gbps * 1e9)`` seconds.
    The timeout is twice that (the same link carries checkpoint uploads and activations
    meanwhile), never under :data:`DEFAULT_COMM_TIMEOUT_S`; links not given (None): the
    default. gpt2-small (1.03 GB with Adam's moments) at 100 Mbit/s: 165 s; a stage of it was
    measured past the default there, next to a checkpoint's upload."""
    if network_gbps is None:
        return DEFAULT_COMM_TIMEOUT_S
    move_s = 8 * model_state_bytes / (network_gbps * 1e9)
    return max(DEFAULT_COMM_TIMEOUT_S, 2 * move_s)


@dataclass(frozen=True)
class JobSpec:
    """What every agent must agree on, published by the coordinator."""

    job: str
    """Built-in job name or ``module:function`` returning a :class:`liveput.Job`."""
    checkpoint_dir: str
    """Local directory or fsspec URL of the checkpoints (every agent must reach it)."""
    checkpoint_every: int = 10
    """K: checkpoint every K steps."""
    device: str = "cpu"
    """``auto`` (CUDA where the instance has it), ``cpu``, ``cuda`` or ``cuda:K``: each agent
    trains on one device (:mod:`liveput.runtime.device`); one asked for CUDA without any exits
    with a one-line error. The entry points (train, coordinator, the job file) default to
    ``auto``; a spec published without one (an older coordinator) means the CPU."""
    shared_gpu: bool = False
    """The agents share this machine (``liveput train``): on CUDA they spread over its GPUs
    and communicate over gloo through CPU memory (NCCL refuses two ranks on one GPU)."""
    store_outage_s: float = 120.0
    """How long an agent lives through a store outage before it exits by itself, seconds
    (``liveput train`` sets the coordinator's heartbeat timeout: its store dies with it)."""
    keep_checkpoints: int = 2
    """K: only the newest K complete checkpoints stay on disk."""
    training: dict | None = None
    """The job's training options (``TrainingConfig.to_dict``) when the command line set
    them; None: the job's own."""
    data: str | None = None
    """The file a built-in job that takes ``--data`` trains on (every agent must reach it)."""
    notice_margin_s: float | None = None
    """The coordinator's ``notice_margin_s``, wall seconds (agents leave by it, until a plan
    says its own); None: ``auto``, each plan's."""
    instance_memory_gb: float | None = None
    """The job's per-instance memory budget, GB: each agent refuses a stage predicted over it
    (:mod:`liveput.runtime.stage_memory`), with the job's profile kept in the store; None:
    none (a spec published without one, by an older coordinator, has none)."""
    comm_timeout_s: float = DEFAULT_COMM_TIMEOUT_S
    """Timeout of one process-group operation, seconds (:func:`comm_timeout_s`: long enough
    to move the model's state over one of the instances' links)."""

    def __post_init__(self) -> None:
        check_instance_memory_gb(self.instance_memory_gb, "job spec: instance_memory_gb")
        if not self.comm_timeout_s > 0:
            raise LiveputError(f"job spec: comm_timeout_s must be > 0, got {self.comm_timeout_s}")
        if self.checkpoint_every < 0:
            raise LiveputError("checkpoint_every must be >= 0")
        if self.store_outage_s <= 0 or self.keep_checkpoints < 1:
            raise LiveputError("store_outage_s must be > 0 and keep_checkpoints >= 1")
        check_device_request(self.device, "job")


def publish_spec(store: Store, spec: JobSpec) -> None:
    store.set(keys.job_spec(), json.dumps(asdict(spec)).encode())


def instance_id_from_env() -> int | None:
    """The emulator's ``i-0007`` -> 7 (None outside the emulator)."""
    text = os.environ.get(INSTANCE_ID_ENV)
    if not text:
        return None
    number = instance_number(text)
    if number is None:
        raise LiveputError(f"{INSTANCE_ID_ENV}={text!r} holds no instance number")
    return number


def notice_watchers(sources: list[str]) -> list[NoticeWatcher]:
    """Watchers for the named notice sources (``emulator`` only when the emulator set us up)."""
    unknown = set(sources) - set(NOTICE_SOURCES)
    if unknown:
        raise LiveputError(
            f"unknown notice source(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(NOTICE_SOURCES)}"
        )
    watchers: list[NoticeWatcher] = []
    factories: dict[str, Callable[[], NoticeWatcher]] = {
        "aws": AwsNoticeWatcher,
        "gcp": GcpNoticeWatcher,
        "sigterm": lambda: SignalNoticeWatcher((signal.SIGTERM,)),
    }
    for source in sources:
        if source == "emulator":
            notice_file = os.environ.get(NOTICE_FILE_ENV)
            if notice_file:
                watchers.append(EmulatorNoticeWatcher(Path(notice_file)))
        else:
            watchers.append(factories[source]())
    return watchers


def run_agent(
    store_url: str,
    token: str,
    instance: int | None = None,
    host: str = "127.0.0.1",
    notices: list[str] | None = None,
    timeout_s: float = 30.0,
    connect_timeout_s: float | None = None,
    device: str | None = None,
) -> AgentState:
    """Run this instance's agent until the job is done or the instance leaves.

    ``timeout_s`` bounds every store call (an outage is ridden out that long);
    ``connect_timeout_s`` (default ``timeout_s``) only the first contact: reaching the store
    and finding the job; ``device`` overrides the job's device request (``auto``, ``cpu``,
    ``cuda``, ``cuda:K``)."""
    if device is not None:
        check_device_request(device, "agent")
    torch.set_num_threads(1)  # one instance, one core's worth: instances share this machine
    first_s = timeout_s if connect_timeout_s is None else connect_timeout_s
    with open_store(store_url, token=token, timeout_s=first_s) as probe:
        spec_raw = probe.wait_for(keys.job_spec(), first_s)
    store = open_store(store_url, token=token, timeout_s=timeout_s)
    try:
        spec = JobSpec(**json.loads(spec_raw))
        if instance is None:
            instance = instance_id_from_env()
        if instance is None:
            instance = store.add(keys.next_instance_id(), 1) + 10_000
        watchers = notice_watchers(notices if notices is not None else ["sigterm", "emulator"])
        built_s = time.perf_counter()
        job = resolve_empty_job(spec.job, spec.data)  # its own layers built once it holds them
        LOG.info(
            "agent %d built job %s in %.2f s (%s)",
            instance,
            spec.job,
            time.perf_counter() - built_s,
            "its layers' shapes" if job.init_layer is not None else "every layer",
        )
        if spec.training is not None:
            job = dataclasses.replace(job, training=TrainingConfig.from_dict(spec.training))
        # Before the agent joins: a CUDA request without CUDA ends it with one line, and the
        # job never plans with it.
        device = resolve_device(
            device or spec.device, f"agent {instance}", instance if spec.shared_gpu else None
        )
        LOG.info("agent %d trains on %s", instance, describe_device(device))
        if device != "cpu" and not spec.shared_gpu and torch.cuda.device_count() > 1:
            LOG.warning(
                "agent %d: this instance has %d GPUs; it trains on %s only (one agent "
                "per instance)",
                instance,
                torch.cuda.device_count(),
                device,
            )
        checkpointer = Checkpointer(
            store, spec.checkpoint_dir, keep=spec.keep_checkpoints, token=token.encode()
        )
        if job.evaluate is not None:
            Evaluation(job, store, instance, checkpointer)  # told of each checkpoint it completes
        keeper = CopyKeeper(store, instance, host, token.encode())
        engine = Engine(
            job,
            instance,
            store,
            StoreRendezvous(store, host, timeout_s),
            checkpointer,
            EngineConfig(
                checkpoint_every=spec.checkpoint_every,
                device=device,
                shared_gpu=spec.shared_gpu and device != "cpu",
                instance_memory_gb=spec.instance_memory_gb,
                comm_timeout_s=spec.comm_timeout_s,
            ),
            token=token.encode(),
            keeper=keeper,
        )
        agent = Agent(
            AgentConfig(
                instance=instance,
                host=host,
                device=describe_device(device),
                market=os.environ.get(MARKET_ENV) or "spot",
                store_outage_s=spec.store_outage_s,
                notice_margin_s=spec.notice_margin_s,
                exit_on_store_loss=True,
            ),
            store,
            engine,
            watchers,
        )
        return agent.run()
    finally:
        store.close()


def run_coordinator(
    store: Store,
    spec: JobSpec,
    config: CoordinatorConfig,
    profile: ModelProfile | None = None,
    deadline: DeadlineContext | None = None,
    market: MarketView | None = None,
) -> Coordinator:
    """Publish the job and run the control loop until the job is done.

    A restarted coordinator may find its store down (an etcd restarting): it waits for it as
    the agents do, ``spec.store_outage_s``. The job's profile is kept in the store
    (``job/profile``), so a restart plans with the same one instead of profiling again.
    ``deadline`` and ``market``: a deadline job's (see the coordinator)."""
    # Imported here: agents import this module and need none of the deciding code.
    from liveput.runtime.coordinator import Coordinator

    through_outage(lambda: publish_spec(store, spec), spec.store_outage_s)
    if profile is None:
        # Measured on the device the agents train on, where this machine has it: the planner
        # then plans for that accelerator (its speed, its memory). A coordinator on a machine
        # without CUDA (the agents' instances have it) measures on its CPU, and says so.
        device = resolve_device("cpu" if spec.device == "cpu" else "auto", "coordinator")
        if device == "cpu" and spec.device != "cpu":
            LOG.warning(
                "the job asks for %s but this machine has no CUDA: its profile is "
                "measured on this CPU, and the plans use CPU timings",
                spec.device,
            )
        precision = (
            None if spec.training is None else TrainingConfig.from_dict(spec.training).precision
        )
        profile = through_outage(
            lambda: job_profile(store, spec.job, spec.data, device, precision), spec.store_outage_s
        )
    if deadline is None:
        # One line at once, not retried as a store outage would be.
        from liveput.runtime.planning import require_a_fit_before_start

        budgeted = with_instance_memory(profile, config.instance_memory_gb)
        require_a_fit_before_start(budgeted, config.capacity)
    coordinator = through_outage(
        lambda: Coordinator(store, profile, config, deadline=deadline, market=market),
        spec.store_outage_s,
    )
    coordinator.run()
    return coordinator


def job_profile(
    store: Store,
    job_name: str,
    data: str | None = None,
    device: str = "cpu",
    precision: str | None = None,
) -> ModelProfile:
    """The profile of job ``job_name`` (on ``data``) measured on ``device`` (``cpu`` or
    ``cuda:K``) in ``precision`` (None: the job's own): the one in the store, else a fresh
    one, kept there."""
    from liveput.perf.profile_io import profile_from_dict, profile_to_dict
    from liveput.runtime.planning import profile_job

    raw = store.get(keys.job_profile())
    if raw is not None:
        kept = json.loads(raw)
        if (
            kept.get("job") == job_name
            and kept.get("data") == data
            and kept.get("device", "cpu") == device
            and kept.get("precision") == precision
        ):
            LOG.info("the job's profile from the store (measured by an earlier coordinator)")
            return profile_from_dict(kept["profile"])
    job = resolve_job(job_name, data)
    if precision is not None:
        job = dataclasses.replace(
            job, training=dataclasses.replace(job.training, precision=precision)
        )
    profile = profile_job(job, device=device)
    kept = {"job": job_name, "data": data, "profile": profile_to_dict(profile)}
    # A CPU profile in the job's own precision is kept as it always was.
    if device != "cpu":
        kept["device"] = device
    if precision is not None:
        kept["precision"] = precision
    store.set(keys.job_profile(), json.dumps(kept).encode())
    return profile


_T = TypeVar("_T")


def through_outage(call: Callable[[], _T], outage_s: float, retry_s: float = 0.5) -> _T:
    """``call()``, tried again while the store is unreachable, for at most ``outage_s``; an
    address no retry can mend (:class:`StoreAddressError`) fails at once. The wait is said once,
    with what it waits for and how long, not at every try."""
    deadline = time.monotonic() + outage_s
    said = False
    while True:
        try:
            return call()
        except StoreAddressError:
            raise
        except LiveputError as error:
            if time.monotonic() + retry_s > deadline:
                raise
            if not said:
                LOG.warning(
                    "waiting up to %.0f s for the store (%s)",
                    max(deadline - time.monotonic(), 0.0),
                    error,
                )
                said = True
            else:
                LOG.debug("store: %s; trying again", error)
            time.sleep(retry_s)
