"""Who may take part in the coordinator's next plan: the alive, the suspects, the last holders.

Pure functions of the coordinator's view (:mod:`liveput.runtime.decide`'s notation: *dead*,
*silent*, *suspect*, *last holder*), used by its rules.
"""

from __future__ import annotations

from liveput.runtime.coordinator_config import CoordinatorConfig
from liveput.runtime.coordinator_view import CoordinatorView, Member


def suspects(view: CoordinatorView, config: CoordinatorConfig) -> frozenset[int]:
    plan = view.plan
    assert plan is not None
    members = view.members
    kept = last_holders(view, config)
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


def alive(
    view: CoordinatorView, config: CoordinatorConfig, suspects: frozenset[int] = frozenset()
) -> dict[int, Member]:
    """Members that may take part in a plan. A silent instance takes no part, member of the plan
    or not, but a last holder (Rule 8): a dead one left out of the last plan would otherwise be
    back in the next until its heartbeat times out."""
    kept = last_holders(view, config)
    return {
        i: m
        for i, m in view.members.items()
        if not m.left
        and (m.heartbeat_age_s <= config.suspect_after_s or i in kept)
        and i not in suspects
    }


def last_holders(view: CoordinatorView, config: CoordinatorConfig) -> frozenset[int]:
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
