"""The settings of the emulated provider (:mod:`liveput.cloud.emulated`): how its trace drives
spot instances, its catalog, zones, clock rate, notices and on-demand launch delays."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from liveput.cloud.loss_report import check_loss_signal_delay
from liveput.cloud.retry import RetryPolicy
from liveput.errors import LiveputError
from liveput.runtime.notices import AWS_NOTICE_LEAD_S

__all__ = ["DEFAULT_ZONES", "SpotModel", "EmulatedProviderConfig"]

DEFAULT_ZONES = ("emulated-1a",)


class SpotModel(str, Enum):
    """What the trace says about spot instances (see :mod:`liveput.cloud.emulated`)."""

    CAPACITY = "capacity"
    """The trace is the spot market's capacity: spot instances run as requested within it."""
    REPLAY = "replay"
    """The trace is one job's own spot instances: launched, noticed and killed as it says."""


@dataclass(frozen=True)
class EmulatedProviderConfig:
    """Settings of the emulated provider."""

    catalog: str = "aws"
    """Built-in catalog name or catalog file: instance types, prices, vCPU quotas."""
    instance_types: tuple[str, ...] = ()
    """Types it rents (default: every type of the catalog); a replay's spot instances are of
    the first."""
    zones: tuple[str, ...] = DEFAULT_ZONES
    """Zone names (one trace drives them all; instances are spread over the zones asked)."""
    time_scale: float = 1.0
    """Trace (cloud) seconds per clock second."""
    notice_lead_s: float = AWS_NOTICE_LEAD_S
    """Notice before a preemption, cloud seconds (AWS 120, GCP 30)."""
    on_demand_delay_s: tuple[float, float] = (60.0, 90.0)
    """On-demand launch delay, cloud seconds: uniform in [low, high] (CM-DARE: 70-92 s)."""
    seed: int = 0
    """Seeds launch delays and the choice of victims."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Backoff of retryable errors."""
    spot: SpotModel = SpotModel.CAPACITY
    """How the trace drives spot instances: as the market's capacity, or replayed as the job's."""
    loss_signal_delay_s: float | None = 0.0
    """Cloud (trace) seconds from an instance's end by the cloud's hand (a preemption, or a
    replayed instance whose agent exited) until the provider's list (:meth:`instances`) reports
    it terminated; until then it lists as running (:mod:`liveput.cloud.loss_report`). None: never
    reported, a system learns of the loss from its own heartbeats. 0: at once (the default). Its
    processes die at the end all the same; a release is reported at once (EC2's
    ``TerminateInstances`` answers with the state it put the instance in)."""

    def __post_init__(self) -> None:
        if not self.time_scale > 0:
            raise LiveputError(f"emulated provider: time_scale must be > 0, got {self.time_scale}")
        if not self.notice_lead_s >= 0:
            raise LiveputError(
                f"emulated provider: notice_lead_s must be >= 0, got {self.notice_lead_s}"
            )
        check_loss_signal_delay(self.loss_signal_delay_s, "emulated provider")
        low, high = self.on_demand_delay_s
        if not 0 <= low <= high:
            raise LiveputError(
                f"emulated provider: on_demand_delay_s must be 0 <= low <= high, "
                f"got {self.on_demand_delay_s}"
            )
        if not self.zones or len(set(self.zones)) != len(self.zones):
            raise LiveputError(
                f"emulated provider: zones must be distinct and not empty, got {self.zones}"
            )
