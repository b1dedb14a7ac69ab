"""What every advisor returns: ranked plans of instance counts per type and market."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from liveput.catalog import Market
from liveput.errors import LiveputError


@dataclass(frozen=True)
class InstanceCount:
    """``count`` instances of one type in one market."""

    type: str
    """Instance type name."""
    count: int
    """How many."""
    market: Market
    """Spot or on-demand."""
    role: str = "worker"
    """``worker`` (trains), ``anchor`` (on-demand worker keeping checkpoints), ``checkpoint``
    (CPU node keeping checkpoints in memory) or ``ps`` (parameter server)."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise LiveputError(f"plan: {self.type} count must be >= 1, got {self.count}")


@dataclass(frozen=True)
class Plan:
    """One provisioning plan and how it scores."""

    architecture: str
    """``single-anchor``, ``tiering``, ``mixed``, ``parameter-server`` or ``pool``."""
    instances: tuple[InstanceCount, ...]
    """What to rent."""
    usd_per_hour: float
    """Price of the whole plan per hour."""
    objective: str
    """Name of the objective the advisor optimizes (e.g. ``effective_flops``, ``cost_usd``)."""
    value: float
    """The objective's value for this plan."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Other figures of the plan (expected hours, cost, speedup, ...), named with units."""

    @property
    def num_instances(self) -> int:
        return sum(item.count for item in self.instances)

    def describe(self) -> str:
        """``17 x g4dn.xlarge spot + 1 x t3.xlarge ondemand``."""
        return " + ".join(
            f"{item.count} x {item.type} {item.market.catalog_name}" for item in self.instances
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "instances": [
                {
                    "type": item.type,
                    "count": item.count,
                    "market": item.market.catalog_name,
                    "role": item.role,
                }
                for item in self.instances
            ],
            "usd_per_hour": round(self.usd_per_hour, 6),
            "objective": self.objective,
            "value": self.value,
            **self.metrics,
        }


@dataclass(frozen=True)
class Advice:
    """Plans best first, and why the first wins."""

    plans: tuple[Plan, ...]
    """Best first."""
    reason: str
    """Why the first plan wins, in one sentence."""
    inputs: dict[str, Any] = field(default_factory=dict)
    """The request, echoed for scripts."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "reason": self.reason,
            "plans": [plan.to_dict() for plan in self.plans],
        }
