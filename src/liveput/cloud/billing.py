"""The bill: what each instance cost, spot and on-demand apart.

Notation: instance ``i`` with price ``p_i`` (USD per hour, in force when it started), running
from ``launch_i`` to ``end_i`` (or now, while it runs), cloud seconds. Then

    usd_i = p_i * (end_i - launch_i) / 3600

and the totals sum ``usd_i`` by market. An instance that never ran (cancelled while pending,
spot that never found capacity) costs nothing. Per-second billing, as EC2 bills Linux instances
(its one-minute minimum is left out: the emulator's instances run far longer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from liveput.cloud.types import InstanceRecord, Market

__all__ = ["InstanceCharge", "Bill", "BillingAccount", "Peak", "peak_holding"]

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class InstanceCharge:
    """What one instance cost."""

    instance_id: str
    """Which instance."""
    market: Market
    """Spot or on-demand."""
    run_s: float
    """Cloud seconds it ran."""
    usd: float
    """Its cost."""


@dataclass(frozen=True)
class Bill:
    """Costs at one moment."""

    charges: tuple[InstanceCharge, ...]
    """Per instance, in record order."""

    def _sum(self, market: Market | None, attr: str) -> float:
        return sum(getattr(c, attr) for c in self.charges if market is None or c.market is market)

    @property
    def usd(self) -> float:
        return self._sum(None, "usd")

    @property
    def usd_spot(self) -> float:
        return self._sum(Market.SPOT, "usd")

    @property
    def usd_on_demand(self) -> float:
        return self._sum(Market.ON_DEMAND, "usd")

    @property
    def spot_hours(self) -> float:
        return self._sum(Market.SPOT, "run_s") / SECONDS_PER_HOUR

    @property
    def on_demand_hours(self) -> float:
        return self._sum(Market.ON_DEMAND, "run_s") / SECONDS_PER_HOUR

    def summary(self) -> dict[str, float]:
        """The JSON fields: ``usd``, ``usd_spot``, ``usd_on_demand``, ``on_demand_hours``,
        ``spot_hours``."""
        return {
            "usd": self.usd,
            "usd_spot": self.usd_spot,
            "usd_on_demand": self.usd_on_demand,
            "on_demand_hours": self.on_demand_hours,
            "spot_hours": self.spot_hours,
        }


class BillingAccount:
    """Charges instance records: a provider's account, read at any moment."""

    @staticmethod
    def bill(records: Iterable[InstanceRecord], now_s: float) -> Bill:
        """The bill of ``records`` as of cloud time ``now_s``."""
        charges = []
        for record in records:
            run_s = record.run_s(now_s)
            charges.append(
                InstanceCharge(
                    record.instance_id,
                    record.market,
                    run_s,
                    record.price_usd_per_hour * run_s / SECONDS_PER_HOUR,
                )
            )
        return Bill(tuple(charges))


@dataclass(frozen=True)
class Peak:
    """The most a provider's account ever ran at once."""

    on_demand: int = 0
    """On-demand instances running at once."""
    usd_per_hour: float = 0.0
    """Dollars per hour of the instances running at once (spot and on-demand)."""


def peak_holding(records: Iterable[InstanceRecord], now_s: float) -> Peak:
    """The peak of ``records`` up to cloud time ``now_s``: each instance counts from its launch
    to its end (or now); one ending when another starts is not held with it."""
    changes: list[tuple[float, int, int, float]] = []
    for record in records:
        if record.launch_s is None or record.run_s(now_s) <= 0:
            continue
        end_s = now_s if record.end_s is None else min(record.end_s, now_s)
        on_demand = int(record.market is Market.ON_DEMAND)
        changes.append((record.launch_s, 1, on_demand, record.price_usd_per_hour))
        changes.append((end_s, 0, -on_demand, -record.price_usd_per_hour))
    count, rate, peak = 0, 0.0, Peak()
    for _, _, on_demand, usd_per_hour in sorted(changes):  # ends before starts at one time
        count, rate = count + on_demand, rate + usd_per_hour
        peak = Peak(max(peak.on_demand, count), max(peak.usd_per_hour, rate))
    return peak
