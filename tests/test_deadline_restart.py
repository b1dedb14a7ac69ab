"""A restarted coordinator keeps the job's deadline clock and bill: the deadline counts from the
job's first coordinator, and the dollars paid under it count on (its provider's bill went with
it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from liveput.perf import load_profile
from liveput.policies import Provisioning
from liveput.policies.objective import JobObjective
from liveput.runtime import keys
from liveput.runtime.coordinator.objective import DeadlineObjective
from liveput.runtime.decide import CoordinatorConfig
from liveput.runtime.store import MemoryStore
from liveput.sim import SimulationConfig
from liveput.sim.deadline import make_deadline_context
from liveput.traces import IntervalTrace


class _Market:
    """An in-memory market: what it spent, nothing pending."""

    def __init__(self, usd: float) -> None:
        self.usd = usd

    def on_demand_pending(self) -> int:
        return 0

    def usd_spent(self) -> float:
        return self.usd

    def provision(self, provisioning: Provisioning) -> None:
        pass


def _context():  # noqa: ANN202
    zeros = np.zeros(120, dtype=int)
    trace = IntervalTrace("flat", 60.0, np.full(120, 16), zeros, zeros)
    return make_deadline_context(
        trace,
        load_profile("gpt-1.5b"),
        JobObjective(deadline_hours=2.0, target_samples=1e4),
        SimulationConfig(predictor="persistence"),
        check=False,
    )


def test_a_restarted_coordinator_plans_for_the_deadline_the_job_was_given() -> None:
    store = MemoryStore()
    context = _context()
    # Wall seconds at one decision interval a second: a policy minute each wall second.
    config = CoordinatorConfig(num_steps=10, num_micro_batches=4, interval_s=1.0)
    first = DeadlineObjective(context, _Market(usd=5.0))
    first.recover(store, now_unix_s=1000.0)
    assert first.seconds_to_deadline(0.0, config) == pytest.approx(2 * 3600.0)
    reading = first.read_market()
    assert reading is not None and reading.usd_spent == 5.0
    assert store.get(keys.coordinator_deadline()) is not None
    kept = json.loads(store.get(keys.coordinator_deadline()))["usd"]
    assert kept == 0.0  # reading the market writes nothing
    first.keep_spending(reading)  # the loop keeps what it read
    # Half the deadline later (60 wall s = 60 policy minutes), a new coordinator, a new bill.
    second = DeadlineObjective(context, _Market(usd=1.5))
    second.recover(store, now_unix_s=1060.0)
    assert second.seconds_to_deadline(0.0, config) == pytest.approx(3600.0)
    reading = second.read_market()
    assert reading is not None and reading.usd_spent == pytest.approx(6.5)
    second.keep_spending(reading)
    third = DeadlineObjective(context, _Market(usd=0.0))
    third.recover(store, now_unix_s=1090.0)
    assert third.seconds_to_deadline(0.0, config) == pytest.approx(1800.0)
    assert third.read_market().usd_spent == pytest.approx(6.5)  # type: ignore[union-attr]
