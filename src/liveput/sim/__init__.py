"""The trace-driven simulator: replays an availability trace interval by interval and asks a
policy, through the same observation -> decision seam as the runtime, what to run.

See :mod:`liveput.sim.engine` for the model of time, losses and costs, and
:mod:`liveput.sim.deadline` for deadline jobs (spot and on-demand, finish by a deadline).
"""

from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import simulate_deadline
from liveput.sim.deadline_result import DeadlineResult, DeadlineRun
from liveput.sim.engine import DEFAULT_POLICIES, default_trace, simulate, simulate_policy
from liveput.sim.result import PolicyRun, SimulationResult

__all__ = [
    "DEFAULT_POLICIES",
    "DeadlineResult",
    "DeadlineRun",
    "PolicyRun",
    "SimulationConfig",
    "SimulationResult",
    "default_trace",
    "simulate",
    "simulate_deadline",
    "simulate_policy",
]
