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

__all__ = ["InstanceCharge", "Bill", "BillingAccount"]

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
