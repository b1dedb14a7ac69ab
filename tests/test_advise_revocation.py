"""Revocation model: CM-DARE's measured fractions, estimates from traces, expected time and cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from liveput.advise import REVOCATION_MODELS, RevocationModel, RevocationOverhead
from liveput.errors import LiveputError
from liveput.traces import IntervalTrace, generate_trace

PUBLISHED = {
    "gce-k80-us-central1": (0.10, 0.56),
    "gce-k80-us-east1": (0.47, 0.47),
    "gce-p100-us-east1": (0.20, 0.70),
    "gce-v100-us-central1": (0.67, 0.67),
    "gce-v100-europe-west4": (0.07, 0.43),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_fractions_are_reproduced(name: str) -> None:
    model = REVOCATION_MODELS.get(name)
    within = model.probability_revoked_within(np.array([0.0, 1.0, 24.0, 24.5]))
    assert within[0] == 0.0
    assert within[1] == pytest.approx(PUBLISHED[name][0])
    assert within[2] == pytest.approx(PUBLISHED[name][1])
    assert within[3] == 1.0  # past the 24-h life every preemptible VM is gone
    grid = np.linspace(0, 24, 97)
    assert np.all(np.diff(model.probability_revoked_within(grid)) >= -1e-15)


def test_expected_lifetime_matches_numerical_integration() -> None:
    for name in PUBLISHED:
        model = REVOCATION_MODELS.get(name)
        grid = np.linspace(0, 24, 240001)
        survival = 1 - model.probability_revoked_within(grid)
        integral = float(np.sum((survival[1:] + survival[:-1]) / 2 * np.diff(grid)))
        assert model.expected_lifetime_hours == pytest.approx(integral, rel=1e-6)


def test_expected_time_and_cost_under_revocations() -> None:
    model = REVOCATION_MODELS.get("gce-v100-us-central1")
    overhead = RevocationOverhead()
    assert overhead.total_s == 81 + 55 + 30
    rate = model.revocations_per_hour
    sync = model.expected_hours(10.0, 8, overhead)
    assert sync == pytest.approx(10.0 / (1 - 8 * rate * overhead.total_s / 3600))
    asynchronous = model.expected_hours(10.0, 8, overhead, synchronous=False)
    assert 10.0 < asynchronous < sync
    # Larger synchronous clusters lose more of their time, down to nothing.
    fractions = model.productive_fraction(np.arange(1, 400), overhead)
    assert np.all(np.diff(fractions) <= 0) and fractions[-1] == 0.0
    assert math.isinf(float(model.expected_hours(1.0, 399, overhead)))


def test_estimate_from_a_trace() -> None:
    # 10 instances held for 100 one-hour intervals, 1 revoked and replaced each hour: 0.1 / h.
    count = np.full(100, 10)
    trace = IntervalTrace("steady", 3600.0, count, np.ones(100, int), np.ones(100, int))
    model = RevocationModel.from_trace(trace)
    assert model.hazards_per_hour[0] == pytest.approx(0.1)
    assert model.hazards_per_hour[1] == pytest.approx(0.1)
    assert model.expected_lifetime_hours == pytest.approx(10.0)
    generated = generate_trace(16, 6.0, seed=2).resample(60.0)
    estimate = RevocationModel.from_trace(generated)
    held_hours = generated.count.sum() / 60.0
    assert estimate.revocations_per_hour == pytest.approx(generated.preempted.sum() / held_hours)
    empty = IntervalTrace("empty", 60.0, np.zeros(3, int), np.zeros(3, int), np.zeros(3, int))
    with pytest.raises(LiveputError, match="no instance-hours"):
        RevocationModel.from_trace(empty)


def test_bad_fractions_are_rejected() -> None:
    with pytest.raises(LiveputError, match="p1 <= p24"):
        RevocationModel(0.5, 0.4)
