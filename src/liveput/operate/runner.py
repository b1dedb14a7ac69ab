"""Launching, stopping and resuming a job from its job file, on the emulated provider.

A launched job lives in its state directory (``<state_dir>/``): ``etcd/`` (the store's data,
on disk), ``token`` (the job token, mode 0600), ``job.json`` (store URL, token file, dashboard
URL, the launcher's pid), ``checkpoints/`` (unless the file names a URL), ``logs/`` and, once
finished, ``model.pt``. The launcher runs the store (a local etcd), the coordinator, the
emulated provider and its agents, the dashboard and the metrics. A launcher in the background
(``--detach``) keeps the store up ``linger_s`` after the job finishes (or until ``liveput stop``;
a job that fails ends its launcher at once, so ``launch --detach`` reports the error);
one in the foreground returns when the job ends and takes its store down with it: no process
outlives the command that started it unless it was detached. Either way the job's last status
is kept in ``status.json``, where ``liveput status`` reads it once the store is gone. The
store's data stays on disk, so ``liveput resume`` can continue a job whose processes are all
gone: it restarts (or adopts) the etcd, forgets the instances (none is left),
and the coordinator recovers from the store, restoring from the newest complete checkpoint; the
ledger, kept in the same store, proves exactly-once across the break.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from liveput.errors import LiveputError
from liveput.files import check_writable_url
from liveput.launch.job_store import StorePlace, open_job_store
from liveput.operate.job_training import job_trace, training_config
from liveput.operate.jobfile import JobFile
from liveput.operate.recorder import RecorderConfig, StatusRecorder
from liveput.ports import free_port_pair
from liveput.runtime import keys
from liveput.runtime.store import Store, parse_host_port, readers
from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd, pid_alive

if TYPE_CHECKING:
    from liveput.models.job import Job
    from liveput.operate.metrics import TensorBoardScalars
    from liveput.runtime.coordinator import Coordinator
    from liveput.traces import IntervalTrace, Trace

LOG = logging.getLogger(__name__)
JOB_JSON = "job.json"
STATUS_JSON = "status.json"


@dataclass(frozen=True)
class JobPlace:
    """Where a launched job can be reached (``--detach --json`` prints the first three)."""

    store: str
    """The store's URL."""
    token_file: str
    """The file holding the job token."""
    dashboard: str | None
    """The dashboard's URL (None: no dashboard)."""
    pid: int
    """The launcher's process id."""

    def public(self) -> dict:
        return {"store": self.store, "token_file": self.token_file, "dashboard": self.dashboard}


def read_place(state_dir: Path) -> JobPlace | None:
    try:
        return JobPlace(**json.loads((state_dir / JOB_JSON).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _token(state_dir: Path) -> tuple[str, Path]:
    path = state_dir / "token"
    if path.exists():
        return path.read_text().strip(), path
    token = secrets.token_hex(16)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token, path


def forget_instances(store: Store) -> int:
    """Delete every instance's keys (all of them are gone); how many."""
    count = 0
    for family in keys.FAMILIES:
        if family.scope is not keys.Scope.INSTANCE:
            continue
        for key in store.get_prefix(family.prefix):
            store.delete(key)
            count += 1
    return count


def end_dead_generation(store: Store) -> int | None:
    """Fence the generation in force at its first uncommitted step (its instances are all
    gone): new agents, whose instance ids may be the dead ones', must not join it as if they
    held its layers; the recovered coordinator sees the fence and plans a checkpoint restore.
    The fenced step (None: no plan, or the job is done)."""
    from liveput.runtime import protocol
    from liveput.runtime.prune import read_floor

    plan = protocol.current_plan(store)
    if plan is None or store.get(keys.job_done()) is not None:
        return None
    floor = read_floor(store, plan.generation)
    committed = protocol.last_committed(store, plan.generation, max(plan.start_step, floor or 0))
    return protocol.fence(store, plan.generation, committed + 1, plan.num_working)


def run_job(
    job: JobFile,
    *,
    resume: bool = False,
    on_ready: Callable[[JobPlace], None] | None = None,
    linger: bool = True,
) -> dict:
    """Run ``job`` to its end (or continue it with ``resume``), then (``linger``, and only if
    it ran through) keep its store up ``job.linger_s``; its summary. The last status is kept in
    the state directory.

    Bad input is refused before anything of an existing job is touched."""
    from liveput.models.jobs import resolve_job
    from liveput.models.validate import check_job

    state_dir = job.state_path
    place = read_place(state_dir)
    if resume:
        if place is None:
            raise LiveputError(f"resume: no launched job in {state_dir} (liveput launch it)")
        if pid_alive(place.pid) and place.pid != os.getpid():
            raise LiveputError(
                f"resume: the job still runs (launcher pid {place.pid}); liveput stop it first"
            )
    elif place is not None or (state_dir / "etcd").exists():
        raise LiveputError(
            f"launch: {state_dir} already holds job {job.job_name!r}: "
            "liveput resume continues it; remove that folder to start over"
        )
    model = resolve_job(job.model)
    check_job(model)  # a model mistake: one line naming the layer, before anything starts
    trace = job_trace(job)  # a trace file that is missing or malformed: the same
    num_steps = job.num_steps(model.global_batch_size)
    checkpoint_url = job.checkpoint.url or str(state_dir / "checkpoints")
    dashboard = None
    if job.dashboard.port is not None:
        from liveput.operate.dashboard import Dashboard

        dashboard = Dashboard(job.dashboard.host, job.dashboard.port)  # binds: a busy port fails
    try:
        check_writable_url(checkpoint_url, "checkpoint URL")
        state_dir.mkdir(parents=True, exist_ok=True)
        token, token_file = _token(state_dir)
        port = job.store.port or (
            int(place.store.rsplit(":", 1)[1]) if place is not None else free_port_pair()
        )
        # Its etcd keeps the job's state on disk: a resume adopts it.
        etcd = EtcdConfig(state_dir / "etcd", client_port=port)
        opened = open_job_store(StorePlace(etcd=etcd, timeout_s=10.0), token)
    except BaseException:
        if dashboard is not None:
            dashboard.close()
        raise
    store = opened.store
    started = False
    ran_through = False  # a job that fails says so at once: its launcher does not linger
    try:
        if resume:
            if store.get(keys.job_done()) is not None and (state_dir / "model.pt").exists():
                raise LiveputError(
                    f"resume: job {job.job_name!r} finished already; its model "
                    f"is {state_dir / 'model.pt'}"
                )
            store.delete(keys.job_stop())
            forget_instances(store)
            end_dead_generation(store)
        place = JobPlace(
            opened.url,
            str(token_file.resolve()),
            None if dashboard is None else dashboard.url,
            os.getpid(),
        )
        (state_dir / JOB_JSON).write_text(json.dumps(place.__dict__) + "\n")
        if dashboard is not None:
            dashboard.serve(opened.url, token)
        started = True
        summary = _train(
            job, model, trace, num_steps, store, token, checkpoint_url, state_dir, place, on_ready
        )
        ran_through = True
        return summary
    except KeyboardInterrupt:
        started = False  # Ctrl-C: no lingering; the data stays on disk for a resume
        raise
    finally:
        try:
            if started:
                keep_status(store, state_dir)
            if started and linger and ran_through:
                _linger(store, job.linger_s)
        finally:
            if dashboard is not None:
                dashboard.close()
            opened.close()


def _train(
    job: JobFile,
    model: Job,
    trace: Trace | IntervalTrace,
    num_steps: int,
    store: Store,
    token: str,
    checkpoint_url: str,
    state_dir: Path,
    place: JobPlace,
    on_ready: Callable[[JobPlace], None] | None,
) -> dict:
    from liveput.catalog import load_catalog
    from liveput.launch.local import run_local_training, warn_idle_gpus
    from liveput.operate.export import export_model
    from liveput.operate.metrics import TensorBoardScalars, step_evaluations, step_losses
    from liveput.runtime.device import resolve_device

    provider = job.provider
    spec = load_catalog("aws").get(provider.instance_type)
    # The emulated provider's instances are processes here: GPUs of the type that they do
    # not train on are billed for nothing, which the user hears of (a warning, not an error).
    warn_idle_gpus(provider.instance_type, resolve_device(job.device, "launch"))
    objective = job.objective
    recorder = StatusRecorder(
        store,
        RecorderConfig(
            job=job.job_name,
            num_steps=num_steps,
            global_batch_size=model.global_batch_size,
            time_scale=provider.time_scale,
            spot_usd_per_hour=spec.spot_usd_per_hour,
            on_demand_usd_per_hour=spec.on_demand_usd_per_hour,
            deadline_hours=objective.deadline_hours,
        ),
    )
    board = None if job.metrics.tensorboard is None else TensorBoardScalars(job.metrics.tensorboard)
    # On the job's own store and checkpoints; a month: the launcher runs until the job ends.
    config = training_config(
        job,
        num_steps,
        store_url=place.store,
        checkpoint_dir=checkpoint_url,
        timeout_s=30 * 24 * 3600.0,
        log_dir=str(state_dir / "logs"),
        token=token,
    )
    last: dict[str, Coordinator] = {}
    ready = False

    def tick(coordinator: Coordinator, done: bool) -> None:
        nonlocal ready
        last["coordinator"] = coordinator
        snapshot = recorder.record(coordinator, time.monotonic())
        if snapshot is not None and board is not None:
            plan = coordinator.plan
            board.add(
                snapshot,
                {}
                if plan is None
                else step_losses(store, plan.epoch, board.loss_step, coordinator.committed),
            )
            due = model.evaluation_due
            board.add_evaluations(step_evaluations(store, due, board.eval_step, snapshot))
        if not ready and on_ready is not None:
            ready = True
            on_ready(place)
        if store.get(keys.job_stop()) is not None:
            raise LiveputError("stopped by liveput stop")
        if (
            objective.budget_usd is not None
            and recorder.usd_spot + recorder.usd_on_demand > objective.budget_usd
        ):
            raise LiveputError(f"budget of ${objective.budget_usd:g} spent")

    try:
        result = run_local_training(config, trace, on_tick=tick)
        output = Path(job.export) if job.export else state_dir / "model.pt"
        export_model(checkpoint_url, len(model.layers), output, layers=model.layers)
        reason = (
            f"all {num_steps} steps, exactly once: "
            f"{'yes' if result.exactly_once else 'NO'}; model in {output}"
        )
        _final(recorder, last, "finished" if result.exactly_once else "failed", reason, board)
        summary = result.summary()
        summary.update(model=str(output), state_dir=str(state_dir), store=place.store)
        (state_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary
    except LiveputError as error:
        _final(recorder, last, "failed", str(error).split("; agents' logs")[0], board)
        raise
    except KeyboardInterrupt:
        _final(recorder, last, "failed", "interrupted", board)
        raise
    finally:
        if board is not None:
            board.close()


def _final(
    recorder: StatusRecorder,
    last: dict[str, Coordinator],
    state: str,
    reason: str,
    board: TensorBoardScalars | None,
) -> None:
    coordinator = last.get("coordinator")
    if coordinator is None:
        return
    try:
        snapshot = recorder.record(
            coordinator, time.monotonic(), state=state, reason=reason, force=True
        )
        if snapshot is not None and board is not None:
            board.add(snapshot)
            board.add_evaluations(readers.evaluations(recorder.store))
    except LiveputError as error:  # the store is gone: nothing more to say there
        LOG.warning("could not record the end of the job: %s", error)


def keep_status(store: Store, state_dir: Path) -> None:
    """The job's status and every event kept, from its store into ``status.json`` (written
    whole, then renamed: a reader never sees half of it)."""
    from liveput.operate.recorder import read_status

    try:
        if store.get(keys.status_now()) is None:  # a job that failed as it started: none to keep
            return
        snapshot = read_status(store, events=10_000)
    except LiveputError as error:  # the store is gone: nothing to keep
        LOG.warning("could not keep the job's status: %s", error)
        return
    partial = state_dir / (STATUS_JSON + ".partial")
    partial.write_text(json.dumps(snapshot) + "\n")
    partial.replace(state_dir / STATUS_JSON)


def read_kept_status(state_dir: Path, events: int = 10) -> dict | None:
    """The status ``keep_status`` kept (None: none), with its chosen ``events``."""
    from liveput.operate.recorder import choose_events

    try:
        snapshot = json.loads((state_dir / STATUS_JSON).read_text())
    except (OSError, ValueError):
        return None
    snapshot["events"] = choose_events(snapshot.get("events", []), events)
    return snapshot


def _linger(store: Store, linger_s: float) -> None:
    """Keep the store up ``linger_s`` or until ``liveput stop``."""
    deadline = time.monotonic() + linger_s
    while time.monotonic() < deadline:
        try:
            if store.get(keys.job_stop()) is not None:
                return
        except LiveputError:
            return
        time.sleep(0.2)


def stop_job(
    store: Store, place: JobPlace | None, state_dir: Path | None = None, wait_s: float = 60.0
) -> bool:
    """Ask the job's launcher to stop (a running job ends, a lingering store goes); whether it
    was seen to end within ``wait_s``. A launcher that is gone (killed) left its etcd running,
    on purpose (a resume adopts it): with ``state_dir``, that etcd is stopped too."""
    store.set(keys.job_stop(), b"1")
    if place is None:
        return True
    deadline = time.monotonic() + wait_s
    while pid_alive(place.pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    if state_dir is not None:
        store.close()
        _, port = parse_host_port(place.store)
        etcd = LocalEtcd(EtcdConfig(state_dir / "etcd", client_port=port))
        if etcd.running_pid() is not None:
            etcd.start()  # adopts it
            etcd.stop()
    return True


def store_running(place: JobPlace) -> bool:
    """Whether anything answers at the job's store address: the etcd of a job that has ended
    refuses at once, where asking it as a store would wait out the client's timeout (5 s)."""
    host, port = parse_host_port(place.store)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
