"""The coordinator: the live control loop, one per job, in rooms.

- :mod:`.observe`: the store read into a :class:`~liveput.runtime.decide.CoordinatorView`;
- :mod:`.policy`: the pure step, what it sees in, one answer out (the rules of
  :mod:`liveput.runtime.decide`, the policy asked, the configuration, provisioning and restart);
- :mod:`.objective`: what the policy plans for, the strategy the loop is handed (throughput by
  default, or a deadline);
- :mod:`.publish`: what the coordinator writes (fences, plans, restore records, events);
- :mod:`.upkeep`: the table re-fitted, the store pruned, stalls explained;
- :mod:`.loop`: :class:`Coordinator`, which observes, steps and carries out the answer.
"""

from liveput.runtime.coordinator.loop import Coordinator
from liveput.runtime.coordinator.objective import (
    CoordinatorObjective,
    DeadlineObjective,
    MarketView,
    ThroughputObjective,
)
from liveput.runtime.decide import CoordinatorConfig

__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "DeadlineObjective",
    "MarketView",
    "CoordinatorObjective",
    "ThroughputObjective",
]
