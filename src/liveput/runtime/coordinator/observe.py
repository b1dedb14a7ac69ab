"""The coordinator's observation: the store read into decide's :class:`CoordinatorView`.

It reads members, heartbeats, notices (counted from when a coordinator of the job first saw
them: ``notice-end/<id>``), what each instance reports holding, failure reports, arrivals, the
committed step, the newest plan and the newest that ran, and whether the plan was fenced for a
checkpoint (Rule 9). It writes nothing: what an observation leaves in the store (losses
counted, the interval's instance count, a plan marked started, when a notice was seen) is
:mod:`.publish`'s.

The :class:`JobProgress` is what the coordinator knows of the job's progress. The store holds all of
it, so a restarted coordinator reads it back (:meth:`Observer.recover`) and carries on.

A restarted coordinator plans from the instances it hears: one whose heartbeat has not moved
since the restart is silent (``suspect_after_s``) and holds nothing, until it beats. A live
agent beats within a second; a dead one's registration, heartbeat and holdings may still be in
the store (the whole machine went down, or nothing forgot them), and planning from them made
the first plan after a resume name dead sources, fail, and restore one heartbeat timeout later.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.runtime import keys, ledger, protocol
from liveput.runtime.checkpoint import latest_record
from liveput.runtime.clock import Clock
from liveput.runtime.decide import (
    CoordinatorConfig,
    CoordinatorView,
    Member,
    auto_notice_margin_s,
    margin_in_force,
)
from liveput.runtime.notices import Notice
from liveput.runtime.prune import read_floor
from liveput.runtime.step_times import configuration_step_s, generation_step_s
from liveput.runtime.store import Store, readers

LOG = logging.getLogger(__name__)


@dataclass
class JobProgress:
    """What the coordinator knows of the job's progress (the store has all of it)."""

    plan: protocol.RuntimePlan | None
    """The newest published plan."""
    started: protocol.RuntimePlan | None = None
    """The newest plan that ran (None: none yet)."""
    committed: int = -1
    """The last step committed (-1: none)."""
    fence: tuple[int, int] | None = None
    """(generation, step) of the last fence this coordinator planned."""
    last_commit_s: float = 0.0
    """Clock time a committed step was last seen."""


@dataclass(frozen=True)
class Observed:
    """One observation: the decision's view and what it leaves to record."""

    view: CoordinatorView
    newly_started: bool = False
    """The view's plan ran for the first time (it is to be marked started)."""


class Observer:
    """Reads the store into views; remembers what the store does not say (when a heartbeat
    last moved, when a notice, a failure or a plan was first seen) and the plans it read."""

    def __init__(
        self,
        store: Store,
        config: CoordinatorConfig,
        clock: Clock,
        started_s: float,
        wall_clock: Callable[[], float],
        write_estimate_s: Callable[[protocol.RuntimePlan], float] | None = None,
        move_estimate_s: Callable[[protocol.RuntimePlan | None], float] | None = None,
    ) -> None:
        self.store = store
        self.move_estimate_s = move_estimate_s
        """A move's seconds off a plan's noticed instance, predicted (None: none; the plan None
        before the first): ``--notice-margin auto`` reads it until a move is measured."""
        self.measured_move_s: float | None = None
        """Seconds from the newest plan that moved layers between instances to its first
        step (None: none yet)."""
        self.write_estimate_s = write_estimate_s
        """A checkpoint write's seconds for a plan, estimated (None: none): Rule 9's lead reads
        it until a write is measured, so that a first wipe-out with notice on slow storage is
        checkpointed in time (a write measured only after the first periodic checkpoint)."""
        self.config = config
        self.clock = clock
        self.wall_clock = wall_clock
        """Unix seconds: what the store keeps of when a notice was seen reads the same in the
        next coordinator's process (the clock's seconds do not)."""
        self.started_s = started_s
        """Clock time the coordinator started (views count from it)."""
        self.next_interval_s = started_s
        """Clock time the next interval decision is due."""
        self.seen: dict[int, float] = {}
        """Clock time each instance's heartbeat last moved."""
        self.beats: dict[int, bytes] = {}
        self.first_seen: dict[str, float] = {}
        """Clock time each observed thing (a failure, a notice, a plan) was first seen."""
        self.plans: dict[int, protocol.RuntimePlan] = {}
        self.holdings: dict[int, protocol.Holding] = {}
        """What each instance reported holding at the last observation."""
        self.unheard: dict[int, bytes] = {}
        """Heartbeats found at a recovery that have not moved since (module docstring)."""
        self.planned: set[int] = set()
        """Instances some plan named, or whose arrival the policy was asked about (Rule 7)."""
        self.checkpoint_write_s: float | None = None
        """The newest checkpoint write time recorded (a restore's reset of the latest
        checkpoint records none, and the write time does not change with it)."""
        self.earlier_step_s: tuple[int, float | None] = (-1, None)
        """(generation, the step time earlier generations at its configuration measured): read
        once per generation, until it publishes its own."""

    def recover(self) -> JobProgress:
        """The job's progress as the store has it (a restarted coordinator carries on)."""
        progress = JobProgress(protocol.current_plan(self.store), last_commit_s=self.started_s)
        self.recover_notices()
        plan = progress.plan
        if plan is not None:
            raw = self.store.get(keys.coordinator_started())
            progress.started = None if raw is None else self.load(int(raw))
            # Steps below the floor committed; their keys may have been pruned.
            floor = read_floor(self.store, plan.generation)
            progress.committed = protocol.last_committed(
                self.store, plan.generation, max(plan.start_step, floor or 0)
            )
            # Recovered: learn who is alive (a heartbeat timeout) before deciding anything new.
            self.next_interval_s = self.started_s + self.config.heartbeat_timeout_s
            self.unheard = readers.by_instance(self.store, keys.HEARTBEAT)
            LOG.info(
                "coordinator recovered: generation %d, committed step %d",
                plan.generation,
                progress.committed,
            )
        return progress

    def recover_notices(self) -> None:
        """Count each notice an earlier coordinator saw from when it saw it (``notice-end/<id>``),
        not from now: its lead is partly spent, and counted afresh the job would move off
        the instance only after its end."""
        now, wall_now = self.clock.now_s(), self.wall_clock()
        for instance, raw in readers.by_instance(self.store, keys.NOTICE_END).items():
            try:
                seen_unix_s = float(json.loads(raw)["seen_unix_s"])
            except (ValueError, KeyError, TypeError):
                continue  # unreadable: the notice counts from now, as before it was kept
            self.first_seen[keys.notice(instance)] = now - max(0.0, wall_now - seen_unix_s)

    def load(self, generation: int) -> protocol.RuntimePlan | None:
        """Plan ``generation`` (None: not published)."""
        if generation not in self.plans:
            plan = protocol.load_plan(self.store, generation)
            if plan is None:
                return None
            self.plans[generation] = plan
        return self.plans[generation]

    def remember(self, plan: protocol.RuntimePlan) -> None:
        """A plan this coordinator published."""
        self.plans[plan.generation] = plan

    def forget(self, instances: AbstractSet[int], retire_before: int) -> None:
        """Drop what is remembered of pruned instances and of plans before ``retire_before - 1``
        (the records would grow as the pruned keys did)."""
        for instance in instances:
            self.seen.pop(instance, None)
            self.beats.pop(instance, None)
            self.first_seen.pop(keys.notice(instance), None)
        for generation in [g for g in self.plans if g < retire_before - 1]:
            del self.plans[generation]
            self.first_seen.pop(keys.plan(generation), None)
            self.first_seen.pop(keys.failures(generation), None)
            self.first_seen.pop(keys.checkpoint_request(generation), None)

    def since(self, key: str, now: float) -> float:
        return now - self.first_seen.setdefault(key, now)

    def held_point(self, holding: protocol.Holding, progress: JobProgress) -> tuple[int, int]:
        """(epoch, step) of a holding report's layers now: a report written while its
        generation trains follows every step that generation commits."""
        if holding.ending:
            return holding.epoch, holding.step
        plan = progress.plan
        if plan is not None and holding.generation == plan.generation:
            return holding.epoch, max(holding.step, progress.committed)
        successor = self.load(holding.generation + 1)
        if successor is None:
            return -1, -2
        return holding.epoch, max(holding.step, successor.start_step - 1)

    def refresh_heartbeats(self, now: float) -> None:
        for instance, raw in readers.by_instance(self.store, keys.HEARTBEAT).items():
            if self.beats.get(instance) != raw:
                self.beats[instance] = raw
                self.seen[instance] = now
            if instance in self.unheard and self.unheard[instance] != raw:
                del self.unheard[instance]

    def members(self, now: float, progress: JobProgress) -> dict[int, Member]:
        self.refresh_heartbeats(now)
        states = readers.by_instance(self.store, keys.STATE)
        notices = readers.by_instance(self.store, keys.NOTICE)
        gone = readers.by_instance(self.store, keys.GONE)
        holdings = self.holdings = protocol.holdings(self.store)
        plan = progress.plan
        arrived = set() if plan is None else protocol.arrivals(self.store, plan.generation)
        members = {}
        for instance, raw in readers.by_instance(self.store, keys.MEMBER).items():
            unheard = instance in self.unheard
            holding = None if unheard else holdings.get(instance)
            epoch, step = (-1, -2) if holding is None else self.held_point(holding, progress)
            registration = json.loads(raw)
            age_s = now - self.seen.setdefault(instance, now)
            if unheard:  # just past silent at the restart, however recent its last beat looks
                age_s = now - self.started_s + math.nextafter(self.config.suspect_after_s, math.inf)
            members[instance] = Member(
                host=registration.get("host", "127.0.0.1"),
                on_demand=registration.get("market") == "on-demand",
                heartbeat_age_s=age_s,
                noticed=instance in notices,
                left=states.get(instance) == b"left" or instance in gone,
                done=states.get(instance) == b"done",
                layers=() if holding is None else holding.layers,
                held_epoch=epoch,
                held_step=step,
                reported=-1 if holding is None or not holding.ending else holding.generation,
                arrived=instance in arrived,
                notice_age_s=self.since(keys.notice(instance), now) if instance in notices else 0.0,
                notice_lead_s=_notice_lead_s(notices.get(instance)),
            )
        return members

    @staticmethod
    def failed_in_row(progress: JobProgress, plan_failed: bool) -> int:
        """Plans in a row, the newest last, that did not run (``plan_failed``: the newest has
        failure reports)."""
        plan = progress.plan
        if plan is None:
            return 0
        oldest = -1 if progress.started is None else progress.started.generation
        count = plan.generation - oldest - 1  # superseded before they ran
        if plan.generation != oldest and plan_failed:
            count += 1
        return max(0, count)

    def auto_notice_margin_s(self, plan: protocol.RuntimePlan | None) -> float:
        """``--notice-margin auto``'s margin now (:func:`liveput.runtime.decide.
        auto_notice_margin_s`): from the newest measured move, else the predicted one."""
        predicted_s = 0.0 if self.move_estimate_s is None else self.move_estimate_s(plan)
        return auto_notice_margin_s(self.config, self.measured_move_s, predicted_s)

    def moved(self, plan: protocol.RuntimePlan, seconds: float) -> None:
        """``plan`` moved layers between instances in ``seconds`` (from its publication to its
        first step): ``--notice-margin auto`` follows it, and the log says it beside its
        prediction."""
        self.measured_move_s = seconds
        raw = self.store.get(keys.event(plan.generation))
        event = None if raw is None else json.loads(raw)
        if event is not None and event.get("notice") is not None:
            event["notice"]["measured_s"] = round(seconds, 3)
            self.store.set(keys.event(plan.generation), json.dumps(event).encode())
        predicted = (
            ""
            if self.move_estimate_s is None
            else f" (predicted {self.move_estimate_s(plan):.2f} s)"
        )
        LOG.info(
            "plan %d moved %d layers between instances in %.2f s%s; notice margin auto: %.2f s",
            plan.generation,
            len(plan.transfers),
            seconds,
            predicted,
            self.auto_notice_margin_s(plan),
        )

    def arrival(
        self, members: dict[int, Member], plan: protocol.RuntimePlan, now: float, margin_s: float
    ) -> bool:
        """Rule 7: instances up, not going (``margin_s``: the notice margin in force), that no
        plan named and whose arrival was not flagged yet, the newest registered
        ``arrival_settle_s`` ago or more (then flagged)."""
        self.planned.update(plan.world)
        new = [
            i
            for i, m in members.items()
            if i not in self.planned
            and not (m.left or m.going(margin_s))
            and m.heartbeat_age_s <= self.config.suspect_after_s
        ]
        settled = all(self.since(keys.member(i), now) >= self.config.arrival_settle_s for i in new)
        if not new or not settled:
            return False
        self.planned.update(new)
        return True

    def observe(self, progress: JobProgress) -> Observed:
        """What the decision needs, read from the store; ``progress`` follows what it read (the
        committed step, the plan that started)."""
        now = self.clock.now_s()
        plan = progress.plan
        if plan is not None:  # first: members' holdings are read at this step
            committed = protocol.last_committed(
                self.store, plan.generation, max(progress.committed + 1, plan.start_step)
            )
            if committed > progress.committed:
                progress.last_commit_s = now
            progress.committed = committed
        members = self.members(now, progress)
        interval_due = now >= self.next_interval_s
        if interval_due:
            self.next_interval_s = now + self.config.interval_s
        margin_s = self.auto_notice_margin_s(plan)
        if plan is None:
            registered_s = [self.since(keys.member(i), now) for i in members]
            return Observed(
                CoordinatorView(
                    now - self.started_s,
                    members,
                    None,
                    None,
                    -1,
                    interval_due=interval_due,
                    auto_notice_margin_s=margin_s,
                    registration_age_s=min(registered_s, default=0.0),
                )
            )
        committed = progress.committed
        in_force_s = margin_in_force(self.config, margin_s)
        # Rule 7: an arrival during a move waits for the move (flagged after it, not lost).
        arrival = not protocol.moving(plan, committed) and self.arrival(
            members, plan, now, in_force_s
        )
        all_arrived = self.store.get(keys.all_arrived(plan.generation)) is not None
        newly_started = (
            all_arrived
            and committed >= plan.start_step
            and (progress.started is None or progress.started.generation < plan.generation)
        )
        if newly_started:
            progress.started = plan
            if plan.transfers:  # a move between instances: what the next one may take
                self.moved(plan, self.since(keys.plan(plan.generation), now))
        outcome = protocol.step_outcome(self.store, plan.generation, committed + 1)
        fenced = outcome == protocol.ABORTED and progress.fence != (plan.generation, committed + 1)
        failures = protocol.failures(self.store, plan.generation)
        finishing = committed + 1 >= self.config.num_steps
        request = keys.checkpoint_request(plan.generation)
        checkpoint_requested = self.store.get(request) is not None
        latest, write_s = latest_record(self.store)
        if write_s is not None:
            self.checkpoint_write_s = write_s
        noticed = any(member.noticed for member in members.values())
        step_s = self.step_s(plan) if noticed else None  # only Rule 9 reads it
        return Observed(
            CoordinatorView(
                now_s=now - self.started_s,
                members=members,
                plan=plan,
                started=progress.started,
                committed=committed,
                fenced=fenced,
                all_arrived=all_arrived,
                plan_age_s=self.since(keys.plan(plan.generation), now),
                failures=failures,
                failure_age_s=self.since(keys.failures(plan.generation), now) if failures else 0.0,
                failed_in_row=self.failed_in_row(progress, bool(failures)),
                latest_checkpoint=latest,
                last_step_recorded=finishing and self.recorded(plan.epoch, committed),
                finish_age_s=self.since("finish", now) if finishing else 0.0,
                interval_due=interval_due,
                arrival=arrival,
                checkpoint_requested=checkpoint_requested,
                checkpoint_request_age_s=self.since(request, now) if checkpoint_requested else 0.0,
                step_s=step_s,
                auto_notice_margin_s=margin_s,
                checkpoint_write_s=(
                    self.write_estimate_s(plan)
                    if self.checkpoint_write_s is None and self.write_estimate_s and noticed
                    else self.checkpoint_write_s
                ),
            ),
            newly_started,
        )

    def step_s(self, plan: protocol.RuntimePlan) -> float | None:
        """``plan``'s generation's measured step time; until it has one, its configuration's
        in earlier generations (one read of them all, once per generation)."""
        measured = generation_step_s(self.store, plan.generation)
        if measured is not None:
            return measured
        if self.earlier_step_s[0] != plan.generation:
            earlier = configuration_step_s(self.store, plan.data_parallel, plan.pipeline_stages)
            self.earlier_step_s = (plan.generation, earlier)
        return self.earlier_step_s[1]

    def recorded(self, epoch: int, step: int) -> bool:
        """Whether the ledger has step ``step`` of epoch ``epoch`` (as a record, or folded)."""
        if self.store.get(keys.ledger_record(epoch, step)) is not None:
            return True
        raw = self.store.get(keys.ledger_summary())
        summary = None if raw is None else ledger.LedgerSummary.from_json(raw)
        return summary is not None and summary.epoch == epoch and summary.through_step >= step

    def history(self) -> list[int]:
        """The instance counts of the intervals since the job started (``coord/history``)."""
        return json.loads(self.store.get(keys.coordinator_history()) or b"[]")

    def unfinished(self) -> list[int]:
        """Live instances that have not yet said they are done or left."""
        now = self.clock.now_s()
        self.refresh_heartbeats(now)
        ended = {
            instance
            for instance, value in readers.by_instance(self.store, keys.STATE).items()
            if value in (b"done", b"left")
        }
        return sorted(
            i
            for i, seen_s in self.seen.items()
            if i not in ended and now - seen_s <= self.config.heartbeat_timeout_s
        )


def _notice_lead_s(raw: bytes | None) -> float | None:
    """The lead a reported notice gives, wall seconds (None: none, or not readable). It counts
    from when a coordinator of the job first saw the notice (``notice-end/<id>`` keeps when: a
    restarted coordinator counts on, :meth:`Observer.recover_notices`)."""
    if raw is None:
        return None
    try:
        return Notice.from_json(raw.decode("utf-8", "replace"), "the store").lead_s
    except LiveputError:
        return None
