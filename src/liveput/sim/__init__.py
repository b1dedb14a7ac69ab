"""The trace-driven simulator: replays an availability trace interval by interval and asks a
policy, through the same observation -> decision seam as the runtime, what to run.

One executor (:mod:`liveput.sim.engine`, the model of time, losses and costs) is handed an
objective (:mod:`liveput.sim.objective`): throughput, or a deadline job's work by its deadline
at the least cost (:mod:`liveput.sim.deadline`: spot and on-demand instances). Both report a
:class:`SimulationResult` of :class:`PolicyRun`.
"""

from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import simulate_deadline
from liveput.sim.engine import (
    DEFAULT_POLICIES,
    default_trace,
    simulate,
    simulate_policy,
)
from liveput.sim.result import PolicyRun, SimulationResult

__all__ = [
    "DEFAULT_POLICIES",
    "PolicyRun",
    "SimulationConfig",
    "SimulationResult",
    "default_trace",
    "simulate",
    "simulate_deadline",
    "simulate_policy",
]
