"""Deciding: exact liveput, the MPC optimizer and the migration planner."""

from liveput.plan.costs import CostModel, migration_kind, migration_seconds
from liveput.plan.liveput import expected_throughput_after_losses
from liveput.plan.optimizer import Alternative, LiveputOptimizer, OptimizerConfig, PlanDecision

__all__ = [
    "Alternative",
    "CostModel",
    "LiveputOptimizer",
    "OptimizerConfig",
    "PlanDecision",
    "expected_throughput_after_losses",
    "migration_kind",
    "migration_seconds",
]
