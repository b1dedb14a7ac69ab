"""Rule 9 of the coordinator (:mod:`liveput.runtime.decide`): a checkpoint just in time.

When every current holder of some layer has a notice and the instances that stay up past their
end run no configuration, the running plan is fenced a lead before that end and its instances
checkpoint the step they end at; the coordinator waits for that checkpoint, then replans without
the going instances. Where the staying instances run a configuration, the going holders hand
their layers over instead (Rules 3-4). The lead is aimed from measured steps and writes.
"""

from __future__ import annotations

from collections.abc import Callable

from liveput.runtime import membership
from liveput.runtime.coordinator_config import CoordinatorConfig
from liveput.runtime.coordinator_view import Action, ActionKind, CoordinatorView, Member
from liveput.runtime.notice_margin import notice_margin_s

Replan = Callable[[str, frozenset[int], tuple[tuple[int, int], ...], str], Action]
"""``replan(reason, suspects, lost_slots, event)``: the coordinator's replan (decide's)."""


def noticed_holders_end_s(view: CoordinatorView, config: CoordinatorConfig) -> float | None:
    """Rule 9: seconds left before the earliest end announced to the current holders of a layer
    that only instances with a notice hold (None: no such layer, or none of its holders' notices
    announces an end)."""
    plan = view.plan
    assert plan is not None
    point = (plan.epoch, view.committed)
    holders: dict[int, list[Member]] = {}
    for member in membership.alive(view, config).values():
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


def movable(view: CoordinatorView, config: CoordinatorConfig, end_s: float) -> bool:
    """Rule 9 does not apply: enough instances stay up past the noticed holders' end (no
    notice, or one that ends a margin after it) to run a configuration, so the going holders
    hand their layers over (Rules 3-4) instead of a checkpoint every stage writes and reads
    back (the pipeline regime's noticed losses stopped the job for 65-79 s that way)."""
    margin = notice_margin_s(view, config)
    staying = [
        m
        for m in membership.alive(view, config).values()
        if not m.going(margin) and ((ends := m.end_in_s()) is None or ends > end_s + margin)
    ]
    return len(staying) >= view.fewest_instances


def checkpoint_lead_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """Rule 9's lead, wall seconds: ``jit_checkpoint_safety`` x (a step + a checkpoint
    write), at least ``jit_checkpoint_min_lead_s``, both measured (the view's), at most
    the cap (:func:`lead_cap_s`); while the write is unknown, ``jit_checkpoint_lead_s`` (at
    most the cap), and while only the step is, at least that and
    ``jit_checkpoint_safety`` writes (at most the cap). A write measured slower
    than that lead (a stage's state over a slow link to an object store) gets the lead it
    needs: capped at the unmeasured one, the
    checkpoint was still being written when the instances went, and the restore after them went
    back to the checkpoint before."""
    if view.checkpoint_write_s is None:
        return unmeasured_lead_s(view, config)
    if view.step_s is None:
        # A write known (measured or estimated) before any step of the plan is: the write alone
        # may need more than the unmeasured lead (a plan's first steps on slow storage).
        write_lead_s = config.jit_checkpoint_safety * view.checkpoint_write_s
        return min(lead_cap_s(view, config), max(unmeasured_lead_s(view, config), write_lead_s))
    measured_s = config.jit_checkpoint_safety * (view.step_s + view.checkpoint_write_s)
    return min(lead_cap_s(view, config), max(config.jit_checkpoint_min_lead_s, measured_s))


def lead_cap_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """The most Rule 9's lead may be: a fixed ``notice_margin_s``, the user's word; none with
    ``auto``, whose margin is twice a move's (a second or two): the checkpoint is the move
    chosen here, and its lead is aimed from its own measurements (capped at a 2-s auto margin
    beside a 5.6-s write, the instances went before their checkpoint was written: 40 steps
    redone)."""
    if config.notice_margin_s is None:
        return float("inf")
    return notice_margin_s(view, config)


def unmeasured_lead_s(view: CoordinatorView, config: CoordinatorConfig) -> float:
    """Rule 9's lead before anything is measured: ``jit_checkpoint_lead_s``, at most the cap."""
    return min(config.jit_checkpoint_lead_s, lead_cap_s(view, config))


def checkpoint_before_end(
    view: CoordinatorView,
    config: CoordinatorConfig,
    suspects: frozenset[int],
    unannounced: bool,
    replan: Replan,
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
        return replan("checkpoint", suspects, lost_slots, "preemption")
    if saved or unannounced or not view.all_arrived or view.committed < plan.start_step:
        return None
    end_s = noticed_holders_end_s(view, config)
    if end_s is None or end_s > checkpoint_lead_s(view, config) or movable(view, config, end_s):
        return None
    return Action(
        ActionKind.CHECKPOINT,
        f"checkpointing step {view.committed} or the next: every holder of a layer goes "
        f"in {max(0.0, end_s):.1f} s (lead {lead_why(view, config)})",
        "notice",
        checkpoint_before_s=max(0.0, end_s),
    )


def lead_why(view: CoordinatorView, config: CoordinatorConfig) -> str:
    """Rule 9's lead and what it was made of, for the status."""
    lead_s = checkpoint_lead_s(view, config)
    if view.checkpoint_write_s is None:
        return f"{lead_s:.1f} s, before a write is known"
    if view.step_s is None:
        return f"{lead_s:.1f} s: write {view.checkpoint_write_s:.2f} s, no step measured yet"
    return f"{lead_s:.1f} s: step {view.step_s:.2f} s, write {view.checkpoint_write_s:.2f} s"
