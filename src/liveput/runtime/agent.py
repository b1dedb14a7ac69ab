"""The agent: one per instance. Joins, heartbeats, reports its preemption notice, trains, migrates.

States (:class:`AgentState`) and their transitions::

    JOINING --registered--> WAITING
    WAITING --a plan names it--> MIGRATING      WAITING --job done--> DONE
    WAITING --going (notice nearly spent), left out of a plan made after it joined--> LEFT
    MIGRATING --has a slot--> TRAINING          MIGRATING --spare, or a peer failed--> WAITING
    TRAINING --fenced or a peer failed--> WAITING
    TRAINING --last step applied--> DONE
    WAITING, MIGRATING, TRAINING --the job failed (job/error)--> FAILED

Leaving TRAINING (or MIGRATING) for WAITING never waits for a communication timeout: a watcher
thread aborts the generation's process groups as soon as the store says the generation is over
(a failure report, a fence of the step in flight, a newer plan, or the job's failure), and the
training thread, blocked in a collective on a frozen or cut-off peer, leaves it at once
(:class:`~liveput.runtime.comm.CommAborted`). The step in flight is not applied; the agent waits
for the next plan. An agent that was itself frozen or cut off finds, when it wakes, its
generation over the same way and joins the plan after as a member again. FAILED ends the agent
with the job's one-line error (a layer raised, the loss is not finite).

A notice does not stop training by itself: the agent reports it at once (``notice/<id>``, with
the lead it gives) and keeps going until the coordinator moves its layers away, ``notice_margin_s``
before the announced end (at once for a notice without a lead); then it leaves. Left out of a
plan before that (a spare: the policy ran on fewer instances), it stays and may be planned
again: leaving at once gave away the rest of its lead (bench peers, p3 cut: a spare left 40 s
before its end; once the other instance was preempted, the job trained nothing for 30 s). The
cloud's SIGKILL may come first; the plan after that restores what was lost.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.runtime import keys, protocol
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.comm import configure_error_handling, end_process
from liveput.runtime.decide import moves_after_s
from liveput.runtime.engine import Ending, Engine
from liveput.runtime.logs import RepeatFilter
from liveput.runtime.notices import Notice, NoticeMonitor, NoticeWatcher
from liveput.runtime.store import Store, readers

LOG = logging.getLogger(__name__)


class AgentState(enum.Enum):
    """Where an agent is in its life (module docstring: transitions)."""

    JOINING = "joining"
    WAITING = "waiting"
    MIGRATING = "migrating"
    TRAINING = "training"
    DONE = "done"
    LEFT = "left"
    FAILED = "failed"


_TRANSITIONS = {
    AgentState.JOINING: {AgentState.WAITING},
    AgentState.WAITING: {AgentState.MIGRATING, AgentState.DONE, AgentState.LEFT, AgentState.FAILED},
    AgentState.MIGRATING: {
        AgentState.TRAINING,
        AgentState.WAITING,
        AgentState.DONE,
        AgentState.FAILED,
    },
    AgentState.TRAINING: {AgentState.WAITING, AgentState.DONE, AgentState.FAILED},
}
"""Allowed moves. MIGRATING covers rebuilding groups and moving layers; a spare, or an instance
whose migration failed, goes back to WAITING without training."""


WARM_CHECK_S = 1.0
"""Seconds between an idle agent's looks whether a move is coming (:meth:`Agent._warm_up_due`)."""

MARKETS = ("spot", "on-demand")
"""How an instance is rented."""


@dataclass(frozen=True)
class AgentConfig:
    """Settings of an agent."""

    instance: int
    """This instance's id (unique in the job)."""
    host: str = "127.0.0.1"
    """Address the other instances reach this one at."""
    market: str = "spot"
    """``spot`` or ``on-demand`` (what its provider rented it as: the planner spreads on-demand
    instances over the stages)."""
    device: str = "cpu"
    """The device it trains on, as status shows it (``cuda:0 (NVIDIA H100 ...)``)."""
    heartbeat_s: float = 0.5
    """Seconds between heartbeats."""
    poll_s: float = 0.1
    """Seconds between looks at the store while waiting for a plan."""
    store_outage_s: float = 120.0
    """Longest the store may stay unreachable, seconds: long enough for an etcd restart; a store
    that stays gone (an embedded store whose coordinator ended) then stops the agent with an
    error instead of a silent wait."""
    notice_margin_s: float | None = 20.0
    """The coordinator's ``notice_margin_s`` (the job spec's): a noticed agent left out of a
    plan leaves only once its lead is this close to spent. Each plan says the margin it was
    made with, which the agent follows once it has seen one; None (``auto``): only that."""
    exit_on_store_loss: bool = False
    """End the process (exit code 3) once the store has been unreachable for
    ``store_outage_s``, even if training is blocked in a collective (agent processes)."""

    def __post_init__(self) -> None:
        if self.instance < 0:
            raise LiveputError(f"agent: instance id must be >= 0, got {self.instance}")
        if self.heartbeat_s <= 0 or self.poll_s <= 0 or self.store_outage_s <= 0:
            raise LiveputError("agent: heartbeat, poll and store-outage times must be positive")
        if self.notice_margin_s is not None and self.notice_margin_s < 0:
            raise LiveputError(f"agent: notice margin must be >= 0, got {self.notice_margin_s:g}")
        if self.market not in MARKETS:
            raise LiveputError(f"agent: market {self.market!r} is not one of {', '.join(MARKETS)}")


class Agent:
    """Runs one instance's part of the job until the job is done or the instance leaves."""

    def __init__(
        self,
        config: AgentConfig,
        store: Store,
        engine: Engine,
        watchers: list[NoticeWatcher] | None = None,
        clock: Clock | None = None,
    ) -> None:
        configure_error_handling()  # before the engine makes any process group
        self.config = config
        self.store = store
        self.engine = engine
        self.clock = clock or MonotonicClock()
        self.state = AgentState.JOINING
        self.notice: Notice | None = None
        self.noticed_at_s = 0.0
        """When the notice came (this agent's clock)."""
        self.joined_under = -1
        """Generation of the plan in force when this agent joined (-1: none): a plan not newer
        was made without it, so leaving it out says nothing about a noticed agent's future, and
        one that names its instance was made for an earlier process (:meth:`_disown`)."""
        self._next_warm_check_s = 0.0
        """When an idle agent next looks whether to warm up (:meth:`_warm_up_due`)."""
        self.plan_margin_s: float | None = None
        """The notice margin of the newest plan it read (None: none said one yet)."""
        self._stop = threading.Event()
        # One per source: the heartbeat thread and the main thread fail and recover separately.
        self._heartbeat_warnings = RepeatFilter(LOG, now_s=self.clock.now_s)
        self._store_warnings = RepeatFilter(LOG, now_s=self.clock.now_s)
        self._monitor = NoticeMonitor(watchers, self._on_notice, 0.2) if watchers else None
        self._heartbeat = threading.Thread(target=self._beat, name="liveput-heartbeat", daemon=True)

    def _move(self, state: AgentState) -> None:
        if state not in _TRANSITIONS.get(self.state, set()):
            raise LiveputError(
                f"agent {self.config.instance}: no transition {self.state.value} -> {state.value}"
            )
        LOG.info("agent %d: %s -> %s", self.config.instance, self.state.value, state.value)
        self.state = state
        try:
            self.store.set(keys.state(self.config.instance), state.value.encode())
        except LiveputError as error:
            # Informational for the coordinator, which decides from heartbeats and holdings: a
            # store outage (an etcd restart) must not end the agent, nor the end of a finished
            # job's store (the coordinator hosting it exits once the job is done) fail it.
            self._store_warnings(
                f"agent {self.config.instance}: state {state.value} not recorded: {error}"
            )

    def _on_notice(self, notice: Notice) -> None:
        self.notice, self.noticed_at_s = notice, self.clock.now_s()
        self.store.set(keys.notice(self.config.instance), notice.to_json().encode())

    def going(self) -> bool:
        """Its notice gives no lead, or less than the notice margin of it is left (the
        coordinator's rule: it then plans without this instance). The margin is the newest
        plan's, else the job spec's (none: not before the end its notice announces)."""
        margin_s = self.plan_margin_s
        if margin_s is None:
            margin_s = self.config.notice_margin_s or 0.0
        return self.notice is not None and self.clock.now_s() - self.noticed_at_s >= moves_after_s(
            self.notice.lead_s, margin_s
        )

    def _read(self, plan: protocol.RuntimePlan | None) -> protocol.RuntimePlan | None:
        """``plan``, its notice margin kept (:meth:`going`)."""
        if plan is not None and plan.notice_margin_s is not None:
            self.plan_margin_s = plan.notice_margin_s
        return plan

    def _beat(self) -> None:
        key = keys.heartbeat(self.config.instance)
        last_ok_s = self.clock.now_s()
        while not self._stop.wait(self.config.heartbeat_s):
            try:
                if self.store.add(key, 1) == 1:
                    # The counter started again: the coordinator forgot this instance (silent
                    # for its forget_after_s, e.g. a long partition). Join again.
                    self.store.set(keys.member(self.config.instance), self._member())
                last_ok_s = self.clock.now_s()
                self._heartbeat_warnings.flush()
            except LiveputError as error:  # the store may be restarting; keep trying
                self._heartbeat_warnings(f"agent {self.config.instance}: heartbeat failed: {error}")
                down_s = self.clock.now_s() - last_ok_s
                if self.config.exit_on_store_loss and down_s >= self.config.store_outage_s:
                    self._exit_on_store_loss(down_s)

    def _exit_on_store_loss(self, down_s: float) -> None:
        """End the process at once: the main thread may be blocked in a C++ collective, and a
        SIGTERM handler (the notice watcher's) would not end it either."""
        self._heartbeat_warnings.flush()
        LOG.error(
            "agent %d: the store has been unreachable for %.0f s; exiting",
            self.config.instance,
            down_s,
        )
        end_process(3)

    def _member(self) -> bytes:
        return json.dumps(
            {"host": self.config.host, "market": self.config.market, "device": self.config.device}
        ).encode()

    def join(self) -> None:
        """Register with the job (the store refuses values not signed with the job token)."""
        # Read before registering: a plan of this generation or older was made before this
        # process's registration existed (one that names this instance names an earlier
        # process of it).
        current = readers.current_generation(self.store)
        self.joined_under = -1 if current is None else current
        # A process that joins holds nothing, has no notice, and runs. What an earlier process
        # of this instance left (it died; this one took its place, as a resumed job's provider
        # starts one) would, once this one beats, name layers at a step that no process holds,
        # count the earlier notice's lead as this one's, or keep it out of every plan as gone.
        instance = self.config.instance
        for key in (
            keys.holding(instance),
            keys.notice(instance),
            keys.notice_end(instance),
            keys.gone(instance),
        ):
            self.store.delete(key)
        self.store.set(keys.member(instance), self._member())
        self.store.add(keys.heartbeat(instance), 1)
        self._heartbeat.start()
        if self._monitor is not None:
            self._monitor.start()
        self._move(AgentState.WAITING)
        # The coordinator counts an instance's loss once, when it creates ``lost/<id>``: left
        # by the earlier process, this one's loss would go uncounted. Deleted last, once this
        # process beats and waits, so that no look in between takes the earlier one as lost
        # again.
        self.store.delete(keys.lost(instance))

    def _next_plan(self, after: int) -> protocol.RuntimePlan | None:
        """Wait for a plan newer than generation ``after`` (the one it ran, if any) that names
        this instance (None: the job is done, or this instance is going and a plan made since it
        joined leaves it out: names it not at all, or only to hand its layers over).

        A going instance whose own generation just ended waits for the plan after it: the
        coordinator fences the step in flight before it publishes that plan, which may keep it
        (every instance noticed, no other up); one that left on seeing the fence alone took the
        job's layers with it (a wipe-out's just-in-time checkpoint was never taken)."""
        left_out: bool | None = None  # the newest plan seen gives this instance no slot
        failing_since_s: float | None = None
        while not self._stop.is_set():
            try:
                if left_out is None:  # the plan it ran: one that only took its layers away?
                    ran = self._read(protocol.load_plan(self.store, after)) if after >= 0 else None
                    left_out = ran is not None and ran.slots.get(self.config.instance) is None
                if self.store.get(keys.job_done()) is not None:
                    return None
                failure = protocol.job_error(self.store)
                if failure is not None:
                    raise failure
                current = readers.current_generation(self.store)
                if current is not None and current > after:
                    plan = self._read(protocol.load_plan(self.store, current))
                    mine = plan is not None and self.config.instance in plan.slots
                    if mine and current > self.joined_under:
                        return plan
                    if mine:
                        self._disown(current)
                    if plan is not None:
                        after, left_out = current, True
                if self.going() and left_out and after > self.joined_under:
                    return None  # a plan made knowing this instance left it out: it goes
                if self._warm_up_due(current) and not self.engine.warm:
                    LOG.info(
                        "agent %d: warmed up in %.2f s (idle; plan %d trains with a notice)",
                        self.config.instance,
                        self.engine.warm_up(),
                        current,
                    )
                failing_since_s = None
                self._store_warnings.flush()
            except protocol.JobFailure:
                raise
            except LiveputError as error:
                now_s = self.clock.now_s()
                failing_since_s = now_s if failing_since_s is None else failing_since_s
                if now_s - failing_since_s > self.config.store_outage_s:
                    raise LiveputError(
                        f"agent {self.config.instance}: the store has been unreachable for "
                        f"{now_s - failing_since_s:.0f} s; is the coordinator gone? ({error})"
                    ) from None
                self._store_warnings(f"agent {self.config.instance}: store: {error}")
            self.clock.sleep(self.config.poll_s)
        return None

    def _warm_up_due(self, generation: int | None) -> bool:
        """Plan ``generation`` trains (its first step committed) without this instance, and an
        instance of it has a notice: the next plan is coming and may need this one, so it
        builds now what its first layers will need (:meth:`Engine.warm_up`). Not before the
        plan's first step: where instances share a machine's cores (the emulated cloud), the
        plan's own instances need them to start; nor without a notice: a spare that is never
        planned would spend them for nothing (4 spares of 8 instances on two cores: 14 CPU-s)."""
        now_s = self.clock.now_s()
        if generation is None or now_s < self._next_warm_check_s:
            return False
        # Three store reads: once a second, not at every poll of every idle agent.
        self._next_warm_check_s = now_s + WARM_CHECK_S
        plan = protocol.load_plan(self.store, generation)
        if plan is None or plan.slots.get(self.config.instance) is not None:
            return False
        noticed = readers.by_instance(self.store, keys.NOTICE)
        return any(plan.slots.get(i) is not None for i in noticed) and (
            protocol.step_outcome(self.store, generation, plan.start_step) == protocol.COMMITTED
        )

    def _disown(self, generation: int) -> None:
        """Plan ``generation``, made before this process joined, names this instance: it was
        made for an earlier process of it (dead; a resumed job's provider starts this one in its
        place), whose layers this one does not hold. Run, it would replay the plan's committed
        steps from the plan's start, or wait for peers long gone. The failure report makes the
        coordinator plan again, from what the processes that are there hold."""
        LOG.info(
            "agent %d: plan %d was made before this process joined; reporting it failed",
            self.config.instance,
            generation,
        )
        protocol.report_failure(
            self.store,
            generation,
            self.config.instance,
            protocol.FailureReport(
                f"instance {self.config.instance} joined after plan {generation} was made: "
                "a new process, holding none of its layers"
            ),
        )

    def _job_done(self) -> bool:
        try:
            return self.store.get(keys.job_done()) is not None
        except LiveputError:
            return False  # unknown: the store is down (a finished job's store may be gone)

    def _finish(self, job_done: bool) -> AgentState:
        """Record the final state: DONE once the job is done, else LEFT."""
        final = AgentState.DONE if job_done else AgentState.LEFT
        self._move(final)
        return final

    def run(self) -> AgentState:
        """Join, then follow plans; the final state (DONE or LEFT). The job's failure
        (:class:`~liveput.runtime.protocol.JobFailure`) is raised after the move to FAILED."""
        if self.state is AgentState.JOINING:
            self.join()
        generation = -1
        try:
            while True:
                plan = self._next_plan(generation)
                if plan is None:
                    return self._finish(self._job_done() or self.notice is None)
                generation = plan.generation
                self._move(AgentState.MIGRATING)
                result = self.engine.run_generation(
                    plan, on_training=lambda: self._move(AgentState.TRAINING)
                )
                if result.ending is Ending.FINISHED:
                    return self._finish(job_done=True)
                self._move(AgentState.WAITING)
        except protocol.JobFailure:
            self._move(AgentState.FAILED)
            raise
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        if self._monitor is not None:
            self._monitor.close()
        if self.engine.checkpointer is not None:
            self.engine.checkpointer.close()
