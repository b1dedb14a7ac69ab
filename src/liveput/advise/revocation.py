"""Revocation model of transient (spot / preemptible) instances and its cost to a cluster.

An instance's lifetime has a piecewise-constant hazard: lambda_1 per hour during its first hour
(when revocations cluster, CM-DARE), lambda_2 after, and a forced end at ``max_life_hours`` (GCE
preemptible VMs live at most 24 h). From the fractions revoked within 1 h (p1) and 24 h (p24):
    lambda_1 = -ln(1 - p1),   lambda_2 = -ln((1 - p24) / (1 - p1)) / 23           (per hour)
A revoked instance is replaced at once, so each instance slot sees revocations at the renewal rate
1 / E[lifetime]. Each revocation costs ``overhead_s`` (provisioning + framework restart + the work
lost since the last checkpoint). A synchronous cluster of n nodes stalls on every revocation of any
node; an asynchronous one (spotDNN's parameter server) loses only that worker's time:
    productive fraction  f = 1 - k rate overhead_h,  k = n (synchronous) or 1 (asynchronous)
    expected hours       = work hours / f;   expected cost = expected hours * $/h.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError
from liveput.registry import Registry
from liveput.traces import IntervalTrace


@dataclass(frozen=True)
class RevocationOverhead:
    """Seconds one revocation costs, CM-DARE's measured figures by default."""

    provision_s: float = 81.0
    """Start-up of a replacement VM (CM-DARE: 70-92 s; the middle)."""
    restart_s: float = 55.0
    """Framework restart (CM-DARE: 12 s warm, 55 s cold)."""
    lost_work_s: float = 30.0
    """Work lost since the last checkpoint (half a 60-s checkpoint interval)."""

    def __post_init__(self) -> None:
        if min(self.provision_s, self.restart_s, self.lost_work_s) < 0:
            raise LiveputError("revocation overheads must be >= 0 s")

    @property
    def total_s(self) -> float:
        return self.provision_s + self.restart_s + self.lost_work_s


@dataclass(frozen=True)
class RevocationModel:
    """Probability that an instance is revoked within t hours, and what it costs a cluster."""

    revoked_1h: float
    """p1: fraction of instances revoked within their first hour."""
    revoked_24h: float
    """p24: fraction revoked within 24 hours (>= p1)."""
    max_life_hours: float = 24.0
    """Forced end of an instance's life (GCE preemptible: 24 h; ``inf`` for AWS spot)."""
    source: str = ""
    """Where the figures come from."""

    def __post_init__(self) -> None:
        if not (0 <= self.revoked_1h <= self.revoked_24h < 1):
            raise LiveputError(
                f"revocation model needs 0 <= p1 <= p24 < 1; got "
                f"{self.revoked_1h}, {self.revoked_24h}"
            )
        if not self.max_life_hours > 1:
            raise LiveputError("max_life_hours must be > 1")

    @property
    def hazards_per_hour(self) -> tuple[float, float]:
        first = -math.log1p(-self.revoked_1h)
        later = -math.log((1 - self.revoked_24h) / (1 - self.revoked_1h)) / 23.0
        return first, later

    def probability_revoked_within(self, hours: np.ndarray | float) -> np.ndarray:
        """P(revoked within t hours) of one instance; past ``max_life_hours`` every one is gone."""
        t = np.asarray(hours, dtype=float)
        first, later = self.hazards_per_hour
        cumulative = first * np.minimum(t, 1.0) + later * np.maximum(t - 1.0, 0.0)
        return np.where(t > self.max_life_hours, 1.0, 1.0 - np.exp(-cumulative))

    @property
    def expected_lifetime_hours(self) -> float:
        first, later = self.hazards_per_hour
        head = (1 - math.exp(-first)) / first if first > 0 else 1.0
        rest = self.max_life_hours - 1.0
        if later > 0:
            tail = (1 - math.exp(-later * rest)) / later if math.isfinite(rest) else 1 / later
        else:
            tail = rest
        return head + math.exp(-first) * tail

    @property
    def revocations_per_hour(self) -> float:
        """Renewal rate of revocations of one instance slot."""
        return 1.0 / self.expected_lifetime_hours

    def productive_fraction(
        self, workers: np.ndarray | float, overhead: RevocationOverhead, synchronous: bool = True
    ) -> np.ndarray:
        """Fraction of wall time the cluster trains (0 when revocations outpace recovery)."""
        n = np.asarray(workers, dtype=float) if synchronous else np.ones_like(workers, float)
        return np.maximum(1.0 - n * self.revocations_per_hour * overhead.total_s / 3600.0, 0.0)

    def expected_hours(
        self,
        work_hours: np.ndarray | float,
        workers: np.ndarray | float,
        overhead: RevocationOverhead,
        synchronous: bool = True,
    ) -> np.ndarray:
        """Wall hours to do ``work_hours`` of revocation-free training (inf if never)."""
        fraction = self.productive_fraction(workers, overhead, synchronous)
        with np.errstate(divide="ignore"):
            return np.where(fraction > 0, np.asarray(work_hours, float) / fraction, np.inf)

    @classmethod
    def from_trace(cls, trace: IntervalTrace) -> RevocationModel:
        """A constant hazard estimated from a trace: preemptions per instance-hour held."""
        held_hours = float((trace.count * trace.interval_s).sum()) / 3600.0
        if held_hours <= 0:
            raise LiveputError(
                f"trace {trace.name}: no instance-hours to estimate revocations from"
            )
        rate = float(trace.preempted.sum()) / held_hours
        p1 = 1 - math.exp(-rate)
        p24 = 1 - math.exp(-24 * rate)
        if p24 >= 1:
            raise LiveputError(
                f"trace {trace.name}: {rate:.1f} revocations per instance-hour "
                "leave no instance alive for a day; not a usable model"
            )
        return cls(p1, p24, math.inf, f"estimated from trace {trace.name}: {rate:.4f}/h")


REVOCATION_MODELS: Registry[RevocationModel] = Registry("revocation model")
"""Published measurements by name (CM-DARE, GCE preemptible GPUs, fractions revoked in 1 h and
24 h)."""
for _name, _p1, _p24 in (
    ("gce-k80-us-central1", 0.10, 0.56),
    ("gce-k80-us-east1", 0.47, 0.47),
    ("gce-p100-us-east1", 0.20, 0.70),
    ("gce-v100-us-central1", 0.67, 0.67),
    ("gce-v100-europe-west4", 0.07, 0.43),
):
    REVOCATION_MODELS.register(_name)(
        RevocationModel(_p1, _p24, 24.0, f"CM-DARE (ICDCS 2020) measured {_name}")
    )
