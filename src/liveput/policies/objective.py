"""The job objective: finish a fixed amount of work by a deadline, at the least cost.

The work is either ``steps`` (iterations of the model's global batch) or ``target_samples``; the
deadline is a hard constraint, a budget (total or per hour) an optional cap on what is spent, and
``on_demand_max`` the most on-demand instances the job may hold at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from liveput.errors import LiveputError


@dataclass(frozen=True)
class JobObjective:
    """What a deadline job must do, by when, and what it may spend."""

    deadline_hours: float
    """Hours from the job's start by which the work must be done."""
    steps: int | None = None
    """Training iterations to run (each of the model's global batch); or ``target_samples``."""
    target_samples: float | None = None
    """Samples to train (``steps * global batch``); or ``steps``."""
    budget_usd: float | None = None
    """Most dollars the whole job may cost (None: no cap)."""
    budget_usd_per_hour: float | None = None
    """Most dollars per hour the instances held at once may cost (None: no cap)."""
    on_demand_max: int | None = None
    """Most on-demand instances held at once (None: the trace's peak count)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_hours) and self.deadline_hours > 0):
            raise LiveputError(
                f"deadline must be a positive number of hours, got {self.deadline_hours}"
            )
        if (self.steps is None) == (self.target_samples is None):
            raise LiveputError(
                "a deadline job needs its work: give steps or target samples (one of them)"
            )
        if self.steps is not None and self.steps < 1:
            raise LiveputError(f"steps must be >= 1, got {self.steps}")
        if self.target_samples is not None and not (
            math.isfinite(self.target_samples) and self.target_samples > 0
        ):
            raise LiveputError(f"target samples must be positive, got {self.target_samples}")
        for name in ("budget_usd", "budget_usd_per_hour"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise LiveputError(f"{name.replace('_', ' ')} must be positive, got {value}")
        if self.budget_usd is not None and self.budget_usd_per_hour is not None:
            raise LiveputError("give a total budget or a budget per hour, not both")
        if self.on_demand_max is not None and self.on_demand_max < 0:
            raise LiveputError(f"on-demand maximum must be >= 0, got {self.on_demand_max}")

    @property
    def deadline_s(self) -> float:
        return self.deadline_hours * 3600.0

    def samples(self, global_batch_size: int) -> float:
        """The work in samples (``steps * global_batch_size`` when given in steps)."""
        if self.target_samples is not None:
            return float(self.target_samples)
        assert self.steps is not None  # __post_init__ requires target_samples or steps
        return float(self.steps) * global_batch_size

    def check_budget(self, cheapest_usd_per_hour: float) -> None:
        """Refuse a budget that cannot pay for one instance (one hour of it for a total)."""
        per_hour = self.budget_usd_per_hour
        if per_hour is not None and per_hour < cheapest_usd_per_hour:
            raise LiveputError(
                f"budget ${self.budget_usd_per_hour:g}/h is below the cheapest instance "
                f"(${cheapest_usd_per_hour:g}/h)"
            )
        if self.budget_usd is not None and self.budget_usd < cheapest_usd_per_hour:
            raise LiveputError(
                f"budget ${self.budget_usd:g} is below one hour of the cheapest instance "
                f"(${cheapest_usd_per_hour:g})"
            )
