"""What a provider says: markets, instance records, request results, price quotes, events.

Times are *cloud seconds* from the provider's start (the emulator's are trace seconds, so an
emulated hour replayed in two minutes still bills an hour); prices are USD per instance-hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from liveput.catalog import Market
from liveput.errors import LiveputError

__all__ = [
    "Market",
    "InstanceState",
    "InstanceRecord",
    "RequestFailure",
    "RequestResult",
    "PriceQuote",
    "ProviderEventKind",
    "ProviderEvent",
]


class InstanceState(str, Enum):
    """Where an instance is in its life."""

    PENDING = "pending"
    """Granted, not running yet (launching, or spot waiting for capacity); not billed."""
    RUNNING = "running"
    """Running, billed."""
    TERMINATED = "terminated"
    """Released or preempted; billing stopped at its end time."""


@dataclass(frozen=True)
class InstanceRecord:
    """One instance a provider granted, as it stands."""

    instance_id: str
    """The provider's id (``e-0003``, ``i-0abc...``)."""
    instance_type: str
    """Instance type, e.g. ``g4dn.xlarge``."""
    market: Market
    """Spot or on-demand."""
    zone: str
    """Availability zone."""
    state: InstanceState
    """Pending, running or terminated."""
    requested_s: float
    """When it was granted, cloud seconds."""
    price_usd_per_hour: float
    """What an hour of it costs (the price in force when it started)."""
    launch_s: float | None = None
    """When it started running, cloud seconds (None: it never ran)."""
    end_s: float | None = None
    """When it stopped running or was cancelled, cloud seconds (None: still alive)."""
    preempted: bool = False
    """Ended by the cloud (a spot preemption), not released."""

    def __post_init__(self) -> None:
        if self.price_usd_per_hour < 0:
            raise LiveputError(
                f"instance {self.instance_id}: negative price {self.price_usd_per_hour}"
            )
        if self.launch_s is not None and self.end_s is not None and self.end_s < self.launch_s:
            raise LiveputError(
                f"instance {self.instance_id}: ends at {self.end_s} before it "
                f"launched at {self.launch_s}"
            )

    def run_s(self, now_s: float) -> float:
        """Cloud seconds it has run (billed) by ``now_s``."""
        if self.launch_s is None:
            return 0.0
        end_s = now_s if self.end_s is None else min(self.end_s, now_s)
        return max(0.0, end_s - self.launch_s)


@dataclass(frozen=True)
class RequestFailure:
    """Part of a request that was not granted, and why."""

    count: int
    """Instances not granted for this reason."""
    code: str
    """The provider's error code (``InsufficientInstanceCapacity``, ``VcpuLimitExceeded``, ...)."""
    message: str
    """The provider's words, one line."""
    attempts: int = 1
    """Tries made (retries included) before giving up."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise LiveputError(f"a request failure counts >= 1 instance, got {self.count}")


@dataclass(frozen=True)
class RequestResult:
    """What became of ``request(count, ...)``: every instance asked for is granted or failed."""

    requested: int
    """Instances asked for."""
    market: Market
    """The market asked in."""
    granted: tuple[InstanceRecord, ...]
    """Instances granted (pending or running), in grant order."""
    failures: tuple[RequestFailure, ...] = ()
    """The rest, by reason."""

    def __post_init__(self) -> None:
        failed = sum(f.count for f in self.failures)
        if len(self.granted) + failed != self.requested:
            raise LiveputError(
                f"request accounting: {len(self.granted)} granted + {failed} "
                f"failed != {self.requested} requested"
            )

    @property
    def failed(self) -> int:
        """Instances not granted."""
        return sum(f.count for f in self.failures)

    @property
    def instance_ids(self) -> list[str]:
        return [record.instance_id for record in self.granted]

    def describe(self) -> str:
        """One line: granted and failed counts with the reasons."""
        text = f"{len(self.granted)} of {self.requested} {self.market.value} instance(s) granted"
        if self.failures:
            reasons = "; ".join(
                f"{f.count} failed: {f.code}: {f.message} (after {f.attempts} attempt(s))"
                for f in self.failures
            )
            text += f"; {reasons}"
        return text

    def check(self) -> RequestResult:
        """Itself if all was granted; else a :class:`LiveputError` saying what failed."""
        if self.failures:
            raise LiveputError(self.describe())
        return self


@dataclass(frozen=True)
class PriceQuote:
    """Prices of one instance type in one zone."""

    instance_type: str
    """Instance type."""
    zone: str
    """Availability zone."""
    spot_usd_per_hour: float
    """Current spot price."""
    on_demand_usd_per_hour: float
    """On-demand price."""

    def price_usd_per_hour(self, market: Market) -> float:
        return self.spot_usd_per_hour if market is Market.SPOT else self.on_demand_usd_per_hour


class ProviderEventKind(str, Enum):
    """What a provider did or met."""

    REQUEST = "request"
    GRANT = "grant"
    """Instances granted (pending)."""
    LAUNCH = "launch"
    """An instance started running."""
    NOTICE = "notice"
    """A spot instance was told it will be preempted."""
    PREEMPT = "preempt"
    """A spot instance was taken back."""
    RELEASE = "release"
    """An instance was released (terminated on request)."""
    EXIT = "exit"
    """An instance's agent ended by itself before any notice (a replayed trace's instance: it is
    gone, not preempted)."""
    RETRY = "retry"
    """A provider error worth another try; waiting before it."""
    FAIL = "fail"
    """Part of a request or a call failed for good."""


@dataclass(frozen=True)
class ProviderEvent:
    """One line of a provider's history (also logged)."""

    kind: ProviderEventKind
    """What happened."""
    time_s: float
    """Cloud seconds."""
    detail: str
    """Which instances, codes, counts: one line."""
    instance_id: str = ""
    """The instance concerned, if one."""
    clock_s: float = 0.0
    """When it was carried out, in the provider's injected clock's seconds."""
    pid: int | None = None
    """The instance's agent process, if the provider runs one."""
    lead_s: float | None = None
    """For notices: clock seconds until the preemption."""
    initial: bool = False
    """For launches: one of a replayed trace's initial instances (not an allocation)."""
