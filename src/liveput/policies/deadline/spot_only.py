"""``spot-only``: every spot instance the market gives, never an on-demand one (may miss).

Model: holds all the spot instances available (idle spares released) and runs the best (D, P)
on them; never rents on-demand capacity, so it pays only spot prices and finishes whenever the
market lets it: the deadline is not looked at. The cheapest way to train, and the floor on cost
the others pay a premium over to be on time."""

from __future__ import annotations

from liveput.policies.base import Observation, Provisioning
from liveput.policies.deadline.base import DEADLINE_POLICIES, DeadlinePolicy


@DEADLINE_POLICIES.register("spot-only")
class SpotOnlyPolicy(DeadlinePolicy):
    """Spot instances only, whatever the deadline."""

    name = "spot-only"

    def provision(self, observation: Observation) -> Provisioning:
        return Provisioning(spot=observation.num_available, on_demand=0)
