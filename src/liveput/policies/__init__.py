"""Policies: observation in, decision out, registered by name in :data:`POLICIES`.

Built in: ``liveput``, ``liveput-oracle``, ``reactive``, ``bamboo``, ``checkpoint``,
``on-demand`` and ``ideal`` (each module documents its model). Build one with
``make_policy(name, context)`` (or ``POLICIES.get(name)(context)``).
"""

# Registration of the built-in policies (after the names above: they import them).
from liveput.policies import (  # noqa: E402,F401,I001
    bamboo,
    checkpoint,
    ideal,
    on_demand,
    proactive,
    reactive,
)
from liveput.policies.base import (
    POLICIES,
    Decision,
    Observation,
    Policy,
    PolicyContext,
    Provisioning,
    make_policy,
)

__all__ = [
    "POLICIES",
    "Decision",
    "Observation",
    "Policy",
    "PolicyContext",
    "Provisioning",
    "make_policy",
]
