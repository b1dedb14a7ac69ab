"""The coordinator's policy step: what it sees in, one answer out; no store, clock or market.

The numbered rules of :func:`liveput.runtime.decide.decide` say what to do and when a
configuration is wanted; the step then asks the policy (the objective, :mod:`.objective`, shapes
what the policy sees), fits its configuration to the instances available (when it does not run
on them, or the policy fails: the fastest configuration that does), and returns everything the
loop carries out as one :class:`Answer`:

- the action; a restart the policy asked for is carried out as one: every layer from the newest
  complete checkpoint, whatever the survivors hold (the reactive baseline, executed for real);
- the provisioning the policy asked for (None: none this tick);
- whether the policy asked for a restart.

An objective that provisions every interval has its policy asked at every interval, also when
the rules want no configuration (before the first plan, or with no instance up). The policy is
asked at most once a step, and the rules run once (their action waits for the policy's
configuration where it wants one: :attr:`Action.wanted`); it may keep what it learns from what
it is asked (a forecaster's state), as it does in the simulator.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.configuration import Configuration, ObservationEvent
from liveput.perf.types import ConfigTable, ModelProfile
from liveput.policies import Decision, Observation, Provisioning
from liveput.runtime.coordinator.objective import CoordinatorObjective, MarketReading, Planning
from liveput.runtime.decide import (
    Action,
    ActionKind,
    CoordinatorConfig,
    CoordinatorView,
    complete,
    decide,
    notice_margin_s,
)
from liveput.traces.trace import IntervalTrace


@dataclass(frozen=True)
class PolicyInputs:
    """What the policy step sees."""

    view: CoordinatorView
    """What the control loop's rules see."""
    history: tuple[int, ...] = ()
    """Spot instances up in each interval since the job started (``coord/history``); needed
    only when the policy is asked (:func:`asks_policy`)."""
    market: MarketReading | None = None
    """What the market holds, for an objective that reads it; needed only when the policy is
    asked."""


@dataclass(frozen=True)
class Answer:
    """One step's answer: what the loop carries out."""

    action: Action
    """What the control loop does (for a replan, the configuration)."""
    provisioning: Provisioning | None = None
    """What the policy wants rented from now on (None: nothing new)."""
    restart: bool = False
    """The policy asked for a restart (a replan restores every layer from the checkpoint)."""
    asked: bool = False
    """The policy was asked."""
    policy_error: str | None = None
    """Why the policy failed, when it did (the fastest fit was kept)."""


def available(view: CoordinatorView, config: CoordinatorConfig) -> list[int]:
    """Instances available (alive and not going), in order."""
    return sorted(
        i
        for i, m in view.members.items()
        if not m.left
        and not m.going(notice_margin_s(view, config))
        and m.heartbeat_age_s <= config.heartbeat_timeout_s
    )


def noticed_ends_s(
    view: CoordinatorView, config: CoordinatorConfig, scale: float = 1.0
) -> tuple[float, ...]:
    """Seconds (times ``scale``) to the end each available instance's notice announces (those
    whose notice gives a lead), in the order of :func:`available`."""
    ends = (view.members[i].end_in_s() for i in available(view, config))
    return tuple(max(end, 0.0) * scale for end in ends if end is not None)


def asks_policy(
    view: CoordinatorView,
    config: CoordinatorConfig,
    objective: CoordinatorObjective,
    pending: Action | None = None,
) -> bool:
    """Whether :func:`step` asks the policy on ``view`` (what it needs besides, a store read and
    perhaps a cloud's list of instances, is then read): the rules' action (``pending``, the
    rules' answer without a policy: :func:`decide` run once) wants a configuration, or the
    objective provisions every interval and one is due."""
    pending = pending or decide(view, config)
    return pending.wanted is not None or (
        objective.provisions_every_interval
        and view.interval_due
        and pending.kind is not ActionKind.FINISH
    )


def history_trace(counts: tuple[int, ...], available: int, interval_s: float) -> IntervalTrace:
    """The instance counts of the intervals since the job started; before it has any, the count
    now (``available``): the start-up's empty intervals, before instances could register, are no
    observation of the market (read as one, a count of 0 made the liveput policy start on one
    instance of two)."""
    count = np.array(list(counts) or [available], dtype=np.int64)
    change = np.append(np.diff(count), 0)
    return IntervalTrace(
        "runtime", interval_s, count, np.maximum(-change, 0), np.maximum(change, 0)
    )


def fit(
    wanted: Configuration | None,
    num_instances: int,
    table: ConfigTable,
    profile: ModelProfile,
    config: CoordinatorConfig,
) -> Configuration | None:
    """``wanted`` if it runs on ``num_instances`` and the table has it feasible (it fits the
    instances' memory, or the job's budget), else the fastest configuration that does
    (:meth:`ConfigTable.best_for`). A configuration runs when each pipeline has a micro-batch
    (``D <= num_micro_batches``) and each stage a layer (``P <= num_layers``)."""
    runnable = dataclasses.replace(
        table,
        feasible=table.feasible
        & (table.data_parallel <= config.num_micro_batches)
        & (table.pipeline_stages <= profile.num_layers),
    )
    if wanted is not None and wanted.num_instances <= num_instances:
        same = (runnable.data_parallel == wanted.data_parallel) & (
            runnable.pipeline_stages == wanted.pipeline_stages
        )
        if (same & runnable.feasible).any():
            return wanted
    best = runnable.best_for(num_instances)
    return None if best is None else Configuration(best[0], best[1])


def step(
    inputs: PolicyInputs,
    config: CoordinatorConfig,
    profile: ModelProfile,
    planning: Planning,
    objective: CoordinatorObjective,
    pending: Action | None = None,
) -> Answer:
    """The rules' action, with the policy asked when a configuration is wanted (module
    docstring); ``pending``: the rules' action on ``inputs.view`` already decided (None: decided
    here)."""
    view = inputs.view
    pending = pending or decide(view, config)
    decisions: list[Decision | None] = []  # the policy's answer, when asked (None: it failed)
    errors: list[str] = []

    def ask(
        num_available: int, event: str, lost_slots: tuple[tuple[int, int], ...]
    ) -> Configuration | None:
        history = history_trace(inputs.history, num_available, config.policy_interval_s)
        current = (
            None
            if view.plan is None
            else Configuration(view.plan.data_parallel, view.plan.pipeline_stages)
        )
        # Policies get time in policy seconds, as intervals are: one unit for both.
        scale = config.policy_interval_s / config.interval_s
        observation = objective.observation(
            Observation(
                time_s=view.now_s * scale,
                interval_index=len(history.count) - 1,
                interval_s=config.policy_interval_s,
                history=history,
                num_available=num_available,
                current=current,
                capacity=config.capacity,
                event=ObservationEvent(event),  # the rules name it as a plain string
                lost_slots=lost_slots,
                remaining_s=config.policy_interval_s,
                noticed_ends_s=noticed_ends_s(view, config, scale),
            ),
            view,
            inputs.market,
            profile,
            config,
        )
        try:
            decision = planning.policy.decide(observation)
        except LiveputError as error:
            decisions.append(None)
            errors.append(str(error))
            return fit(current, num_available, planning.table, profile, config)
        decisions.append(decision)
        return fit(
            decision.configuration or current, num_available, planning.table, profile, config
        )

    wanted = pending.wanted
    action = (
        pending
        if wanted is None
        else complete(
            pending, ask(wanted.num_available, wanted.event, wanted.lost_slots), view, config
        )
    )
    restart = bool(decisions) and decisions[0] is not None and decisions[0].migration == "restart"
    if action.kind is ActionKind.REPLAN and restart and not action.restore:
        action = dataclasses.replace(action, restore=True)
    if (
        not decisions
        and objective.provisions_every_interval
        and view.interval_due
        and action.kind is not ActionKind.FINISH
    ):
        ask(len(available(view, config)), "interval", ())
    decision = decisions[0] if decisions else None
    return Answer(
        action,
        None if decision is None else decision.provisioning,
        restart,
        bool(decisions),
        errors[0] if errors else None,
    )
