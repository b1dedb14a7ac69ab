"""The coordinator's loop, one per job: every ``tick_s`` it observes the store (:mod:`.observe`),
records what the observation leaves (:mod:`.publish`), re-fits the table at an interval
(:mod:`.upkeep`), and carries out the policy step's answer (:mod:`.policy`): the objective's market
provisions, a plan is published, or the job is marked done. Then the stall watch and pruning.

Everything it needs to go on is in the store (the current plan, the committed step, which plans
started, the interval history, the counters), so a restarted coordinator recovers and carries on:
a generation that was fenced but whose successor was never published is simply planned again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from liveput.errors import LiveputError
from liveput.perf.types import ModelProfile, with_instance_memory
from liveput.policies import Provisioning
from liveput.policies.deadline import DeadlineContext
from liveput.runtime import keys, protocol
from liveput.runtime.clock import Clock, MonotonicClock
from liveput.runtime.coordinator import upkeep
from liveput.runtime.coordinator.objective import CoordinatorObjective, MarketView, objective_for
from liveput.runtime.coordinator.observe import Observer
from liveput.runtime.coordinator.policy import PolicyInputs, asks_policy, available, step
from liveput.runtime.coordinator.publish import Publisher
from liveput.runtime.decide import Action, ActionKind, CoordinatorConfig, CoordinatorView, decide
from liveput.runtime.prune import Pruner
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)


class Coordinator:
    """Observes the store, asks the policy step, carries out its answer; state lives in the
    store. ``objective``: what the policy plans for (by default the throughput objective, or a
    deadline job's for ``deadline``, whose provisioning ``market`` carries out). It plans with
    ``profile`` for instances of ``config.instance_memory_gb`` GB when the job has that budget."""

    def __init__(
        self,
        store: Store,
        profile: ModelProfile,
        config: CoordinatorConfig,
        clock: Clock | None = None,
        deadline: DeadlineContext | None = None,
        market: MarketView | None = None,
        objective: CoordinatorObjective | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        # The job's memory budget, if it has one, stands for the instances' memory.
        profile = with_instance_memory(profile, config.instance_memory_gb)
        self.profile = profile
        self.config = config
        self.clock = clock or MonotonicClock()
        self.objective = objective or objective_for(deadline, market)
        # Wall time, not the clock's: what the objective keeps must read the same in the next
        # coordinator's process.
        self.objective.recover(store, wall_clock())
        self.planning = self.objective.start(profile, config)
        self.measurements: tuple = ()  # the step times the table was last fitted to
        self.provisioning: Provisioning | None = None  # the policy's latest (None: none yet)
        self.available: list[int] = []  # instances available at the last tick
        self.status = "starting"  # what the job is doing, in words (the progress display's)
        self.action: Action | None = None  # the last decision
        self.started_s = self.clock.now_s()
        self.observer = Observer(
            store,
            config,
            self.clock,
            self.started_s,
            wall_clock,
            self._write_estimate_s,
            self._move_estimate_s,
        )
        self.publisher = Publisher(store, profile, config, self.clock, self.started_s, wall_clock)
        self.stall = upkeep.StallWatch(config.stall_warning_s)
        self.pruner = Pruner(store, config.prune, profile.global_batch_size)
        self.progress = self.observer.recover()

    def _move_estimate_s(self, plan: protocol.RuntimePlan | None) -> float:
        """A move off one of ``plan``'s instances, predicted: a group rebuild of its instances
        and its largest stage's state over the links (before the first plan: the whole
        model's, the most a move can carry)."""
        state = self.profile.layer_state_bytes()
        if plan is None:
            return self.config.costs.rebuild_s(self.config.capacity) + (
                self.config.costs.transfer_s(float(state.sum()))
            )
        bounds = plan.boundaries
        largest = max(int(state[a:b].sum()) for a, b in zip(bounds, bounds[1:], strict=False))
        return self.config.costs.rebuild_s(len(plan.world)) + self.config.costs.transfer_s(largest)

    def _write_estimate_s(self, plan: protocol.RuntimePlan) -> float:
        """A checkpoint write of ``plan``'s largest stage at the migration costs' checkpoint
        bandwidth (each stage's share is written at once, by instances of its own)."""
        state = self.profile.layer_state_bytes()
        bounds = plan.boundaries
        largest = max(int(state[a:b].sum()) for a, b in zip(bounds, bounds[1:], strict=False))
        return self.config.costs.checkpoint_save_s(largest)

    # The newest plan, the newest that ran and the last step committed; the table and policy.
    plan = property(lambda self: self.progress.plan)
    started = property(lambda self: self.progress.started)
    committed = property(lambda self: self.progress.committed)
    table = property(lambda self: self.planning.table)
    calibration = property(lambda self: self.planning.calibration)
    policy = property(lambda self: self.planning.policy)

    def observe(self) -> CoordinatorView:
        """What the decision needs, read from the store (and what the observation leaves,
        recorded; at an interval, the table re-fitted)."""
        observed = self.observer.observe(self.progress)
        self.publisher.record(observed)
        if observed.view.interval_due and self.objective.refits(self.config):
            fitted = upkeep.refitted(self.store, self.profile, self.measurements)
            if fitted is not None:
                self.measurements, calibration = fitted
                self.planning = self.objective.refitted(
                    self.profile, self.config, calibration, self.planning.policy
                )
        return dataclasses.replace(observed.view, fewest_instances=self._fewest_instances())

    def _fewest_instances(self) -> int:
        """The fewest instances a configuration of the table runs on (Rule 9: fewer left
        without a notice, and a noticed stage has nowhere to move)."""
        table = self.table
        sizes = (table.data_parallel * table.pipeline_stages)[table.feasible]
        return int(sizes.min()) if sizes.size else 1

    def _inputs(self, view: CoordinatorView, pending: Action) -> PolicyInputs:
        """What the policy step sees; the history and the market are read only when it asks
        the policy (the market's figures may be a cloud's list of instances)."""
        if not asks_policy(view, self.config, self.objective, pending):
            return PolicyInputs(view)
        return PolicyInputs(view, tuple(self.observer.history()), self.objective.read_market())

    def tick(self) -> bool:
        """One observation and, if needed, one action; False once the job is done."""
        if self.store.get(keys.job_done()) is not None:
            return False
        failure = protocol.job_error(self.store)
        if failure is not None:
            raise failure
        view = self.observe()
        held = self.provisioning
        if held is not None and held.spot_hold is not None:
            view = dataclasses.replace(view, instances_held=held.spot_hold + held.on_demand)
        self.available = available(view, self.config)
        pending = decide(view, self.config)  # the rules, once; the policy only if wanted
        inputs = self._inputs(view, pending)
        if inputs.market is not None:
            self.objective.keep_spending(inputs.market)
        answer = step(inputs, self.config, self.profile, self.planning, self.objective, pending)
        if answer.policy_error is not None:
            LOG.warning(
                "policy %s failed (%s); keeping the fastest fit",
                self.config.policy,
                answer.policy_error,
            )
        if answer.provisioning is not None:
            self.provisioning = answer.provisioning
            self.objective.provision(answer.provisioning)
        action = answer.action
        if action.status != self.status:
            LOG.info("coordinator: %s", action.status)
        self.status = action.status
        self.action = action
        if action.kind is ActionKind.FINISH:
            self.publisher.finish(self.progress.committed)
            return False
        if action.kind is ActionKind.REPLAN:
            self.publisher.publish(action, view, self.progress, self.observer)
        if action.kind is ActionKind.CHECKPOINT:
            self.publisher.request_checkpoint(action, self.progress)
        self.stall.watch(self.clock.now_s(), self.progress, self.status, self.observer)
        self._prune()
        return True

    def _prune(self) -> None:
        upkeep.prune(self.pruner, self.store, self.observer, self.progress, self.config, self.clock)

    def run(self, after_tick: Callable[[Coordinator], None] | None = None) -> None:
        """Tick until the job is done, then see the agents off: the one loop of every
        coordinator (``liveput coordinator``'s, ``liveput train``'s). ``after_tick(self)`` runs
        after each tick (a launcher's upkeep: its cloud, its progress, its time limit); an
        error it raises ends the loop, as does the job's own failure (:class:`JobFailure`: no
        plan can fix it). Other errors of a tick are a store restarting: observed again."""
        while True:
            try:
                if not self.tick():
                    break
            except protocol.JobFailure:
                raise
            except LiveputError as error:  # the store is restarting: observe again later
                LOG.warning("coordinator: %s", error)
            if after_tick is not None:
                after_tick(self)
            self.clock.sleep(self.config.tick_s)
        self.see_off()

    def unfinished(self) -> list[int]:
        """Live instances that have not yet said they are done or left."""
        return self.observer.unfinished()

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
