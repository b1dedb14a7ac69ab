"""The coordinator: the live control loop, one per job.

Every ``tick_s`` it observes the store (members, heartbeats, notices, failures, the committed
step). When a working instance is noticed, dies or a peer reports a failure, it asks the policy at
once (event ``preemption``); at the start of every interval it asks the policy (event
``interval``) with the forecast of the predictor behind it. When the answer differs from what runs,
it plans the migration (:func:`liveput.plan.migration.plan_migration`), fences the running
generation at the next step boundary (``protocol.fence``) and publishes the plan that starts there.

Everything it needs to go on is in the store (the current plan, the committed step, the interval
history, the counters), so a restarted coordinator recovers and carries on: a generation that was
fenced but whose successor was never published is simply planned again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.costs import MigrationCostModel
from liveput.perf.estimator import estimate_configs
from liveput.perf.types import ModelProfile
from liveput.plan.migration import plan_migration
from liveput.policies import Configuration, Observation, PolicyContext, make_policy
from liveput.runtime import protocol
from liveput.runtime.checkpoint import latest_checkpoint
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.planning import PlanContext, assignment_of, to_runtime_plan
from liveput.runtime.store import Store
from liveput.traces.trace import IntervalTrace

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of the control loop."""

    num_steps: int
    """Steps to train (the job ends after step ``num_steps - 1``)."""
    num_micro_batches: int
    """M of the job: D is at most M."""
    interval_s: float = 2.0
    """Wall seconds between two interval decisions."""
    policy_interval_s: float = 60.0
    """What an interval stands for in the policy's cost and throughput model, seconds (an
    emulated cloud replays trace time faster: ``interval_s * time_scale``)."""
    tick_s: float = 0.2
    """Seconds between two observations of the store."""
    heartbeat_timeout_s: float = 3.0
    """An instance whose heartbeat has not moved for this long is dead."""
    notice_settle_s: float = 0.5
    """Notices that come together (a cloud preempting several instances) are gathered for this
    long before planning, so that one migration handles them all."""
    suspect_after_s: float = 1.5
    """When planning after a loss, an instance silent this long is counted as lost too
    (instances killed together are not all detected at the same tick)."""
    initial_workers: int = 1
    """Instances to wait for before the first plan (or ``start_grace_s``, whichever first)."""
    start_grace_s: float = 10.0
    """Longest wait for ``initial_workers``, seconds."""
    capacity: int = 8
    """Instances requested from the cloud (the most that can ever be available)."""
    policy: str = "liveput"
    """Policy deciding the configuration (``liveput.policies``)."""
    predictor: str = "persistence"
    """Predictor behind a forecasting policy."""
    horizon: int = 6
    """Intervals looked ahead."""
    costs: MigrationCostModel = field(default_factory=MigrationCostModel)
    """Migration costs the policy plans with (calibrate from measured downtimes: docs)."""

    def __post_init__(self) -> None:
        if self.num_steps < 1 or self.num_micro_batches < 1:
            raise LiveputError("coordinator: num_steps and num_micro_batches must be >= 1")
        if min(self.interval_s, self.tick_s, self.heartbeat_timeout_s, self.policy_interval_s) <= 0:
            raise LiveputError("coordinator: intervals and timeouts must be positive")
        if self.capacity < 1 or self.initial_workers < 1:
            raise LiveputError("coordinator: capacity and initial_workers must be >= 1")


class Coordinator:
    """Observes, decides and publishes plans; state lives in the store."""

    def __init__(self, store: Store, profile: ModelProfile, config: CoordinatorConfig,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.profile = profile
        self.config = config
        self.clock = clock or MonotonicClock()
        self.table = estimate_configs(profile, config.capacity)
        self.policy = make_policy(config.policy, PolicyContext(
            profile=profile, table=self.table, costs=config.costs,
            interval_s=config.policy_interval_s, horizon=config.horizon,
            capacity=config.capacity, predictor=config.predictor))
        self._seen: dict[int, float] = {}
        self._beats: dict[int, bytes] = {}
        self._failure_seen_s: float | None = None
        self._finish_seen_s: float | None = None
        self._notice_seen: dict[int, float] = {}
        self.available: list[int] = []
        """Instances available at the last tick (alive, not noticed)."""
        self.started_s = self.clock.now_s()
        self._next_interval_s = self.started_s
        self.plan = protocol.current_plan(store)
        self.committed = -1 if self.plan is None else protocol.last_committed(
            store, self.plan.generation, self.plan.start_step)
        if self.plan is not None:
            # Recovered: learn who is alive (a heartbeat timeout) before deciding anything new.
            self._next_interval_s = self.started_s + config.heartbeat_timeout_s
            LOG.info("coordinator recovered: generation %d, committed step %d",
                     self.plan.generation, self.committed)

    # --- observation ------------------------------------------------------------------------
    def _members(self) -> dict[int, dict]:
        return {int(k.split("/")[1]): json.loads(v)
                for k, v in self.store.get_prefix("members/").items()}

    def _observe(self, now: float) -> tuple[dict[int, dict], set[int], set[int]]:
        """Members, the dead ones and the noticed ones."""
        members = self._members()
        for key, raw in self.store.get_prefix("hb/").items():
            instance = int(key.split("/")[1])
            if self._beats.get(instance) != raw:
                self._beats[instance] = raw
                self._seen[instance] = now
        left = {int(k.split("/")[1]) for k, v in self.store.get_prefix("state/").items()
                if v == b"left"}
        dead = {i for i in members
                if now - self._seen.setdefault(i, now) > self.config.heartbeat_timeout_s} | left
        noticed = {int(k.split("/")[1]) for k in self.store.get_prefix("notice/")}
        for instance in (dead | noticed) & set(members):
            if self.store.compare_and_set(f"lost/{instance}", None, b"1"):
                self.store.add("stats/preemptions", 1)
        return members, dead, noticed

    def _history(self) -> IntervalTrace:
        counts = json.loads(self.store.get("coord/history") or b"[]") or [0]
        count = np.array(counts, dtype=np.int64)
        change = np.append(np.diff(count), 0)
        return IntervalTrace("runtime", self.config.policy_interval_s, count,
                             np.maximum(-change, 0), np.maximum(change, 0))

    # --- deciding ---------------------------------------------------------------------------
    def _fit(self, wanted: Configuration | None, num_instances: int) -> Configuration | None:
        """``wanted`` if it runs on ``num_instances``, else the fastest configuration that does."""
        limit = self.config.num_micro_batches

        def runs(d: int, p: int) -> bool:
            return d * p <= num_instances and d <= limit and p <= self.profile.num_layers

        if wanted is not None and runs(wanted.data_parallel, wanted.pipeline_stages):
            return wanted
        best, best_rate = None, 0.0
        for d, p, rate, ok in zip(self.table.data_parallel, self.table.pipeline_stages,
                                  self.table.samples_per_s, self.table.feasible, strict=True):
            if ok and runs(int(d), int(p)) and rate > best_rate:
                best, best_rate = Configuration(int(d), int(p)), float(rate)
        return best

    def _decide(self, now: float, available: int, event: str,
                lost_slots: tuple[tuple[int, int], ...] = ()) -> Configuration | None:
        history = self._history()
        current = None if self.plan is None else Configuration(self.plan.data_parallel,
                                                               self.plan.pipeline_stages)
        observation = Observation(
            time_s=now - self.started_s, interval_index=len(history.count) - 1,
            interval_s=self.config.policy_interval_s, history=history, num_available=available,
            current=current, capacity=self.config.capacity, event=event, lost_slots=lost_slots,
            remaining_s=self.config.policy_interval_s)
        try:
            wanted = self.policy.decide(observation).configuration
        except LiveputError as error:
            LOG.warning("policy %s failed (%s); keeping the fastest fit", self.config.policy, error)
            wanted = None
        return self._fit(wanted or current, available)

    # --- acting -----------------------------------------------------------------------------
    def _replan(self, target: Configuration, preempted: set[int], available: list[int],
                members: dict[int, dict], noticed: set[int], reason: str,
                unreachable: frozenset[int] = frozenset()) -> None:
        """``preempted``: instances of the running plan that are gone or going; of them, the
        noticed ones not ``unreachable`` (dead or silent) still send their layers."""
        previous = self.plan
        start = 0
        if previous is not None:
            start = protocol.fence(self.store, previous.generation, self.committed + 1,
                                   previous.num_working)
            self.committed = start - 1
        in_plan = set() if previous is None else set(previous.slots)
        allocated = [i for i in available if i not in in_plan]
        gone = preempted | (in_plan - set(available))
        migration = plan_migration(self.profile, self.config.costs, assignment_of(previous),
                                   gone & in_plan, allocated, target)
        holders: dict[int, list[int]] = {}
        if previous is not None:
            for instance in sorted((noticed & in_plan) - unreachable):
                slot = previous.slots.get(instance)
                if slot is not None:
                    for layer in previous.layers_of(slot[1]):
                        holders.setdefault(layer, []).append(instance)
        context = PlanContext(
            generation=0 if previous is None else previous.generation + 1,
            epoch=0 if previous is None else previous.epoch, start_step=start,
            end_step=self.config.num_steps,
            hosts={i: m.get("host", "127.0.0.1") for i, m in members.items()},
            latest_checkpoint=latest_checkpoint(self.store),
            stages_before=0 if previous is None else previous.pipeline_stages)
        plan = to_runtime_plan(self.profile, migration, context, holders)
        if plan.epoch != context.epoch:
            protocol.record_restore(self.store, plan.epoch, start - 1, plan.restore_step)
            self.committed = plan.start_step - 1
        self.store.add(f"stats/migrations/{plan.kind}", 1)
        protocol.publish_plan(self.store, plan)
        self.store.set(f"events/{plan.generation}", json.dumps({
            "time_s": round(self.clock.now_s() - self.started_s, 3), "reason": reason,
            "kind": plan.kind, "configuration": f"{plan.data_parallel}x{plan.pipeline_stages}",
            "start_step": plan.start_step, "instances": len(plan.slots)}).encode())
        LOG.info("plan %d (%s): %s %dx%d from step %d", plan.generation, reason, plan.kind,
                 plan.data_parallel, plan.pipeline_stages, plan.start_step)
        self.plan = plan
        self._failure_seen_s = None

    def _record_interval(self, available: int) -> None:
        counts = json.loads(self.store.get("coord/history") or b"[]")
        counts.append(available)
        self.store.set("coord/history", json.dumps(counts).encode())

    def tick(self) -> bool:
        """One observation and, if needed, one decision; False once the job is done."""
        now = self.clock.now_s()
        if self.store.get("job/done") is not None:
            return False
        members, dead, noticed = self._observe(now)
        available = sorted(i for i in members if i not in dead and i not in noticed)
        self.available = available
        plan = self.plan
        interval_due = now >= self._next_interval_s
        if interval_due:
            self._next_interval_s = now + self.config.interval_s
            self._record_interval(len(available))
        if plan is None:
            waited = now - self.started_s >= self.config.start_grace_s
            if available and (len(available) >= self.config.initial_workers or waited):
                target = self._decide(now, len(available), "interval")
                if target is not None:
                    self._replan(target, set(), available, members, noticed, "start")
            return True
        self.committed = protocol.last_committed(self.store, plan.generation, self.committed + 1)
        if self.committed + 1 >= self.config.num_steps:
            # The last stage records the step just after applying it: give it a moment.
            self._finish_seen_s = self._finish_seen_s or now
            recorded = self.store.get(f"ledger/{plan.epoch}/{self.committed}") is not None
            if recorded or now - self._finish_seen_s > self.config.heartbeat_timeout_s:
                self.store.set("job/done", str(self.committed).encode())
                return False
            return True
        working = {i for i, s in plan.slots.items() if s is not None}
        lost = working & (dead | noticed)
        stranded = (set(plan.slots) - working) & dead
        if stranded and self.store.get(protocol.all_arrived_key(plan.generation)) is None:
            lost |= stranded  # dead spares the others still wait for: the plan cannot start
        fenced = protocol.step_outcome(self.store, plan.generation,
                                       self.committed + 1) == protocol.ABORTED
        failed = bool(self.store.get_prefix(f"fail/{plan.generation}/"))
        if failed and not lost and not fenced:
            # A peer failed but is not known dead yet: give heartbeats time to tell which.
            self._failure_seen_s = self._failure_seen_s or now
            failed = now - self._failure_seen_s > self.config.heartbeat_timeout_s
        for instance in noticed:
            self._notice_seen.setdefault(instance, now)
        settling = any(now - self._notice_seen[i] < self.config.notice_settle_s for i in noticed)
        if lost and lost <= noticed and settling and not (fenced or failed):
            return True
        if lost or fenced or failed:
            suspects = {i for i in plan.slots
                        if now - self._seen.get(i, now) > self.config.suspect_after_s}
            gone = (dead | noticed | suspects) & set(plan.slots)
            available = [i for i in available if i not in suspects]
            lost_slots = tuple(sorted(plan.slots[i] for i in gone & working))
            target = self._decide(now, len(available), "preemption", lost_slots)
            if target is None:
                return True
            self._replan(target, gone, available, members, noticed,
                         "loss" if lost else "failure" if failed else "recovery",
                         frozenset(dead | suspects))
        elif interval_due:
            target = self._decide(now, len(available), "interval")
            current = Configuration(plan.data_parallel, plan.pipeline_stages)
            if target is not None and target != current:
                self._replan(target, set(), available, members, noticed, "interval")
        return True

    def run(self) -> None:
        """Tick until the job is done."""
        while True:
            try:
                if not self.tick():
                    return
            except LiveputError as error:  # the store is restarting: observe again later
                LOG.warning("coordinator: %s", error)
            self.clock.sleep(self.config.tick_s)
