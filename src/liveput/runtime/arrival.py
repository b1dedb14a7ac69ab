"""The wait of a generation's instances for one another before their process groups meet."""

from __future__ import annotations

import time

from liveput.errors import LiveputError
from liveput.runtime import keys, protocol
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.store import Store

__all__ = ["ARRIVAL_CHECK_S", "await_peers"]

ARRIVAL_CHECK_S = 0.5
"""How often a wait for the plan's other instances checks for a newer plan, seconds."""


def await_peers(store: Store, plan: RuntimePlan, instance: int, timeout_s: float) -> None:
    """Count ``instance`` in at ``plan``, then wait until every instance of the plan has arrived,
    at most ``timeout_s`` seconds (the communication timeout).

    A plan may name an instance that died after the coordinator made it. gloo's rendezvous
    would then block, in C++, for the whole communication timeout; this wait gives up as soon as
    a newer plan is in force, so such a plan costs about one heartbeat timeout instead."""
    if protocol.arrive(store, plan, instance):
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            store.wait_for(keys.all_arrived(plan.generation), ARRIVAL_CHECK_S)
            return
        except LiveputError:
            pass  # not everyone yet (or the store is restarting): is this plan still in force?
        try:
            newer = protocol.superseded(store, plan.generation)
        except LiveputError:
            newer = False
        if newer:
            raise LiveputError(
                f"plan {plan.generation} was superseded before all "
                f"{len(plan.world)} instances arrived"
            )
        if time.monotonic() > deadline:
            raise LiveputError(
                f"not all {len(plan.world)} instances of plan "
                f"{plan.generation} arrived in {timeout_s:g} s"
            )
