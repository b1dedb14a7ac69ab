"""The coordinator's decision: from what it sees to what it does, with no store, clock or process.

The executor (:class:`liveput.runtime.coordinator.Coordinator`) observes the store into a
:class:`CoordinatorView` and carries out the :class:`Action` that :func:`decide` returns. Every
rule of the control loop is here, so it is tested with a manual clock and no agent processes.

Notation. The *plan* is the newest published plan (generation g); the *started* plan the newest
one that ran (every instance arrived and a step of it committed). ``committed`` is the last step
committed, ``epoch`` the restore epoch of the plan. An instance is

- *dead* when its heartbeat has not moved for ``heartbeat_timeout_s``, or for
  ``suspect_after_s`` once the end its notice announced has passed (the cloud said it would
  go, and nobody else may be there to report it), or it said it left, or the cloud said its
  instance ended (no heartbeat timeout to wait for: a total loss restores as soon as an
  instance is back);
- *going* when it has a preemption notice whose lead is (nearly) spent: the notice margin
  (:func:`notice_margin_s`: ``notice_margin_s``, or with ``auto`` twice the move measured)
  before the end its notice announces, or at once for a notice that gives no lead. Until then a
  noticed instance trains like any other: the lead is paid-for time, and moving off it at the
  notice would give away up to two minutes of an instance for every preemption;
- *silent* when its heartbeat has not moved for ``suspect_after_s``;
- *suspect* (left out of the next plan) when it is a member of the plan and dead, silent with the
  plan failing or not yet met, named by a peer's failure report, or still missing after
  ``arrival_timeout_s`` or ``failure_wait_s`` (a *last holder*, Rule 8, only when dead or
  named). A suspect that was alive after all is simply available again at the next decision,
  holding nothing current;
- *current* holder of a layer when its report (:class:`liveput.runtime.protocol.Holding`) puts the
  layer at (``epoch``, ``committed``): only current holders send layers, never a plan's guess;
- a *last holder* when it is silent but not dead and the only current holders of one of its
  current layers are silent too (no instance that is heard holds it).

Rules, in order (numbered as in :func:`decide`):

1. No plan yet: start once ``initial_workers`` have registered (no more than the objective's
   provisioning holds, at least one), ``start_grace_s`` passed, or none registered for
   ``start_settle_s`` (the rest may never come; a later one joins as an arrival, Rule 7).
   Instances with a preemption notice count toward ``initial_workers`` (waiting for them to
   be replaced would only lose time) but the plan is made on the others when there are any.
2. The last step committed: finish once the ledger has it and every live worker of the plan
   says it is done (an agent still writing would lose the store, hosted by the coordinator), or
   after a heartbeat timeout.
3. A working instance lost (dead, suspect or going), a plan that cannot meet, a fence nobody
   planned (a restarted coordinator), or a failure report: replan without the suspects and
   without any silent instance but the last holders (Rule 8). Instances going together (a
   cloud preempting several at once) are gathered for ``notice_settle_s``; after a failure
   report the coordinator waits until every member of the plan has reported or gone silent, at
   most ``failure_wait_s``.
4. A going instance only sends its layers. A plan that fails is never published again as it
   was: each failure narrows the next plan (suspects out, holdings re-read), and after
   ``restore_after_failures`` plans in a row that did not run, every layer comes from the newest
   complete checkpoint.
5. Layers no current holder has come from the checkpoint (:func:`planning.plan_generation`).
6. No instance available: wait; the next plan restores from the checkpoint. When the only
   instances up are going, train on them while they last (the plan records them as
   ``noticed``, so their going is no news) rather than wait with nothing running; a step after
   the newest checkpoint may then be redone. As soon as an instance that is not going is up,
   the job moves to it (the going ones send their layers).
7. At an interval, and when instances registered outside every plan so far (an arrival,
   gathered for ``arrival_settle_s``): ask the policy; replan when its configuration differs
   from the running one. An instance that boots mid-interval is not left idle until the next
   (a minute, where a cloud instance takes one or two to boot); the forecasting policy's
   history keeps one count per interval all the same. Neither supersedes a move in flight
   (:func:`protocol.moving`: layers on their way, no step of the plan committed): over a slow
   link a stage's state takes many steps' time to move, and a plan published before it arrived
   would stop the instances for that move and the next; the arrival waits for the first step.
8. A last holder stays in the plan until its heartbeat times out (or a peer names it): left
   out, its layers would come from the checkpoint, a restore and the steps since it lost, for
   an instance that may only be starved (a busy machine delays heartbeats past
   ``suspect_after_s`` long before it kills anything). If it is dead after all, the plan it is
   in fails and the next one, made once its heartbeat timed out, restores as it would have.
9. Just in time: when every current holder of some layer has a notice and the instances that
   stay up a margin past the earliest end those notices announce run no configuration (fewer
   than ``fewest_instances``: a wipe-out with notice, nowhere to move that layer to; where they
   run one, the going holders send their layers at the margin, Rules 3-4), a lead before that
   end (:func:`checkpoint_lead_s`: a few measured steps and checkpoint writes, at most a fixed
   ``notice_margin_s``; ``jit_checkpoint_lead_s`` until measured), the running plan is
   fenced at the next step boundary and its instances checkpoint the step they end at (a
   :data:`ActionKind.CHECKPOINT`); the coordinator waits for that checkpoint (at most the
   lead, less once a writer falls silent), then replans without the
   plan's going instances (they leave once their generation ends): the next plan restores the
   step the job was at, and no step is redone. Every second of the lead is a second the
   instances could have trained, hence aimed from measurements. A notice that announces no end
   (a bare SIGTERM) gives no time to aim at: Rule 6 trains on as before.
"""

from __future__ import annotations

import dataclasses

from liveput.perf.configuration import Configuration
from liveput.runtime import membership
from liveput.runtime.coordinator_config import CoordinatorConfig
from liveput.runtime.coordinator_view import (
    Action,
    ActionKind,
    Choose,
    CoordinatorView,
    Member,
    Wanted,
    moves_after_s,
)
from liveput.runtime.just_in_time import checkpoint_before_end, checkpoint_lead_s
from liveput.runtime.notice_margin import auto_notice_margin_s, margin_in_force, notice_margin_s
from liveput.runtime.protocol import moving

__all__ = [
    "Action",
    "ActionKind",
    "Choose",
    "CoordinatorConfig",
    "CoordinatorView",
    "Member",
    "auto_notice_margin_s",
    "checkpoint_lead_s",
    "complete",
    "decide",
    "margin_in_force",
    "moves_after_s",
    "notice_margin_s",
]


def _replan(
    view: CoordinatorView,
    config: CoordinatorConfig,
    choose: Choose | None,
    reason: str,
    suspects: frozenset[int],
    lost_slots: tuple[tuple[int, int], ...],
    event: str,
    target: Configuration | None = None,
) -> Action:
    plan = view.plan
    epoch = plan.epoch if plan is not None else 0
    alive = membership.alive(view, config, suspects)
    margin = notice_margin_s(view, config)
    if view.checkpoint_requested and plan is not None:
        # Rule 9: the plan's going instances checkpointed, and leave once their generation ends.
        alive = {i: m for i, m in alive.items() if not (m.going(margin) and i in plan.slots)}
    workers = tuple(sorted(i for i, m in alive.items() if not m.going(margin)))
    # Rule 4: a going instance only sends (and only what is current).
    senders = tuple(sorted(i for i, m in alive.items() if m.going(margin)))
    noticed_workers: tuple[int, ...] = ()
    if not workers and senders:  # Rule 6: only going instances are up; train while they last
        workers, senders, noticed_workers = senders, (), senders
    holdings = {
        i: alive[i].layers
        for i in workers + senders
        if alive[i].layers and (alive[i].held_epoch, alive[i].held_step) == (epoch, view.committed)
    }
    if not workers:  # Rule 6
        return Action(
            ActionKind.WAIT,
            "waiting for instances (none available; the next plan "
            f"restores from {_checkpoint_name(view)})",
            suspects=suspects,
        )
    pending = Action(
        ActionKind.REPLAN,
        "choosing a configuration",
        reason,
        None,
        workers,
        senders,
        holdings,
        False,
        suspects,
        lost_slots,
        noticed_workers,
        notice_margin_s=margin,
        wanted=Wanted(len(workers), event, lost_slots),
    )
    if target is not None:
        return complete(pending, target, view, config)
    if choose is None:
        return pending
    return complete(pending, choose(len(workers), event, lost_slots), view, config)


def complete(
    action: Action, target: Configuration | None, view: CoordinatorView, config: CoordinatorConfig
) -> Action:
    """``action``, which wanted a configuration (:class:`Wanted`), with the policy's answer
    ``target`` (None: none runs on what is there)."""
    wanted = action.wanted
    assert wanted is not None
    plan = view.plan
    if wanted.unless_running is not None and target in (None, wanted.unless_running):
        assert plan is not None
        return Action(ActionKind.NONE, f"training {plan.data_parallel}x{plan.pipeline_stages}")
    action = dataclasses.replace(action, wanted=None)
    if action.kind is not ActionKind.REPLAN:
        return action  # Rule 7's new configuration, with nobody to plan on
    if target is None:
        return Action(
            ActionKind.WAIT,
            f"waiting for instances: no configuration runs on {len(action.workers)}",
            suspects=action.suspects,
        )
    restore = view.failed_in_row >= config.restore_after_failures
    status = (
        f"restoring from {_checkpoint_name(view)} to {target}"
        if restore
        else f"migrating to {target}"
    )
    if action.noticed_workers:
        status += (
            f" on {len(action.noticed_workers)} instance(s) with a preemption notice (no "
            "other is up)"
        )
    return dataclasses.replace(action, status=status, target=target, restore=restore)


def _short(reason: str) -> str:
    """An error without gloo's source path and advice."""
    reason = reason.split("] ", 1)[-1] if reason.startswith("[") else reason
    return reason.split(". ", 1)[0][:120]


def _checkpoint_name(view: CoordinatorView) -> str:
    step = view.latest_checkpoint
    return "the initial weights" if step is None else f"step {step}"


def decide(
    view: CoordinatorView, config: CoordinatorConfig, choose: Choose | None = None
) -> Action:
    """The coordinator's next action (module docstring: the rules). Without ``choose``, an
    action that needs the policy's configuration comes back with :attr:`Action.wanted` set:
    ask the policy, then :func:`complete` it (the rules run once)."""
    plan = view.plan
    members = view.members
    margin = notice_margin_s(view, config)
    if plan is None:  # Rule 1
        alive = membership.alive(view, config)
        up = [i for i, m in alive.items() if not m.going(margin)]
        num_going = len(alive) - len(up)
        # Rule 6 (in _replan): going instances are planned on when no other is up.
        wanted = config.initial_workers
        if view.instances_held is not None:  # a deadline policy that holds fewer: none to wait for
            wanted = max(1, min(wanted, view.instances_held))
        settled = view.registration_age_s >= config.start_settle_s
        if alive and (len(alive) >= wanted or view.now_s >= config.start_grace_s or settled):
            return _replan(view, config, choose, "start", frozenset(), (), "interval")
        noticed = (
            f"; {num_going} with a preemption notice, used from "
            f"{config.start_grace_s:g} s if no other comes"
            if num_going
            else ""
        )
        return Action(
            ActionKind.WAIT,
            f"waiting for instances: {len(up)} of {wanted} up{noticed}",
        )
    if view.committed + 1 >= config.num_steps:  # Rule 2
        workers_done = all(
            members[i].done
            for i, slot in plan.slots.items()
            if slot is not None and i in membership.alive(view, config)
        )
        if (
            view.last_step_recorded and workers_done
        ) or view.finish_age_s > config.heartbeat_timeout_s:
            return Action(ActionKind.FINISH, "finished")
        return Action(ActionKind.NONE, "finishing")
    suspects = membership.suspects(view, config)  # Rule 3
    working = {i for i, s in plan.slots.items() if s is not None}
    going = {i for i, m in members.items() if m.going(margin)} - set(plan.noticed)
    lost = working & (suspects | going)
    stranded = bool(suspects) and not view.all_arrived
    unannounced = bool(lost - going or view.failures or view.fenced or stranded)
    jit = checkpoint_before_end(  # Rule 9
        view,
        config,
        suspects,
        unannounced,
        lambda reason, out, lost_slots, event: _replan(
            view, config, choose, reason, out, lost_slots, event
        ),
    )
    if jit is not None:
        return jit
    if lost and lost <= going and not (view.failures or view.fenced or stranded):
        if any(
            members[i].notice_age_s - members[i].moves_after_s(margin) < config.notice_settle_s
            for i in going & working
        ):
            return Action(ActionKind.WAIT, f"gathering notices ({len(going)} so far)")
    # After a failure report, wait until every member is accounted for (reported, or silent:
    # gone) so that one plan leaves out everything lost at once.
    accounted = all(
        i in view.failures or members[i].reported >= plan.generation
        for i in plan.slots
        if i in members and i not in suspects
    )
    if view.failures and not (accounted or view.failure_age_s > config.failure_wait_s):
        return Action(
            ActionKind.WAIT,
            f"plan {plan.generation} failed "
            f"({_short(next(iter(view.failures.values())).reason)}); "
            "finding the lost peers",
        )
    if lost or stranded or view.fenced or view.failures:
        lost_slots = tuple(sorted(slot for i in lost if (slot := plan.slots[i]) is not None))
        reason = "loss" if lost else "failure" if view.failures else "recovery"
        return _replan(view, config, choose, reason, suspects, lost_slots, "preemption")
    if not view.all_arrived:
        return Action(
            ActionKind.WAIT,
            f"plan {plan.generation}: waiting for "
            f"{sum(not members[i].arrived for i in plan.slots if i in members)} "
            "instances to arrive",
        )
    if plan.noticed and any(
        i not in working and not m.going(margin) for i, m in membership.alive(view, config).items()
    ):  # Rule 6
        return _replan(view, config, choose, "arrival", frozenset(), (), "interval")
    if (view.interval_due or view.arrival) and not moving(plan, view.committed):  # Rule 7
        return _rule_7(view, config, choose)
    return Action(ActionKind.NONE, f"training {plan.data_parallel}x{plan.pipeline_stages}")


def _rule_7(view: CoordinatorView, config: CoordinatorConfig, choose: Choose | None) -> Action:
    """Rule 7: at an interval or an arrival, the policy's configuration for the instances up,
    replanned to where it differs from the one running."""
    plan = view.plan
    assert plan is not None
    margin = notice_margin_s(view, config)
    available = sum(not m.going(margin) for m in membership.alive(view, config).values())
    reason = "interval" if view.interval_due else "arrival"
    skeleton = _replan(view, config, None, reason, frozenset(), (), "interval")
    running = Configuration(plan.data_parallel, plan.pipeline_stages)
    pending = dataclasses.replace(
        skeleton, wanted=Wanted(available, "interval", (), unless_running=running)
    )
    if choose is None:
        return pending
    return complete(pending, choose(available, "interval", ()), view, config)
