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
   end (:func:`checkpoint_lead_s`: a few measured steps and checkpoint writes, at most
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

from liveput.perf.configuration import Configuration
from liveput.runtime.coordinator_config import CoordinatorConfig
from liveput.runtime.coordinator_view import (
    Action,
    ActionKind,
    Choose,
    CoordinatorView,
    Member,
    moves_after_s,
)
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
    "decide",
    "margin_in_force",
    "moves_after_s",
    "notice_margin_s",
]


def _suspects(view: CoordinatorView, config: CoordinatorConfig) -> frozenset[int]:
    plan = view.plan
    assert plan is not None
    members = view.members
    kept = _last_holders(view, config)
    suspects = set()
    named = {peer for report in view.failures.values() for peer in report.peers}
    for instance in plan.slots:
        member = members.get(instance)
        silent = member is not None and member.heartbeat_age_s > config.suspect_after_s
        if (
            member is None
            or member.left
            or member.heartbeat_age_s > config.heartbeat_timeout_s
            or (silent and member.past_announced_end())
        ):
            suspects.add(instance)
            continue
        unreported = instance not in view.failures and member.reported < plan.generation
        if instance in named and unreported:
            suspects.add(instance)  # a peer saw its connection close: it is gone or cut off
        elif instance in kept:
            continue  # Rule 8: silence or a late report is not enough to lose its layers
        elif (
            view.failures and unreported and (silent or view.failure_age_s > config.failure_wait_s)
        ):
            suspects.add(instance)
        elif (
            not view.all_arrived
            and not member.arrived
            and (silent or view.plan_age_s > config.arrival_timeout_s)
        ):
            suspects.add(instance)
    return frozenset(suspects)


def _replan(
    view: CoordinatorView,
    config: CoordinatorConfig,
    choose: Choose,
    reason: str,
    suspects: frozenset[int],
    lost_slots: tuple[tuple[int, int], ...],
    event: str,
    target: Configuration | None = None,
) -> Action:
    plan = view.plan
    epoch = plan.epoch if plan is not None else 0
    alive = _alive(view, config, suspects)
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
    target = target or choose(len(workers), event, lost_slots)
    if target is None:
        return Action(
            ActionKind.WAIT,
            f"waiting for instances: no configuration runs on {len(workers)}",
            suspects=suspects,
        )
    restore = view.failed_in_row >= config.restore_after_failures
    status = (
        f"restoring from {_checkpoint_name(view)} to {target}"
        if restore
        else f"migrating to {target}"
    )
    if noticed_workers:
        status += (
            f" on {len(noticed_workers)} instance(s) with a preemption notice (no other is up)"
        )
    return Action(
        ActionKind.REPLAN,
        status,
        reason,
        target,
        workers,
        senders,
        holdings,
        restore,
        suspects,
        lost_slots,
        noticed_workers,
        notice_margin_s=margin,
    )


def _short(reason: str) -> str:
    """An error without gloo's source path and advice."""
    reason = reason.split("] ", 1)[-1] if reason.startswith("[") else reason
    return reason.split(". ", 1)[0][:120]


def _alive(
    view: CoordinatorView, config: CoordinatorConfig, suspects: frozenset[int] = frozenset()
) -> dict[int, Member]:
    """Members that may take part in a plan. A silent instance takes no part, member of the plan
    or not, but a last holder (Rule 8): a dead one left out of the last plan would otherwise be
    back in the next until its heartbeat times out."""
    kept = _last_holders(view, config)
    return {
        i: m
        for i, m in view.members.items()
        if not m.left
        and (m.heartbeat_age_s <= config.suspect_after_s or i in kept)
        and i not in suspects
    }


def _last_holders(view: CoordinatorView, config: CoordinatorConfig) -> frozenset[int]:
    """Rule 8: silent members, not dead, holding a current layer that no member heard holds."""
    if view.plan is None:
        return frozenset()
    point = (view.plan.epoch, view.committed)
    current = {
        i: m
        for i, m in view.members.items()
        if not m.left and m.layers and (m.held_epoch, m.held_step) == point
    }
    heard = {
        layer
        for m in current.values()
        if m.heartbeat_age_s <= config.suspect_after_s
        for layer in m.layers
    }
    return frozenset(
        i
        for i, m in current.items()
        if config.suspect_after_s < m.heartbeat_age_s <= config.heartbeat_timeout_s
        and not m.past_announced_end()
        and not set(m.layers) <= heard
    )


def _noticed_holders_end_s(view: CoordinatorView, config: CoordinatorConfig) -> float | None:
    """Rule 9: seconds left before the earliest end announced to the current holders of a layer
    that only instances with a notice hold (None: no such layer, or none of its holders' notices
    announces an end)."""
    plan = view.plan
    assert plan is not None
    point = (plan.epoch, view.committed)
    holders: dict[int, list[Member]] = {}
    for member in _alive(view, config).values():
        if (member.held_epoch, member.held_step) == point:
            for layer in member.layers:
                holders.setdefault(layer, []).append(member)
    ends = [
        end_s
        for members in holders.values()
        if all(m.noticed for m in members)
        for m in members
        if (end_s := m.end_in_s()) is not None
    ]
    return min(ends, default=None)


def _movable(view: CoordinatorView, config: CoordinatorConfig, end_s: float) -> bool:
    """Rule 9 does not apply: enough instances stay up past the noticed holders' end (no
    notice, or one that ends a margin after it) to run a configuration, so the going holders
    hand their layers over (Rules 3-4) instead of a checkpoint every stage writes and reads
    back (the pipeline regime's noticed losses stopped the job for 65-79 s that way)."""
    margin = notice_margin_s(view, config)
    staying = [
        m
        for m in _alive(view, config).values()
        if not m.going(margin) and ((ends := m.end_in_s()) is None or ends > end_s + margin)
    ]
    return len(staying) >= view.fewest_instances


def checkpoint_lead_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """Rule 9's lead, wall seconds: ``jit_checkpoint_safety`` x (a step + a checkpoint
    write), at least ``jit_checkpoint_min_lead_s``, both measured (the view's), at most
    ``notice_margin_s``; while the write is unknown, ``jit_checkpoint_lead_s`` (at most
    ``notice_margin_s``), and while only the step is, at least that and
    ``jit_checkpoint_safety`` writes (at most ``notice_margin_s``). A write measured slower
    than that lead (a stage's state over a slow link to an object store) gets the lead it
    needs: capped at the unmeasured one, the
    checkpoint was still being written when the instances went, and the restore after them went
    back to the checkpoint before."""
    if view.checkpoint_write_s is None:
        return _unmeasured_lead_s(view, config)
    if view.step_s is None:
        # A write known (measured or estimated) before any step of the plan is: the write alone
        # may need more than the unmeasured lead (a plan's first steps on slow storage).
        write_lead_s = config.jit_checkpoint_safety * view.checkpoint_write_s
        return min(
            notice_margin_s(view, config), max(_unmeasured_lead_s(view, config), write_lead_s)
        )
    measured_s = config.jit_checkpoint_safety * (view.step_s + view.checkpoint_write_s)
    return min(notice_margin_s(view, config), max(config.jit_checkpoint_min_lead_s, measured_s))


def _unmeasured_lead_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """Rule 9's lead before anything is measured: ``jit_checkpoint_lead_s``, at most
    ``notice_margin_s``."""
    return min(config.jit_checkpoint_lead_s, notice_margin_s(view, config))


def _checkpoint_before_end(
    view: CoordinatorView,
    config: CoordinatorConfig,
    choose: Choose,
    suspects: frozenset[int],
    unannounced: bool,
) -> Action | None:
    """Rule 9 (module docstring): the checkpoint asked for, waited for, then the replan without
    the going instances; None when the rule does not apply. ``unannounced``: the plan is
    failing, or a working instance was lost without a notice (the other rules' business)."""
    plan = view.plan
    assert plan is not None
    saved = view.latest_checkpoint is not None and view.latest_checkpoint >= view.committed
    if view.checkpoint_requested:
        # Failure reports may follow the fence (a rank aborted in a collective): no reason to
        # stop waiting. A silent writer (one that wrote leaves, and says so) is: it died.
        silent = any(
            (m := view.members.get(i)) is None
            or (not m.left and m.heartbeat_age_s > config.suspect_after_s)
            for i, slot in plan.slots.items()
            if slot is not None
        )
        if not (saved or silent) and view.checkpoint_request_age_s < checkpoint_lead_s(
            view, config
        ):
            return Action(
                ActionKind.WAIT,
                f"checkpointing step {view.committed} before the end the notices announce",
            )
        lost_slots = tuple(
            sorted(
                slot
                for i, slot in plan.slots.items()
                if slot is not None
                and (
                    i in suspects
                    or (member := view.members.get(i)) is None
                    or member.going(notice_margin_s(view, config))
                )
            )
        )
        return _replan(view, config, choose, "checkpoint", suspects, lost_slots, "preemption")
    if saved or unannounced or not view.all_arrived or view.committed < plan.start_step:
        return None
    end_s = _noticed_holders_end_s(view, config)
    if end_s is None or end_s > checkpoint_lead_s(view, config) or _movable(view, config, end_s):
        return None
    return Action(
        ActionKind.CHECKPOINT,
        f"checkpointing step {view.committed} or the next: every holder of a layer goes "
        f"in {max(0.0, end_s):.1f} s (lead {_lead_why(view, config)})",
        "notice",
        checkpoint_before_s=max(0.0, end_s),
    )


def _lead_why(view: CoordinatorView, config: CoordinatorConfig) -> str:
    """Rule 9's lead and what it was made of, for the status."""
    lead_s = checkpoint_lead_s(view, config)
    if view.checkpoint_write_s is None:
        return f"{lead_s:.1f} s, before a write is known"
    if view.step_s is None:
        return f"{lead_s:.1f} s: write {view.checkpoint_write_s:.2f} s, no step measured yet"
    return f"{lead_s:.1f} s: step {view.step_s:.2f} s, write {view.checkpoint_write_s:.2f} s"


def _checkpoint_name(view: CoordinatorView) -> str:
    step = view.latest_checkpoint
    return "the initial weights" if step is None else f"step {step}"


def decide(view: CoordinatorView, config: CoordinatorConfig, choose: Choose) -> Action:
    """The coordinator's next action (module docstring: the rules)."""
    plan = view.plan
    members = view.members
    margin = notice_margin_s(view, config)
    if plan is None:  # Rule 1
        alive = _alive(view, config)
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
            if slot is not None and i in _alive(view, config)
        )
        if (
            view.last_step_recorded and workers_done
        ) or view.finish_age_s > config.heartbeat_timeout_s:
            return Action(ActionKind.FINISH, "finished")
        return Action(ActionKind.NONE, "finishing")
    suspects = _suspects(view, config)  # Rule 3
    working = {i for i, s in plan.slots.items() if s is not None}
    going = {i for i, m in members.items() if m.going(margin)} - set(plan.noticed)
    lost = working & (suspects | going)
    stranded = bool(suspects) and not view.all_arrived
    unannounced = bool(lost - going or view.failures or view.fenced or stranded)
    jit = _checkpoint_before_end(view, config, choose, suspects, unannounced)  # Rule 9
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
        i not in working and not m.going(margin) for i, m in _alive(view, config).items()
    ):  # Rule 6
        return _replan(view, config, choose, "arrival", frozenset(), (), "interval")
    if (view.interval_due or view.arrival) and not moving(plan, view.committed):  # Rule 7
        available = sum(not m.going(margin) for m in _alive(view, config).values())
        target = choose(available, "interval", ())
        if target is not None and target != Configuration(plan.data_parallel, plan.pipeline_stages):
            reason = "interval" if view.interval_due else "arrival"
            return _replan(view, config, choose, reason, frozenset(), (), "interval", target)
    return Action(ActionKind.NONE, f"training {plan.data_parallel}x{plan.pipeline_stages}")
