"""Settings of a simulation run (one dataclass, validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.plan.optimizer import OBJECTIVES


@dataclass(frozen=True)
class SimulationConfig:
    """How a trace is replayed and priced."""

    interval_s: float = 60.0
    """Length of a decision interval, seconds (the trace must be resampled at it)."""
    horizon: int = 12
    """Intervals looked ahead by forecasting policies (H)."""
    objective: str = "throughput"
    """What liveput optimizes: ``throughput`` (samples) or ``cost`` (samples per dollar)."""
    spot_price_usd_per_hour: float | None = None
    """Spot price per instance-hour; None: the trace's price, else the profile's instance type."""
    on_demand_price_usd_per_hour: float | None = None
    """On-demand price per instance-hour; None: the profile's instance type."""
    num_on_demand: int = 0
    """On-demand instances held all along, besides the trace's spot ones."""
    seed: int = 0
    """Seed of the within-interval randomness (when losses fall, which instances are lost)."""
    predictor: str = "auto"
    """Predictor of the ``liveput`` policy."""
    preemption_notice_s: float = 120.0
    """Warning before a preemption, seconds (AWS: 120; GCP: 30; 0: none): ``liveput`` moves a
    wholly lost stage's state off the leaving instances when the transfer fits in it. (``reactive``
    always saves its checkpoint in the notice: at most 33 s for the built-in models.)"""
    buddy_copies: bool = True
    """The job keeps buddy copies of every stage in another instance's memory (the runtime's
    default): a stage lost beyond what the notice saves comes back over a link, not from the
    checkpoint storage (:mod:`liveput.policies.recovery`)."""
    checkpoint_every_s: float = 0.0
    """Training seconds between the job's periodic checkpoints: a recovery from one (or from
    a buddy copy) redoes half of it on average (0: nothing redone is counted)."""
    launch_delay_min_s: float = 60.0
    """Shortest launch of an on-demand instance, seconds (deadline jobs; CM-DARE measured 70 to
    92 s)."""
    launch_delay_max_s: float = 90.0
    """Longest launch of an on-demand instance, seconds (each request draws uniformly between
    the two, from the seed: every policy meets the same delays)."""

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise LiveputError(f"simulation interval must be positive, got {self.interval_s}")
        if self.horizon < 1:
            raise LiveputError(f"simulation horizon must be >= 1, got {self.horizon}")
        if self.objective not in OBJECTIVES:
            raise LiveputError(
                f"unknown objective {self.objective!r}; known: {', '.join(OBJECTIVES)}"
            )
        for name in ("spot_price_usd_per_hour", "on_demand_price_usd_per_hour"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise LiveputError(f"simulation {name} must be >= 0, got {value}")
        if not self.preemption_notice_s >= 0:
            raise LiveputError(f"preemption notice must be >= 0 s, got {self.preemption_notice_s}")
        if not 0 <= self.launch_delay_min_s <= self.launch_delay_max_s:
            raise LiveputError(
                f"launch delays must satisfy 0 <= min <= max, got {self.launch_delay_min_s} and "
                f"{self.launch_delay_max_s} s"
            )
        if not self.checkpoint_every_s >= 0:
            raise LiveputError(f"checkpoint interval must be >= 0 s, got {self.checkpoint_every_s}")
        if self.num_on_demand < 0:
            raise LiveputError(f"on-demand instances must be >= 0, got {self.num_on_demand}")
