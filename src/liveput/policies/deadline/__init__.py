"""Deadline policies: finish the work by the deadline at the least cost (see ``base``).

Built in, registered in :data:`DEADLINE_POLICIES` by the names the simulator reports:
``liveput``, ``uniform-progress``, ``greedy``, ``on-demand``, ``spot-only`` and ``omniscient``
(each module documents its model and source).
"""

# Registration of the built-in deadline policies (after the names above: they import them).
from liveput.policies.deadline import (  # noqa: E402,F401,I001
    greedy,
    liveput,
    omniscient,
    on_demand,
    spot_only,
    uniform_progress,
)
from liveput.policies.deadline.base import (
    DEADLINE_POLICIES,
    DeadlineContext,
    DeadlinePolicy,
    make_deadline_policy,
)

DEADLINE_POLICY_NAMES = (
    "liveput",
    "uniform-progress",
    "greedy",
    "on-demand",
    "spot-only",
    "omniscient",
)
"""The deadline policies the simulator compares by default, in its table's order."""

__all__ = [
    "DEADLINE_POLICIES",
    "DEADLINE_POLICY_NAMES",
    "DeadlineContext",
    "DeadlinePolicy",
    "make_deadline_policy",
]
