"""What a job is doing, written to its store by the process that runs its coordinator.

``liveput status`` and the dashboard read the store alone, so the coordinator's process writes
there what they need beside the protocol's keys; every key has a bounded size whatever the job's
length (the pruner does not touch ``status/``):

- ``status/now``: one JSON snapshot (step, samples/s now and averaged, loss, configuration,
  instances by market and state, dollars, ETA, state), rewritten at most every
  ``min_write_s`` and whenever a step commits;
- ``status/series``: at most ``series_points`` points over the whole job (when full, every other
  point goes and the spacing doubles), what the dashboard plots;
- ``status/events``: the newest ``max_events`` events with their reasons (plans and their
  migration kind and downtime, notices, instances lost, checkpoints, the end).

Dollars are the emulated provider's: instance-hours of trace time (wall time x ``time_scale``)
at the catalog's spot and on-demand prices; the on-demand equivalent prices the same
instance-hours on-demand, and the savings are the difference.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from liveput.runtime import keys
from liveput.runtime.store import Store, readers

MARKETS = ("spot", "on-demand")
"""The markets a status snapshot counts instances in (``instances``)."""
INSTANCE_STATES = ("running", "noticed", "joining")
"""The states it counts them by: training or ready to, told to go, registered but not yet seen
beating. An instance gone is counted in none."""

if TYPE_CHECKING:
    from liveput.runtime.coordinator import Coordinator

STATES = ("starting", "running", "finished", "failed")


@dataclass(frozen=True)
class RecorderConfig:
    """What the recorder needs to know about the job besides the coordinator."""

    job: str
    """The job's name."""
    num_steps: int
    """Steps the job trains."""
    global_batch_size: int
    """B: samples per step."""
    time_scale: float = 1.0
    """Trace (billed) seconds per wall second."""
    spot_usd_per_hour: float = 0.0
    """Price of a spot instance-hour."""
    on_demand_usd_per_hour: float = 0.0
    """Price of an on-demand instance-hour."""
    deadline_hours: float | None = None
    """The deadline, trace hours from the start (None: none)."""
    min_write_s: float = 0.5
    """Least wall time between two writes of ``status/now`` without a new commit."""
    rate_window_s: float = 10.0
    """Wall seconds over which "samples/s now" is measured."""
    series_points: int = 240
    """Most points kept in ``status/series``."""
    series_every_s: float = 1.0
    """Wall seconds between series points at the start (doubles each time it fills)."""
    max_events: int = 100
    """Newest events kept."""

    def __post_init__(self) -> None:
        if self.num_steps < 1 or self.global_batch_size < 1 or self.time_scale <= 0:
            raise ValueError("recorder: num_steps, global_batch_size and time_scale must be > 0")
        if self.series_points < 2 or self.max_events < 1:
            raise ValueError("recorder: series_points >= 2 and max_events >= 1")


class StatusRecorder:
    """Called once per coordinator tick; writes ``status/*`` (see the module docstring)."""

    def __init__(self, store: Store, config: RecorderConfig) -> None:
        self.store = store
        self.config = config
        previous = _json(store.get(keys.status_now())) or {}
        series = _json(store.get(keys.status_series())) or {}
        # A resumed job goes on from what its store says: dollars, elapsed time, the plots.
        self.elapsed_s = float(previous.get("elapsed_s", 0.0))
        usd = previous.get("usd", {})
        self.usd_spot = float(usd.get("spot", 0.0))
        self.usd_on_demand = float(usd.get("on_demand", 0.0))
        self.usd_equivalent = float(usd.get("on_demand_equivalent", 0.0))
        self.downtime_s = float(previous.get("downtime_s", 0.0))
        self.points: list[list] = list(series.get("points", []))
        self.series_every_s = float(series.get("every_s", config.series_every_s))
        self.events: deque[dict] = deque(
            _json(store.get(keys.status_events())) or [], maxlen=config.max_events
        )
        self._last_s: float | None = None
        self._last_write_s = -1e18
        self._last_point_s = -1e18
        self._rates: deque[tuple[float, int]] = deque()
        self._generation = -1 if previous.get("generation") is None else previous["generation"]
        self._noticed: set[int] = set(readers.by_instance(store, keys.NOTICE))
        self._lost: set[int] = set(readers.by_instance(store, keys.LOST))
        self._devices: dict[str, str] = {}
        """The device each billed instance trains on (instance id -> as its agent says)."""
        self._checkpoint = _latest_checkpoint(store)
        self._evaluation: bytes | None = store.get(keys.latest_evaluation())
        """``eval/latest`` as last seen (a new one is an event)."""
        self.evaluation = evaluation_shown(readers.latest_evaluation(store))
        """The newest evaluation, as the status shows it (None: none yet)."""
        self.checkpoints_failed = readers.checkpoint_failures(store)[0]
        """Checkpoint writes that failed so far (each one is an event)."""
        self._downtime: dict | None = None
        """The newest plan's event until its first step commits (its downtime is then known)."""
        self._plan_at_s = 0.0
        self._committed = -1
        self.snapshot: dict = previous

    def _event(self, kind: str, now_s: float, **detail: object) -> dict:
        event = {
            "time_s": round(self.elapsed_s, 2),
            "unix_s": round(time.time(), 3),
            "kind": kind,
            **detail,
        }
        self.events.append(event)
        return event

    def _observe_events(self, coordinator: Coordinator, now_s: float) -> bool:
        """Add what happened since the last tick; whether anything did."""
        store = self.store
        before = len(self.events), self.events[-1] if self.events else None
        plan = coordinator.plan
        if plan is not None and plan.generation != self._generation:
            self._generation = plan.generation
            published = _json(store.get(keys.event(plan.generation))) or {}
            self._downtime = self._event(
                "plan",
                now_s,
                generation=plan.generation,
                reason=published.get("reason", ""),
                migration=plan.kind,
                configuration=f"{plan.data_parallel}x{plan.pipeline_stages}",
                start_step=plan.start_step,
                instances=len(plan.slots),
                notice=published.get("notice"),
            )
            self._plan_at_s = now_s
        if self._downtime is not None and coordinator.committed >= self._downtime["start_step"]:
            self._downtime["downtime_s"] = round(now_s - self._plan_at_s, 3)
            self.downtime_s += self._downtime["downtime_s"]
            self._downtime = None
        # New ones in the store's key order (``notice/10`` before ``notice/9``).
        noticed = set(readers.by_instance(store, keys.NOTICE))
        for instance in sorted(noticed - self._noticed, key=str):
            self._event(
                "notice", now_s, instance=instance, reason="preemption notice from the provider"
            )
        lost = set(readers.by_instance(store, keys.LOST))
        for instance in sorted(lost - self._lost, key=str):
            self._event(
                "lost",
                now_s,
                instance=instance,
                reason="noticed: leaves the job"
                if instance in noticed
                else "no heartbeat: preempted or dead",
            )
        self._noticed, self._lost = noticed, lost
        checkpoint = _latest_checkpoint(store)
        if checkpoint is not None and checkpoint != self._checkpoint:
            self._event("checkpoint", now_s, step=checkpoint, reason="complete on storage")
        self._checkpoint = checkpoint
        failed, last = readers.checkpoint_failures(store)
        if failed > self.checkpoints_failed and last is not None:
            what = "the final weights" if last.get("final") else f"step {last.get('step')}"
            self._event(
                "checkpoint-failed",
                now_s,
                step=last.get("step"),
                failed=failed,
                reason=f"writing {what} failed: {last.get('error', '')}",
            )
        self.checkpoints_failed = failed
        self._observe_evaluation(now_s)
        return (len(self.events), self.events[-1] if self.events else None) != before

    def _observe_evaluation(self, now_s: float) -> None:
        """An event for a new newest evaluation (the snapshot shows its metrics)."""
        latest = self.store.get(keys.latest_evaluation())
        if latest == self._evaluation:
            return
        self._evaluation = latest
        shown = self.evaluation = evaluation_shown(readers.latest_evaluation(self.store))
        if shown is None:
            return
        if "error" in shown:
            reason = f"the evaluation failed: {shown['error']}"
            self._event("eval-failed", now_s, step=shown["step"], reason=reason)
        else:
            self._event("eval", now_s, step=shown["step"], reason=format_metrics(shown["metrics"]))

    def _instances(self, coordinator: Coordinator) -> dict[str, dict[str, int]]:
        markets: dict[str, dict[str, int]] = {market: {} for market in MARKETS}
        self._devices.clear()
        available = set(coordinator.available)
        states = readers.by_instance(self.store, keys.STATE)
        left = {instance for instance, value in states.items() if value in (b"left", b"done")}
        for instance, raw in readers.by_instance(self.store, keys.MEMBER).items():
            registration = _json(raw) or {}
            market = "on-demand" if registration.get("market") == "on-demand" else "spot"
            if instance in available:
                state = "running"
            elif instance in self._noticed and instance not in left:
                state = "noticed"
            elif instance in left or instance in self._lost:
                continue  # gone: no longer billed
            else:
                state = "joining"
            markets[market][state] = markets[market].get(state, 0) + 1
            # Agents before the device was registered trained on the CPU.
            self._devices[str(instance)] = registration.get("device", "cpu")
        return markets

    def record(
        self,
        coordinator: Coordinator,
        now_s: float,
        state: str = "running",
        reason: str = "",
        force: bool = False,
    ) -> dict | None:
        """Account the time since the last call and write what changed; the snapshot written
        (None: nothing written this time)."""
        config = self.config
        dt_s = 0.0 if self._last_s is None else max(0.0, now_s - self._last_s)
        self._last_s = now_s
        self.elapsed_s += dt_s
        instances = self._instances(coordinator)
        spot = sum(instances["spot"].values())
        on_demand = sum(instances["on-demand"].values())
        hours = dt_s * config.time_scale / 3600.0
        self.usd_spot += hours * spot * config.spot_usd_per_hour
        self.usd_on_demand += hours * on_demand * config.on_demand_usd_per_hour
        self.usd_equivalent += hours * (spot + on_demand) * config.on_demand_usd_per_hour
        committed = coordinator.committed
        self._rates.append((now_s, committed))
        while len(self._rates) > 2 and now_s - self._rates[1][0] >= config.rate_window_s:
            self._rates.popleft()
        changed = self._observe_events(coordinator, now_s)
        if state in ("finished", "failed") and (
            not self.events or self.events[-1]["kind"] != state
        ):
            self._event(state, now_s, reason=reason or state)
            changed = True
        new_step = committed != self._committed
        self._committed = committed
        if not (force or new_step or changed or now_s - self._last_write_s >= config.min_write_s):
            return None
        self._last_write_s = now_s
        snapshot = self._snapshot(coordinator, instances, now_s, state, reason)
        self.store.set(keys.status_now(), json.dumps(snapshot).encode())
        if changed:
            self.store.set(keys.status_events(), json.dumps(list(self.events)).encode())
        if force or now_s - self._last_point_s >= self.series_every_s:
            self._last_point_s = now_s
            self._add_point(snapshot)
        return snapshot

    def _snapshot(
        self, coordinator: Coordinator, instances: dict, now_s: float, state: str, reason: str
    ) -> dict:
        config = self.config
        steps_done = coordinator.committed + 1
        (t0, c0), (t1, c1) = self._rates[0], self._rates[-1]
        rate_now = (c1 - c0) * config.global_batch_size / (t1 - t0) if t1 > t0 else 0.0
        rate_avg = (
            steps_done * config.global_batch_size / self.elapsed_s if self.elapsed_s > 0 else 0.0
        )
        plan = coordinator.plan
        loss = None
        if plan is not None and coordinator.committed >= 0:
            record = _json(self.store.get(keys.ledger_record(plan.epoch, coordinator.committed)))
            loss = None if record is None else record.get("loss")
        if loss is None:
            loss = self.snapshot.get("loss")
        remaining = config.num_steps - steps_done
        rate = rate_now or rate_avg
        eta_s = (
            None
            if state != "running"
            else (remaining * config.global_batch_size / rate if rate > 0 else None)
        )
        usd_total = self.usd_spot + self.usd_on_demand
        snapshot = {
            "job": config.job,
            "state": state,
            "reason": reason,
            "activity": coordinator.status,
            "step": steps_done,
            "steps_total": config.num_steps,
            "samples": steps_done * config.global_batch_size,
            "samples_per_s": round(rate_now, 3),
            "samples_per_s_avg": round(rate_avg, 3),
            "loss": loss,
            "configuration": "-"
            if plan is None
            else f"{plan.data_parallel}x{plan.pipeline_stages}",
            "generation": None if plan is None else plan.generation,
            "instances": instances,
            "devices": dict(sorted(self._devices.items(), key=lambda kv: int(kv[0]))),
            "usd": {
                "spot": round(self.usd_spot, 6),
                "on_demand": round(self.usd_on_demand, 6),
                "total": round(usd_total, 6),
                "on_demand_equivalent": round(self.usd_equivalent, 6),
                "savings": round(self.usd_equivalent - usd_total, 6),
            },
            "downtime_s": round(self.downtime_s, 3),
            "checkpoints_failed": self.checkpoints_failed,
            "eval": self.evaluation,
            "elapsed_s": round(self.elapsed_s, 3),
            "eta_s": None if eta_s is None else round(eta_s, 1),
            "time_scale": config.time_scale,
            "deadline_hours": config.deadline_hours,
            "deadline_slack_hours": None,
            "updated_unix_s": round(time.time(), 3),
        }
        if config.deadline_hours is not None and eta_s is not None:
            finish_h = (self.elapsed_s + eta_s) * config.time_scale / 3600.0
            snapshot["deadline_slack_hours"] = round(config.deadline_hours - finish_h, 4)
        self.snapshot = snapshot
        return snapshot

    def _add_point(self, snapshot: dict) -> None:
        instances = snapshot["instances"]
        self.points.append(
            [
                snapshot["elapsed_s"],
                snapshot["step"],
                snapshot["samples_per_s"],
                snapshot["loss"],
                sum(instances["spot"].values()),
                sum(instances["on-demand"].values()),
                snapshot["usd"]["total"],
                snapshot["configuration"],
            ]
        )
        if len(self.points) > self.config.series_points:
            # Whole history at half the resolution: every other point, the newest kept.
            self.points = self.points[::-1][::2][::-1]
            self.series_every_s *= 2
        self.store.set(
            keys.status_series(),
            json.dumps({"every_s": self.series_every_s, "points": self.points}).encode(),
        )


SERIES_FIELDS = (
    "elapsed_s",
    "step",
    "samples_per_s",
    "loss",
    "spot",
    "on_demand",
    "usd",
    "configuration",
)
"""What each ``status/series`` point holds, in order."""


def read_status(store: Store, events: int = 10) -> dict:
    """The job's status from its store: the snapshot with its newest ``events``; a
    LiveputError if the store holds no job status."""
    from liveput.errors import LiveputError

    snapshot = _json(store.get(keys.status_now()))
    if snapshot is None:
        spec = store.get(keys.job_spec())
        raise LiveputError(
            f"store {store.url}: "
            + (
                "the job has not reported a status yet (starting?)"
                if spec is not None
                else "no liveput job here"
            )
        )
    kept = _json(store.get(keys.status_events())) or []
    snapshot["events"] = choose_events(kept, events)
    return snapshot


ROUTINE_EVENTS = frozenset({"checkpoint", "eval"})
"""Event kinds that come often and say little (one per K or N steps): shown after the others."""


def format_metrics(metrics: dict[str, float]) -> str:
    """``accuracy 0.9125, loss 1.203``: an evaluation's metrics in one line."""
    return ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())


def evaluation_shown(record: dict | None) -> dict | None:
    """An evaluation as the status shows it: its 0-based ``step`` (as the ledger, the events
    and the checkpoints count; the status's ``step`` is steps done, s + 1), then its
    ``metrics`` or ``error``."""
    if record is None:
        return None
    shown: dict = {"step": int(record["step"])}
    if "error" in record:
        shown["error"] = record["error"]
    else:
        shown["metrics"] = record.get("metrics", {})
    return shown


def choose_events(events: list[dict], count: int) -> list[dict]:
    """The newest ``count`` of ``events`` in time order, the plans, losses, notices and ends
    before routine ones (a checkpoint every few steps would hide them from a short list)."""
    if count <= 0:
        return []
    if len(events) <= count:
        return list(events)
    newest_first = list(range(len(events) - 1, -1, -1))
    chosen = [i for i in newest_first if events[i].get("kind") not in ROUTINE_EVENTS][:count]
    routine = [i for i in newest_first if events[i].get("kind") in ROUTINE_EVENTS]
    chosen += routine[: count - len(chosen)]
    return [events[i] for i in sorted(chosen)]


def read_series(store: Store) -> dict:
    """The dashboard's series: ``{"fields": [...], "points": [[...], ...]}``."""
    series = _json(store.get(keys.status_series())) or {}
    return {"fields": list(SERIES_FIELDS), "points": series.get("points", [])}


def _latest_checkpoint(store: Store) -> int | None:
    # Imported here: readers of the status (``liveput status``) need no torch.
    from liveput.runtime.checkpoint import latest_checkpoint

    return latest_checkpoint(store)


def _json(raw: bytes | None) -> Any:
    return None if raw is None else json.loads(raw)
