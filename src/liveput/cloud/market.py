"""The market adapter: a deadline policy's provisioning carried out by a holder on any provider.

The coordinator of a deadline job asks its policy each interval for a
:class:`~liveput.policies.base.Provisioning`; :class:`HolderMarket` is the coordinator's view of
the market (a :class:`~liveput.runtime.coordinator.MarketView`) that turns it into the
:class:`~liveput.cloud.holding.InstanceHolder`'s target, and reports what is pending and spent.
"""

from __future__ import annotations

import logging

from liveput.cloud.holding import InstanceHolder
from liveput.cloud.types import InstanceState, Market
from liveput.policies.base import Provisioning

LOG = logging.getLogger(__name__)
__all__ = ["HolderMarket"]


class HolderMarket:
    """A deadline job's view of any provider (a :class:`~liveput.runtime.coordinator.MarketView`):
    the holder asks for the spot instances the policy holds (``spot_hold``, at most ``spot``;
    the spares above it are given back, and asked for again when the policy holds more) and
    for the on-demand instances the policy wants."""

    def __init__(self, holder: InstanceHolder, spot: int) -> None:
        self.holder = holder
        self.spot = spot

    def on_demand_pending(self) -> int:
        return sum(
            1
            for r in self.holder.provider.instances()
            if r.market is Market.ON_DEMAND and r.state is InstanceState.PENDING
        )

    def usd_spent(self) -> float:
        return self.holder.provider.bill().usd

    def provision(self, provisioning: Provisioning) -> None:
        hold = self.spot if provisioning.spot_hold is None else provisioning.spot_hold
        target = Provisioning(min(hold, self.spot), provisioning.on_demand)
        if target != self.holder.target:
            LOG.info(
                "provisioning: %d spot and %d on-demand instances (was %s)",
                target.spot,
                target.on_demand,
                self.holder.target,
            )
            self.holder.target = target
            self.holder.reconcile()
