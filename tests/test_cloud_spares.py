"""Spares given back: a deadline policy says how many spot instances are worth holding, and the
market adapter has the holder give back those above it (and ask again when it holds more)."""

from __future__ import annotations

import numpy as np
from cloud_fakes import FakeProvider

from liveput.cloud import Market, RetryPolicy
from liveput.cloud.holding import InstanceHolder
from liveput.cloud.market import HolderMarket
from liveput.perf import load_profile
from liveput.policies import Observation, Provisioning
from liveput.policies.deadline import DEADLINE_POLICIES
from liveput.policies.objective import JobObjective
from liveput.runtime.clock import ManualClock
from liveput.sim import SimulationConfig
from liveput.sim.deadline import make_deadline_context
from liveput.traces import IntervalTrace

GPT = load_profile("gpt-1.5b")


def _alive(holder: InstanceHolder) -> dict[Market, int]:
    return {market: len(records) for market, records in holder.alive().items()}


def test_the_market_gives_back_the_spares_above_the_policys_hold_and_asks_again_later() -> None:
    clock = ManualClock(0.0)
    provider = FakeProvider(clock, RetryPolicy(max_attempts=1))
    holder = InstanceHolder(provider, Provisioning(spot=4, on_demand=0), ["small"])
    holder.reconcile()
    market = HolderMarket(holder, spot=4)
    assert _alive(holder) == {Market.SPOT: 4, Market.ON_DEMAND: 0}
    market.provision(Provisioning(spot=1, on_demand=1, spot_hold=2))
    assert _alive(holder) == {Market.SPOT: 2, Market.ON_DEMAND: 1}
    released = [r for r in provider.instances() if r.end_s is not None]
    assert len(released) == 2 and all(r.market is Market.SPOT for r in released)
    # No hold: as many as the market offers, up to the job's spot count (a new request).
    market.provision(Provisioning(spot=2, on_demand=1))
    assert _alive(holder) == {Market.SPOT: 4, Market.ON_DEMAND: 1}
    # A hold above the job's spot count is capped at it.
    market.provision(Provisioning(spot=2, on_demand=0, spot_hold=9))
    assert _alive(holder) == {Market.SPOT: 4, Market.ON_DEMAND: 0}


def test_deadline_policies_say_which_spot_instances_are_worth_holding() -> None:
    zeros = np.zeros(240, dtype=int)
    trace = IntervalTrace("surplus", 60.0, np.full(240, 16), zeros, zeros)
    context = make_deadline_context(
        trace,
        GPT,
        JobObjective(deadline_hours=4.0, target_samples=2e4),
        SimulationConfig(predictor="persistence"),
        check=False,
    )
    loose = dict(samples_remaining=2e4, seconds_to_deadline=4 * 3600.0)
    observation = Observation(
        time_s=0.0,
        interval_index=0,
        interval_s=60.0,
        history=IntervalTrace("seen", 60.0, trace.count[:1], zeros[:1], zeros[:1]),
        num_available=16,
        current=None,
        capacity=16,
        remaining_s=60.0,
        **loose,
    )
    decision = DEADLINE_POLICIES.get("liveput")(context).decide(observation)
    assert decision.provisioning is not None
    hold = decision.provisioning.spot_hold
    # A small job with a loose deadline on plentiful spot: fewer than all 16 are worth paying for.
    assert hold is not None and decision.provisioning.spot <= hold < 16
    on_demand = DEADLINE_POLICIES.get("on-demand")(context).decide(observation)
    assert on_demand.provisioning is not None and on_demand.provisioning.spot_hold == 0
    spot_only = DEADLINE_POLICIES.get("spot-only")(context).decide(observation)
    assert spot_only.provisioning is not None and spot_only.provisioning.spot_hold is None
