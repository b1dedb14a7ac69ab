"""``ideal``: the upper bound. At every interval and right after every loss it runs the best
configuration for the instances there are (spot and on-demand), and nothing it does costs time:
no migration, restart or checkpoint (Parcae's "ideal" baseline). No system reaches it; other
policies are reported as a fraction of its samples."""

from __future__ import annotations

from liveput.perf.configuration import MigrationKind
from liveput.policies.base import POLICIES, Decision, Observation
from liveput.policies.common import LookupPolicy


@POLICIES.register("ideal")
class IdealPolicy(LookupPolicy):
    """Best configuration for every count with free moves: the upper bound."""

    name = "ideal"

    def decide(self, observation: Observation) -> Decision:
        best = self.lookup.best_for(observation.num_available + observation.num_on_demand)
        migration = MigrationKind.NONE if best == observation.current else MigrationKind.FREE
        return Decision(
            best,
            migration=migration,
            expected_samples=self.lookup.throughput(best) * observation.remaining_s,
        )
