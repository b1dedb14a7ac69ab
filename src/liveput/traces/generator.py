"""A seeded generator of spot availability traces, calibrated to measured AWS traces.

Model (one step per interval of ``interval_s``; rates below are per 60-s interval and rescaled for
other intervals). The market is in a *calm* or a *volatile* state (a two-state Markov chain with
mean dwell ``dwell_h`` hours); in each interval, with ``n`` instances of a capacity ``cap``:

- a preemption burst happens with probability ``preempt_prob`` (times ``volatile_factor`` in the
  volatile state, divided by it in the calm one); its size is ``cap``-wide (all instances of the
  zone reclaimed) with probability ``wipeout_prob``, else geometric with mean
  ``preempt_burst_mean``, at most ``n``;
- an allocation burst happens with probability ``alloc_gain * deficit / cap`` (capped at
  ``alloc_max_prob``), where ``deficit = cap - n``: requests outstanding are granted more often the
  more are outstanding; its size is geometric with mean ``alloc_burst_mean`` (or the whole deficit
  with probability ``refill_prob``), at most ``deficit``.

A regime is fitted at one size, ``reference_nodes`` (32 for p3-like, 16 for v100-like): one zone's
market. A larger capacity is split into zones of that size (the last one smaller), each with its
own count, bursts, deficit and refills as above, all sharing the calm / volatile state: so the
preemptions per instance-hour and the fraction of the capacity up stay those of the calibration at
any size above it (checked at 32 and 2,000 nodes in ``tests/test_traces_generator.py``). At or
below it a trace is one zone, so a small cluster sees a whole zone's bursts (more preemptions per
instance-hour than a larger one). An interval's losses of all zones are one event, and so are its
allocations.

Events fall at uniformly random times inside their interval. Calibration targets (measured with
``liveput trace stats`` and the per-interval statistics in ``docs/traces.md``):

============================  ===========================  ===================================
statistic (60-s intervals)    p3 trace (AWS, 32 x V100)     v100 trace (AWS, 16 x V100, 16 d)
============================  ===========================  ===================================
intervals with a preemption   11.6 %                        0.61 % (3.1 % of 300-s intervals)
mean preemption burst         2.1 instances                 ~10 instances (often all 16)
preemptions / instance-hour   0.61                          0.54
time-weighted mean / cap      0.75 (24.0 of 32)             0.43 (6.9 of 16)
============================  ===========================  ===================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from liveput.errors import LiveputError
from liveput.registry import Registry
from liveput.traces.trace import MAX_INTERVALS, Trace


@dataclass(frozen=True)
class Regime:
    """Parameters of the generator (probabilities per 60-s interval)."""

    preempt_prob: float
    """Probability of a preemption burst in an interval (average market state)."""
    preempt_burst_mean: float
    """Mean size of a (non-wipeout) preemption burst, instances."""
    wipeout_prob: float
    """Probability that a burst reclaims every instance."""
    alloc_gain: float
    """Allocation burst probability per unit of relative deficit (``deficit / cap``)."""
    alloc_max_prob: float
    """Upper bound of the allocation burst probability."""
    alloc_burst_mean: float
    """Mean size of an allocation burst, instances."""
    refill_prob: float
    """Probability that an allocation burst grants the whole deficit."""
    volatile_factor: float
    """Preemption rate multiplier of the volatile state (divisor of the calm one), >= 1."""
    dwell_h: float
    """Mean time in one market state, hours."""
    start_fraction: float = 0.6
    """Instances available at the start, as a fraction of the capacity."""
    reference_nodes: int = 32
    """Capacity the regime was fitted at, instances: one zone (larger capacities are zones)."""

    def __post_init__(self) -> None:
        probabilities = (
            self.preempt_prob,
            self.wipeout_prob,
            self.alloc_max_prob,
            self.refill_prob,
        )
        if any(not 0 <= p <= 1 for p in probabilities) or not 0 <= self.start_fraction <= 1:
            raise LiveputError("generator regime: probabilities must be within [0, 1]")
        if min(self.preempt_burst_mean, self.alloc_burst_mean) < 1 or self.volatile_factor < 1:
            raise LiveputError("generator regime: burst means and volatile factor must be >= 1")
        if self.dwell_h <= 0 or self.alloc_gain < 0:
            raise LiveputError("generator regime: dwell must be positive and gain >= 0")
        if self.reference_nodes < 1:
            raise LiveputError("generator regime: reference_nodes must be >= 1")


REGIMES: Registry[Regime] = Registry("trace regime")
REGIMES.register("p3-like")(Regime(0.09, 2.1, 0.0, 0.5, 0.6, 2.0, 0.0, 2.0, 1.0))
REGIMES.register("v100-like")(
    Regime(
        0.012, 4.0, 0.55, 0.008, 0.05, 6.0, 0.6, 1.5, 24.0, start_fraction=0.0, reference_nodes=16
    )
)
REGIMES.register("calm")(Regime(0.03, 1.5, 0.0, 0.4, 0.5, 1.5, 0.0, 1.5, 2.0, 0.9))
REGIMES.register("volatile")(Regime(0.2, 2.5, 0.01, 0.8, 0.7, 2.5, 0.05, 2.5, 0.5))
# The default is the frequent-preemption market of the p3 trace, where proactive training matters.
REGIMES.register("default")(REGIMES.get("p3-like"))


def _geometric(rng: np.random.Generator, mean: float) -> int:
    return int(rng.geometric(1.0 / mean))


MAX_ZONE_INTERVALS = 20_000_000
"""Intervals times zones a generated trace may draw (about 20 s of work on one core)."""


@dataclass
class _Events:
    """Changes in draw order: an interval's losses, then its allocations, at random times."""

    times: list[float] = field(default_factory=list)
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    def record(
        self, rng: np.random.Generator, step: int, interval_s: float, gained: int, lost: int
    ) -> None:
        for change_added, change_removed in ((0, lost), (gained, 0)):
            if change_added or change_removed:
                self.times.append((step + rng.uniform(0.01, 0.99)) * interval_s)
                self.added.append(change_added)
                self.removed.append(change_removed)


def _market(
    rng: np.random.Generator, params: Regime, num_intervals: int, switch_prob: float
) -> Iterator[tuple[int, float]]:
    """(interval, preemption-rate factor) under the calm / volatile market state."""
    volatile = bool(rng.random() < 0.5)
    for step in range(num_intervals):
        if rng.random() < switch_prob:
            volatile = not volatile
        yield step, params.volatile_factor if volatile else 1.0 / params.volatile_factor


Steps = tuple[int, _Events]
"""(initial count, changes) of a generated trace."""


def _one_zone(
    rng: np.random.Generator,
    params: Regime,
    nodes: int,
    num_intervals: int,
    interval_s: float,
    per_interval: Callable[[float | np.ndarray], float | np.ndarray],
    switch_prob: float,
) -> Steps:
    """The calibrated model at or below its reference size: one zone, scalar draws."""
    count = int(round(params.start_fraction * nodes))
    initial = count
    events = _Events()
    for step, factor in _market(rng, params, num_intervals, switch_prob):
        lost = 0
        if count > 0 and rng.random() < per_interval(params.preempt_prob * factor):
            wipeout = rng.random() < params.wipeout_prob
            lost = count if wipeout else min(count, _geometric(rng, params.preempt_burst_mean))
        gained = 0
        deficit = nodes - count
        alloc_prob = min(params.alloc_max_prob, params.alloc_gain * deficit / nodes)
        if deficit > 0 and rng.random() < per_interval(alloc_prob):
            refill = rng.random() < params.refill_prob
            gained = deficit if refill else min(deficit, _geometric(rng, params.alloc_burst_mean))
        events.record(rng, step, interval_s, gained, lost)
        count += gained - lost
    return initial, events


def _many_zones(
    rng: np.random.Generator,
    params: Regime,
    nodes: int,
    num_intervals: int,
    interval_s: float,
    per_interval: Callable[[float | np.ndarray], float | np.ndarray],
    switch_prob: float,
) -> Steps:
    """Above the reference size: zones of ``reference_nodes`` drawn side by side (vectorized),
    sharing the market state; each interval's losses, and its allocations, are one event."""
    zone = params.reference_nodes
    capacity = np.full(-(-nodes // zone), zone, dtype=np.int64)
    capacity[-1] = nodes - zone * (len(capacity) - 1)
    counts = np.round(params.start_fraction * capacity).astype(np.int64)
    initial = int(counts.sum())
    num_zones = len(capacity)
    events = _Events()
    for step, factor in _market(rng, params, num_intervals, switch_prob):
        hit = (counts > 0) & (rng.random(num_zones) < per_interval(params.preempt_prob * factor))
        wipeout = rng.random(num_zones) < params.wipeout_prob
        burst = rng.geometric(1.0 / params.preempt_burst_mean, num_zones)
        lost = np.where(hit, np.where(wipeout, counts, np.minimum(counts, burst)), 0)
        deficit = capacity - counts
        alloc_prob = np.minimum(params.alloc_max_prob, params.alloc_gain * deficit / capacity)
        grant = (deficit > 0) & (rng.random(num_zones) < per_interval(alloc_prob))
        refill = rng.random(num_zones) < params.refill_prob
        burst = rng.geometric(1.0 / params.alloc_burst_mean, num_zones)
        gained = np.where(grant, np.where(refill, deficit, np.minimum(deficit, burst)), 0)
        counts += gained - lost
        events.record(rng, step, interval_s, int(gained.sum()), int(lost.sum()))
    return initial, events


def generate_trace(
    nodes: int, hours: float, seed: int, regime: str = "default", interval_s: float = 60.0
) -> Trace:
    """A synthetic trace of ``nodes`` requested instances over ``hours``, reproducible by
    ``seed``."""
    if nodes < 1:
        raise LiveputError(f"trace generator: --nodes must be >= 1, got {nodes}")
    if not 0 < hours < math.inf or not 0 < interval_s < math.inf:
        raise LiveputError("trace generator: hours and interval must be finite and positive")
    if seed < 0:
        raise LiveputError(f"trace generator: the seed must be >= 0, got {seed}")
    params = REGIMES.get(regime)
    rng = np.random.default_rng(seed)
    num_intervals = max(1, int(round(hours * 3600 / interval_s)))
    if num_intervals > MAX_INTERVALS:
        raise LiveputError(
            f"trace generator: {hours:g} h in {interval_s:g}-s intervals is "
            f"{num_intervals:,} intervals, more than {MAX_INTERVALS:,}"
        )
    scale = interval_s / 60.0  # rates are calibrated per 60-s interval

    def per_interval(p: float | np.ndarray) -> float | np.ndarray:
        return 1.0 - (1.0 - np.minimum(p, 1.0)) ** scale

    switch_prob = float(per_interval(1.0 / (params.dwell_h * 60.0)))
    zones = -(-nodes // params.reference_nodes)
    if num_intervals * zones > MAX_ZONE_INTERVALS:
        raise LiveputError(
            f"trace generator: {nodes:,} nodes over {hours:g} h is {zones:,} zones x "
            f"{num_intervals:,} intervals, more than {MAX_ZONE_INTERVALS:,} zone-intervals "
            "(fewer --nodes or --hours)"
        )
    draw = _one_zone if zones == 1 else _many_zones
    initial, events = draw(rng, params, nodes, num_intervals, interval_s, per_interval, switch_prob)
    times, added, removed = events.times, events.added, events.removed
    order = np.argsort(times, kind="stable")
    merged_times = np.array(times)[order]
    # Two events drawn at the same instant are one change.
    unique_times, inverse = np.unique(merged_times, return_inverse=True)
    return Trace(
        name=f"generated-{regime}-{nodes}n-{hours:g}h-seed{seed}",
        initial_count=initial,
        times_s=unique_times,
        added=np.bincount(inverse, np.array(added)[order], len(unique_times)).astype(int),
        removed=np.bincount(inverse, np.array(removed)[order], len(unique_times)).astype(int),
        end_s=num_intervals * interval_s,
    )
