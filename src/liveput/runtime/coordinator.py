"""The coordinator: the live control loop, one per job; it observes and acts, :mod:`decide` decides.

Every ``tick_s`` it observes the store into a :class:`~liveput.runtime.decide.CoordinatorView`
(members, heartbeats, notices, what each instance reports holding, failure reports, arrivals, the
committed step, the newest plan and the newest that ran), asks
:func:`~liveput.runtime.decide.decide` for an action and carries it out: for a new plan it fences the running generation at the next
step boundary (``protocol.fence``), plans it with :func:`~liveput.runtime.planning.plan_generation`
from what the instances hold, and publishes it.

Everything it needs to go on is in the store (the current plan, the committed step, which plans
started, the interval history, the counters), so a restarted coordinator recovers and carries on: a
generation that was fenced but whose successor was never published is simply planned again.

Once per interval it also re-fits the throughput table the policy plans with to the step times
the agents measured (``runtime.step_times``, ``perf.online.fit_online``): the estimator learns this
hardware as the job runs. Once per ``prune.interval_s`` it also prunes the store (:mod:`liveput.runtime.prune`): keys no
reader needs any more are deleted a few per tick, so a days-long job's store stays bounded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Protocol

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.estimator import Calibration, calibration_for, estimate_configs
from liveput.perf.online import refit
from liveput.perf.types import ModelProfile
from liveput.policies import (Configuration, Observation, Policy, PolicyContext, Provisioning,
                              make_policy)
from liveput.policies.deadline import DeadlineContext, DeadlinePolicy, make_deadline_policy
from liveput.runtime import ledger, protocol
from liveput.runtime.checkpoint import latest_checkpoint, reset_latest
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.notices import Notice
from liveput.runtime.decide import (Action, ActionKind, Choose, CoordinatorConfig,
                                    CoordinatorView, Member, decide)
from liveput.runtime.planning import PlanContext, plan_generation, require_a_fit
from liveput.runtime.prune import (PruneView, Pruner, checkpoint_point, forgotten,
                                   instances_named, read_floor)
from liveput.runtime.step_times import read_measurements
from liveput.runtime.store import Store
from liveput.traces.trace import IntervalTrace

LOG = logging.getLogger(__name__)
_REFIT_CHANGE = 0.05
"""The online fit runs again once a configuration is new or its step time moved this much."""
__all__ = ["Coordinator", "CoordinatorConfig", "MarketView"]


class MarketView(Protocol):
    """The executor's provider as a deadline job sees it: what it reads, and the one thing the
    coordinator has it do (carry out a provisioning decision; only providers call a cloud)."""

    def on_demand_pending(self) -> int:
        """On-demand instances asked for and still launching."""

    def usd_spent(self) -> float:
        """Dollars paid so far, spot and on-demand."""

    def provision(self, provisioning: Provisioning) -> None:
        """Hold what the policy wants from now on."""


class Coordinator:
    """Observes the store, asks :func:`decide`, publishes plans; state lives in the store."""

    def __init__(self, store: Store, profile: ModelProfile, config: CoordinatorConfig,
                 clock: Clock | None = None, deadline: DeadlineContext | None = None,
                 market: MarketView | None = None) -> None:
        """``deadline``: a deadline job (``config.policy`` names a deadline policy, whose
        provisioning decisions :attr:`provisioning` holds for the executor's provider, which
        ``market`` reads)."""
        self.store = store
        self.profile = profile
        self.config = config
        self.clock = clock or MonotonicClock()
        self.deadline = deadline
        self.market = market
        self._policy_asks = 0
        self._restart_asked = False
        """The policy's last answer this tick was a restart (the reactive baseline's move)."""
        self.provisioning: Provisioning | None = None
        """The deadline policy's latest provisioning decision (None: none yet, or no deadline)."""
        self.policy: Policy | DeadlinePolicy
        if deadline is not None:
            self.calibration = calibration_for(profile.model)
            self.table = deadline.policy.table
            self.policy = make_deadline_policy(config.policy, deadline)
        else:
            self._plan_with(calibration_for(profile.model))
            require_a_fit(self.table, profile, config.capacity)
        self.measurements: tuple = ()
        """The step times the table was last fitted to (``perf.types.Measurement``)."""
        self._seen: dict[int, float] = {}
        self._beats: dict[int, bytes] = {}
        self._first_seen: dict[str, float] = {}
        """Clock time each observed thing (a failure, a notice, a plan) was first seen."""
        self._plans: dict[int, protocol.RuntimePlan] = {}
        self._holdings: dict[int, protocol.Holding] = {}
        self.available: list[int] = []
        """Instances available at the last tick (alive, not noticed)."""
        self.status = "starting"
        """What the job is doing, in words (the progress display shows it)."""
        self.action: Action | None = None
        """The last decision."""
        self.started_s = self.clock.now_s()
        self._next_interval_s = self.started_s
        self._last_commit_s = self.started_s
        self._stall_warned_s: float | None = None
        self.plan = protocol.current_plan(store)
        self.started: protocol.RuntimePlan | None = None
        self.committed = -1
        self._planned_fence: tuple[int, int] | None = None
        self.pruner = Pruner(store, config.prune, profile.global_batch_size)
        if self.plan is not None:
            raw = store.get("coord/started")
            self.started = None if raw is None else self._load(int(raw))
            # Steps below the floor committed; their keys may have been pruned.
            floor = read_floor(store, self.plan.generation)
            self.committed = protocol.last_committed(
                store, self.plan.generation, max(self.plan.start_step, floor or 0))
            # Recovered: learn who is alive (a heartbeat timeout) before deciding anything new.
            self._next_interval_s = self.started_s + config.heartbeat_timeout_s
            LOG.info("coordinator recovered: generation %d, committed step %d",
                     self.plan.generation, self.committed)

    def _plan_with(self, calibration: Calibration) -> None:
        """Score every configuration with ``calibration``; a policy that plans with the table."""
        self.calibration = calibration
        """The estimator's constants the table was scored with."""
        self.table = estimate_configs(self.profile, self.config.capacity, calibration)
        self.policy = make_policy(self.config.policy, PolicyContext(
            profile=self.profile, table=self.table, costs=self.config.costs,
            interval_s=self.config.policy_interval_s, horizon=self.config.horizon,
            capacity=self.config.capacity, predictor=self.config.predictor))

    def _refit(self) -> None:
        """Feed the measured step times to the online fit; plan with what it learned."""
        measurements = tuple(read_measurements(self.store))
        before = {(m.data_parallel, m.pipeline_stages): m.iteration_s for m in self.measurements}
        if not measurements or (len(before) == len(measurements) and all(
                abs(m.iteration_s / before.get((m.data_parallel, m.pipeline_stages), 0.0) - 1)
                <= _REFIT_CHANGE for m in measurements)):
            return  # nothing new: the same configurations, each within 5% of the last fit's
        self.measurements = measurements
        calibration = refit(self.profile, measurements)
        LOG.info("performance model re-fitted to %d measured configurations (%s): %s",
                 len(measurements), ", ".join(f"{m.data_parallel}x{m.pipeline_stages} "
                                              f"{m.iteration_s:.3f} s" for m in measurements),
                 calibration)
        self._plan_with(calibration)

    # --- observation ------------------------------------------------------------------------
    def _load(self, generation: int) -> protocol.RuntimePlan | None:
        if generation not in self._plans:
            plan = protocol.load_plan(self.store, generation)
            if plan is None:
                return None
            self._plans[generation] = plan
        return self._plans[generation]

    def _since(self, key: str, now: float) -> float:
        return now - self._first_seen.setdefault(key, now)

    def _held_point(self, holding: protocol.Holding) -> tuple[int, int]:
        """(epoch, step) of a holding report's layers now: a report written while its
        generation trains follows every step that generation commits."""
        if holding.ending:
            return holding.epoch, holding.step
        plan = self.plan
        if plan is not None and holding.generation == plan.generation:
            return holding.epoch, max(holding.step, self.committed)
        successor = self._load(holding.generation + 1)
        if successor is None:
            return -1, -2
        return holding.epoch, max(holding.step, successor.start_step - 1)

    def _refresh_heartbeats(self, now: float) -> None:
        for key, raw in self.store.get_prefix("hb/").items():
            instance = int(key.split("/")[1])
            if self._beats.get(instance) != raw:
                self._beats[instance] = raw
                self._seen[instance] = now

    def _members(self, now: float) -> dict[int, Member]:
        self._refresh_heartbeats(now)
        states = {int(k.split("/")[1]): v for k, v in self.store.get_prefix("state/").items()}
        notices = {int(k.split("/")[1]): v for k, v in self.store.get_prefix("notice/").items()}
        holdings = self._holdings = protocol.holdings(self.store)
        plan = self.plan
        arrived = set() if plan is None else protocol.arrivals(self.store, plan.generation)
        members = {}
        for key, raw in self.store.get_prefix("members/").items():
            instance = int(key.split("/")[1])
            holding = holdings.get(instance)
            epoch, step = (-1, -2) if holding is None else self._held_point(holding)
            registration = json.loads(raw)
            members[instance] = Member(
                host=registration.get("host", "127.0.0.1"),
                on_demand=registration.get("market") == "on-demand",
                heartbeat_age_s=now - self._seen.setdefault(instance, now),
                noticed=instance in notices, left=states.get(instance) == b"left",
                done=states.get(instance) == b"done",
                layers=() if holding is None else holding.layers, held_epoch=epoch,
                held_step=step,
                reported=-1 if holding is None or not holding.ending else holding.generation,
                arrived=instance in arrived,
                notice_age_s=self._since(f"notice/{instance}", now) if instance in notices
                else 0.0, notice_lead_s=_notice_lead_s(notices.get(instance)))
        for instance, member in members.items():
            gone = member.left or member.heartbeat_age_s > self.config.heartbeat_timeout_s
            if (gone or member.noticed) and self.store.compare_and_set(
                    f"lost/{instance}", None, b"1"):
                self.store.add("stats/preemptions", 1)
        return members

    def _failed_in_row(self, plan_failed: bool) -> int:
        """Plans in a row, the newest last, that did not run (``plan_failed``: the newest has
        failure reports)."""
        plan = self.plan
        if plan is None:
            return 0
        oldest = -1 if self.started is None else self.started.generation
        count = plan.generation - oldest - 1  # superseded before they ran
        if plan.generation != oldest and plan_failed:
            count += 1
        return max(0, count)

    def observe(self) -> CoordinatorView:
        """What the decision needs, read from the store."""
        now = self.clock.now_s()
        plan = self.plan
        if plan is not None:  # first: members' holdings are read at this step
            committed = protocol.last_committed(self.store, plan.generation,
                                                max(self.committed + 1, plan.start_step))
            if committed > self.committed:
                self._last_commit_s = now
            self.committed = committed
        members = self._members(now)
        interval_due = now >= self._next_interval_s
        if interval_due:
            self._next_interval_s = now + self.config.interval_s
            if self.config.online_calibration and self.deadline is None:
                self._refit()
        if interval_due and plan is not None:
            # The history is the spot market's (what forecasts are about): on-demand left out.
            self._record_interval(sum(1 for m in members.values() if not m.left and not m.noticed
                                      and not m.on_demand
                                      and m.heartbeat_age_s <= self.config.heartbeat_timeout_s))
        if plan is None:
            return CoordinatorView(now - self.started_s, members, None, None, -1,
                                   interval_due=interval_due)
        committed = self.committed
        all_arrived = self.store.get(protocol.all_arrived_key(plan.generation)) is not None
        if all_arrived and committed >= plan.start_step and (
                self.started is None or self.started.generation < plan.generation):
            self.started = plan
            protocol.mark_started(self.store, plan.generation)
            self.store.set("coord/started", str(plan.generation).encode())
        outcome = protocol.step_outcome(self.store, plan.generation, committed + 1)
        fenced = outcome == protocol.ABORTED and \
            self._planned_fence != (plan.generation, committed + 1)
        failures = protocol.failures(self.store, plan.generation)
        finishing = committed + 1 >= self.config.num_steps
        return CoordinatorView(
            now_s=now - self.started_s, members=members, plan=plan, started=self.started,
            committed=committed, fenced=fenced, all_arrived=all_arrived,
            plan_age_s=self._since(f"plan/{plan.generation}", now), failures=failures,
            failure_age_s=self._since(f"fail/{plan.generation}", now) if failures else 0.0,
            failed_in_row=self._failed_in_row(bool(failures)), latest_checkpoint=latest_checkpoint(self.store),
            last_step_recorded=finishing and self._recorded(plan.epoch, committed),
            finish_age_s=self._since("finish", now) if finishing else 0.0,
            interval_due=interval_due)

    def _recorded(self, epoch: int, step: int) -> bool:
        """Whether the ledger has step ``step`` of epoch ``epoch`` (as a record, or folded)."""
        if self.store.get(f"ledger/{epoch}/{step}") is not None:
            return True
        raw = self.store.get(ledger.SUMMARY_KEY)
        summary = None if raw is None else ledger.LedgerSummary.from_json(raw)
        return summary is not None and summary.epoch == epoch and summary.through_step >= step

    def _history(self, available: int) -> IntervalTrace:
        """The instance counts of the intervals since the job started; before it has any, the
        count now (``available``): the start-up's empty intervals, before instances could
        register, are no observation of the market (read as one, a count of 0 made the
        liveput policy start on one instance of two)."""
        counts = json.loads(self.store.get("coord/history") or b"[]") or [available]
        count = np.array(counts, dtype=np.int64)
        change = np.append(np.diff(count), 0)
        return IntervalTrace("runtime", self.config.policy_interval_s, count,
                             np.maximum(-change, 0), np.maximum(change, 0))

    def _record_interval(self, available: int) -> None:
        counts = json.loads(self.store.get("coord/history") or b"[]")
        counts.append(available)
        self.store.set("coord/history", json.dumps(counts).encode())

    # --- the policy, fitted to what is available (handed to the decision) --------------------
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

    def _choose(self, view: CoordinatorView) -> Choose:
        def choose(available: int, event: str,
                   lost_slots: tuple[tuple[int, int], ...]) -> Configuration | None:
            history = self._history(available)
            current = None if view.plan is None else Configuration(view.plan.data_parallel,
                                                                   view.plan.pipeline_stages)
            # Policies get time in policy seconds, as intervals are: one unit for both.
            scale = self.config.policy_interval_s / self.config.interval_s
            observation = Observation(
                time_s=view.now_s * scale, interval_index=len(history.count) - 1,
                interval_s=self.config.policy_interval_s, history=history,
                num_available=available, current=current, capacity=self.config.capacity,
                event=event, lost_slots=lost_slots, remaining_s=self.config.policy_interval_s)
            if self.deadline is not None:
                observation = self._deadline_observation(observation, view, available)
            self._policy_asks += 1
            try:
                decision = self.policy.decide(observation)
                wanted = decision.configuration
                self._restart_asked = decision.migration == "restart"
                if decision.provisioning is not None:
                    self.provisioning = decision.provisioning
                    if self.market is not None:
                        self.market.provision(decision.provisioning)
            except LiveputError as error:
                LOG.warning("policy %s failed (%s); keeping the fastest fit",
                            self.config.policy, error)
                wanted = None
            return self._fit(wanted or current, available)
        return choose

    def _deadline_observation(self, observation: Observation, view: CoordinatorView,
                              available: int) -> Observation:
        """What a deadline policy sees besides: spot and on-demand apart, the work done and
        left, the time to the deadline (policy seconds since this coordinator started)."""
        assert self.deadline is not None
        on_demand = min(available, sum(
            1 for m in view.members.values() if m.on_demand and not (m.noticed or m.left)
            and m.heartbeat_age_s <= self.config.heartbeat_timeout_s))
        done = float(max(self.committed + 1, 0) * self.profile.global_batch_size)
        return dataclasses.replace(
            observation, num_available=available - on_demand, num_on_demand=on_demand,
            samples_done=done,
            samples_remaining=max(self.deadline.target_samples - done, 0.0),
            seconds_to_deadline=self.deadline.objective.deadline_s - observation.time_s,
            on_demand_pending=0 if self.market is None else self.market.on_demand_pending(),
            usd_spent=0.0 if self.market is None else self.market.usd_spent())

    # --- acting -----------------------------------------------------------------------------
    def _publish(self, action: Action, view: CoordinatorView) -> None:
        previous = self.plan
        start = 0
        if previous is not None:
            start = protocol.fence(self.store, previous.generation, self.committed + 1,
                                   previous.num_working)
            self._planned_fence = (previous.generation, start)
            self.committed = start - 1
        started = self.started
        hosts = {i: m.host for i, m in view.members.items()}
        context = PlanContext(
            generation=0 if previous is None else previous.generation + 1,
            epoch=0 if previous is None else previous.epoch, start_step=start,
            end_step=self.config.num_steps, hosts=hosts,
            latest_checkpoint=latest_checkpoint(self.store),
            stages_before=0 if started is None else started.pipeline_stages)
        assert action.target is not None
        # Steps may have committed between the observation and the fence: holdings are read
        # again at the fenced step (a training instance's follow it; an ended one's may not).
        point = (context.epoch, start - 1)
        holdings = {i: held.layers for i in (*action.workers, *action.senders)
                    if (held := self._holdings.get(i)) is not None and held.layers
                    and self._held_point(held) == point}
        on_demand = [i for i in action.workers if (m := view.members.get(i)) and m.on_demand]
        plan = plan_generation(self.profile, self.config.costs, action.target, context,
                               action.workers, holdings, action.senders, started,
                               action.restore, on_demand)
        if action.noticed_workers:
            plan = dataclasses.replace(plan, noticed=list(action.noticed_workers))
        if plan.restore_step is not None and previous is not None:
            held_layers = {layer for layers in holdings.values() for layer in layers}
            LOG.info("plan %d restores from %s: %s", plan.generation,
                     "the initial weights" if plan.restore_step < 0 else
                     f"step {plan.restore_step}",
                     "forced after plans that failed" if action.restore else
                     f"no current holder of layers "
                     f"{sorted(set(range(self.profile.num_layers)) - held_layers)} at step {start - 1} "
                     f"(reported: { {i: m.held_step for i, m in view.members.items()} })")
        if plan.epoch != context.epoch:
            assert plan.restore_step is not None  # a plan of a new epoch restores a checkpoint
            protocol.record_restore(self.store, plan.epoch, start - 1, plan.restore_step)
            reset_latest(self.store, plan.epoch, plan.restore_step)
            self.committed = plan.start_step - 1
        self.store.add(f"stats/migrations/{plan.kind}", 1)
        protocol.publish_plan(self.store, plan)
        self._plans[plan.generation] = plan
        self.store.set(f"events/{plan.generation}", json.dumps({
            "time_s": round(self.clock.now_s() - self.started_s, 3), "reason": action.reason,
            "kind": plan.kind, "configuration": f"{plan.data_parallel}x{plan.pipeline_stages}",
            "start_step": plan.start_step, "instances": len(plan.slots),
            "suspects": sorted(action.suspects), "restore_forced": action.restore}).encode())
        LOG.info("plan %d (%s): %s %dx%d from step %d%s", plan.generation, action.reason,
                 plan.kind, plan.data_parallel, plan.pipeline_stages, plan.start_step,
                 f" without {sorted(action.suspects)}" if action.suspects else "")
        self.plan = plan

    def _watch_stall(self, now: float) -> None:
        """Say why no step commits, once per ``stall_warning_s``."""
        stalled_s = now - self._last_commit_s
        if stalled_s < self.config.stall_warning_s:
            self._stall_warned_s = None
            return
        if self._stall_warned_s is not None and \
                now - self._stall_warned_s < self.config.stall_warning_s:
            return
        self._stall_warned_s = now
        lines = []
        newest = -1 if self.plan is None else self.plan.generation
        for generation in range(max(0, newest - 2), newest + 1):
            plan = self._load(generation)
            reasons = {i: r.reason for i, r in protocol.failures(self.store, generation).items()}
            if plan is not None:
                lines.append(f"plan {generation} ({plan.kind} {plan.data_parallel}x"
                             f"{plan.pipeline_stages} from step {plan.start_step}): "
                             + ("; ".join(f"instance {i}: {r}" for i, r in sorted(reasons.items()))
                                or "no failure reported"))
        LOG.warning("no step committed for %.0f s (last committed %d; %s). %s", stalled_s,
                    self.committed, self.status, " | ".join(lines))

    def tick(self) -> bool:
        """One observation and, if needed, one action; False once the job is done."""
        if self.store.get("job/done") is not None:
            return False
        failure = self.store.get(protocol.JOB_ERROR_KEY)
        if failure is not None:
            raise LiveputError(failure.decode())
        view = self.observe()
        self.available = sorted(i for i, m in view.members.items() if not m.left
                                and not m.going(self.config.notice_margin_s)
                                and m.heartbeat_age_s <= self.config.heartbeat_timeout_s)
        choose = self._choose(view)
        asked = self._policy_asks
        self._restart_asked = False
        action = decide(view, self.config, choose)
        if action.kind is ActionKind.REPLAN and self._restart_asked and not action.restore:
            # A restart is carried out as one: every layer from the newest complete checkpoint,
            # whatever the survivors hold (the reactive baseline, executed for real).
            action = dataclasses.replace(action, restore=True)
        if (self.deadline is not None and view.interval_due and self._policy_asks == asked
                and action.kind is not ActionKind.FINISH):
            # A deadline job provisions every interval, also before its first plan or while it
            # waits with no instance (when the control loop has no configuration to ask for).
            choose(len(self.available), "interval", ())
        if action.status != self.status:
            LOG.info("coordinator: %s", action.status)
        self.status = action.status
        self.action = action
        if action.kind is ActionKind.FINISH:
            self.store.set("job/done", str(self.committed).encode())
            return False
        if action.kind is ActionKind.REPLAN:
            self._publish(action, view)
        self._watch_stall(self.clock.now_s())
        self._prune()
        return True

    def _prune(self) -> None:
        """Delete a few dead keys; once per ``prune.interval_s``, find the dead keys."""
        pruner = self.pruner
        pruner.delete_some()
        now = self.clock.now_s()
        plan = self.plan
        if plan is None or not pruner.due(now):
            return
        keys = pruner.keys()
        silent_s = {i: now - self._seen.setdefault(i, now) for i in instances_named(keys)}
        gone = forgotten(silent_s, set(plan.slots), self.config.prune.forget_after_s)
        retire_before = pruner.retire_before(
            -1 if self.started is None else self.started.generation, now)
        pruner.plan_pass(PruneView(plan.generation, self.committed, retire_before,
                                   checkpoint_point(self.store), gone), keys, plan.epoch, now)
        # This process's own records of what is pruned go too (they would grow as the keys did).
        for instance in gone:
            self._seen.pop(instance, None)
            self._beats.pop(instance, None)
            self._first_seen.pop(f"notice/{instance}", None)
        for generation in [g for g in self._plans if g < retire_before - 1]:
            del self._plans[generation]
            self._first_seen.pop(f"plan/{generation}", None)
            self._first_seen.pop(f"fail/{generation}", None)

    def run(self) -> None:
        """Tick until the job is done, then see the agents off."""
        while True:
            try:
                if not self.tick():
                    break
            except LiveputError as error:  # the store is restarting: observe again later
                LOG.warning("coordinator: %s", error)
            self.clock.sleep(self.config.tick_s)
        self.see_off()

    def unfinished(self) -> list[int]:
        """Live instances that have not yet said they are done or left."""
        now = self.clock.now_s()
        self._refresh_heartbeats(now)
        ended = {int(k.split("/")[1]) for k, v in self.store.get_prefix("state/").items()
                 if v in (b"done", b"left")}
        return sorted(i for i, seen_s in self._seen.items() if i not in ended
                      and now - seen_s <= self.config.heartbeat_timeout_s)

    def see_off(self) -> list[int]:
        """Wait, at most ``finish_wait_s``, until every live instance knows the job is done;
        the instances still unfinished then.

        The store may end with this process (the embedded one does): a spare that had not yet
        read ``job/done`` would then wait out a whole store outage and exit with an error."""
        deadline_s = self.clock.now_s() + self.config.finish_wait_s
        left: list[int] = []
        while True:
            try:
                left = self.unfinished()
                if not left:
                    return left
            except LiveputError as error:  # the store is restarting: look again
                LOG.warning("coordinator: %s", error)
            if self.clock.now_s() >= deadline_s:
                LOG.warning("coordinator: job done; instances %s did not say they saw it", left)
                return left
            self.clock.sleep(self.config.tick_s)


def _notice_lead_s(raw: bytes | None) -> float | None:
    """The lead a reported notice gives, wall seconds (None: none, or not readable). It counts
    from when this coordinator first saw the notice: a restarted coordinator gives a noticed
    instance up to its whole lead again, and one killed before it moves is a loss without a
    notice (slower, never wrong)."""
    if raw is None:
        return None
    try:
        return Notice.from_json(raw.decode("utf-8", "replace"), "the store").lead_s
    except LiveputError:
        return None
