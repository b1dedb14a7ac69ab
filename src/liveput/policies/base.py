"""The seam between deciding and acting: observation in, decision out.

A policy is pure: it reads an :class:`Observation` (built by an executor: the simulator or the
real runtime's coordinator) and returns a :class:`Decision`. Executors never branch on which policy
they run; every policy-specific effect (a restart to pay, a rollback, a throughput overhead) is
expressed in the decision's fields. Policies are registered by name in :data:`POLICIES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from liveput.errors import LiveputError
from liveput.registry import Registry
from liveput.traces.trace import IntervalTrace


@dataclass(frozen=True)
class Configuration:
    """D data-parallel pipelines of P stages."""

    data_parallel: int
    """D: number of pipelines (data-parallel replicas)."""
    pipeline_stages: int
    """P: stages per pipeline."""

    def __post_init__(self) -> None:
        if self.data_parallel < 1 or self.pipeline_stages < 1:
            raise LiveputError(
                f"configuration {self.data_parallel}x{self.pipeline_stages}: D and P must be >= 1"
            )

    @property
    def num_instances(self) -> int:
        return self.data_parallel * self.pipeline_stages

    def __str__(self) -> str:
        return f"{self.data_parallel}x{self.pipeline_stages}"

    @classmethod
    def parse(cls, text: str) -> Configuration:
        """Parse ``DxP`` (e.g. ``4x8``)."""
        try:
            d, p = text.lower().split("x")
            return cls(int(d), int(p))
        except ValueError:
            raise LiveputError(f"configuration {text!r} is not of the form DxP (e.g. 4x8)") from None


@dataclass(frozen=True)
class Observation:
    """What a policy sees at the start of an interval."""

    time_s: float
    """Time now, seconds since the job started (from the executor's clock)."""
    interval_index: int
    """Index of the interval that starts now."""
    interval_s: float
    """Length of an interval, seconds."""
    history: IntervalTrace
    """Availability seen so far, intervals ``0..interval_index`` (see ``forecast.base``)."""
    num_available: int
    """Spot instances available now."""
    current: Configuration | None
    """The configuration running now (None before the first decision or after a total loss)."""
    num_on_demand: int = 0
    """On-demand instances held (never preempted), in addition to the spot ones."""
    future: IntervalTrace | None = None
    """The true future, from ``interval_index + 1`` on; only an executor that knows it (the
    simulator) fills it, and only oracle policies read it."""
    capacity: int = 0
    """Instances requested from the cloud (an upper bound of the available count)."""
    steps_since_checkpoint_s: float = 0.0
    """Training seconds since the last checkpoint (for checkpoint-based policies)."""


@dataclass(frozen=True)
class Decision:
    """What to run in the interval that starts now, and what it costs to get there."""

    configuration: Configuration | None
    """The configuration to run (None: run nothing this interval)."""
    migration: str = "none"
    """Kind of migration to reach it: ``none``, ``intra-stage``, ``inter-stage``, ``pipeline``,
    ``checkpoint-restore`` or ``restart``."""
    downtime_s: float = 0.0
    """Training time lost to reach the configuration (migration, restart), seconds."""
    rollback_s: float = 0.0
    """Training time already done that is lost and must be redone (checkpoint rollback)."""
    throughput_factor: float = 1.0
    """Fraction of the configuration's throughput actually delivered (e.g. redundancy overhead)."""
    expected_samples: float = 0.0
    """The policy's own estimate of the samples this interval (for reports)."""
    release: int = 0
    """Spare instances to give back to the cloud (saves their price)."""
    notes: dict[str, float] = field(default_factory=dict)
    """Extra figures for reports and debugging."""


class Policy(ABC):
    """Decides a configuration every interval."""

    name: str = ""

    @abstractmethod
    def decide(self, observation: Observation) -> Decision:
        """Return the decision for the interval that starts at ``observation.time_s``."""


POLICIES: Registry[type[Policy]] = Registry("policy")
