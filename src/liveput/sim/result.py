"""Results of a simulation: one :class:`PolicyRun` per policy, gathered in a
:class:`SimulationResult` (with each policy's fraction of the ``ideal`` policy's samples)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PolicyRun:
    """One policy replayed on one trace."""

    policy: str
    """Policy name."""
    samples: float
    """Samples trained over the whole trace."""
    cost_usd: float
    """Dollars paid for every instance-hour held."""
    usd_per_1k_samples: float
    """``cost_usd / samples * 1000`` (inf when nothing was trained)."""
    reconfigurations: int
    """Decisions that changed what runs (any migration, restart or checkpoint restore)."""
    downtime_s: float
    """Seconds lost to migrations, restarts, checkpoints and re-done (rolled back) work."""
    interval_s: float = 60.0
    """Length of an interval, seconds."""
    available: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Spot instances available at the start of each interval."""
    data_parallel: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """D chosen at the start of each interval (0: nothing runs)."""
    pipeline_stages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """P chosen at the start of each interval (0: nothing runs)."""
    on_demand: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """On-demand instances held at the start of each interval."""
    cumulative_samples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Samples trained by the end of each interval."""
    cumulative_cost_usd: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Dollars paid by the end of each interval."""

    @property
    def hours(self) -> float:
        return len(self.available) * self.interval_s / 3600.0

    def summary(self, ideal_samples: float | None = None) -> dict[str, float | int | None]:
        """The figures of ``--json`` (with the fraction of ``ideal`` when it is known)."""
        return {
            "samples": self.samples,
            "cost_usd": self.cost_usd,
            "usd_per_1k_samples": self.usd_per_1k_samples,
            "reconfigurations": self.reconfigurations,
            "downtime_s": self.downtime_s,
            "fraction_of_ideal": (self.samples / ideal_samples
                                  if ideal_samples else None),
        }


@dataclass(frozen=True)
class SimulationResult:
    """Every policy replayed on the same trace with the same settings."""

    trace: str
    """Trace name."""
    model: str
    """Model name."""
    interval_s: float
    """Length of an interval, seconds."""
    hours: float
    """Length of the replayed trace, hours."""
    runs: dict[str, PolicyRun]
    """Each policy's run, by name, in the order asked."""
    ideal_samples: float | None = None
    """Samples of the ``ideal`` policy (the upper bound), simulated even when not asked."""

    def fraction_of_ideal(self, policy: str) -> float | None:
        """The policy's samples over ``ideal``'s (None when ideal trains nothing)."""
        if not self.ideal_samples:
            return None
        return float(self.runs[policy].samples / self.ideal_samples)

    def to_json(self) -> dict:
        """The ``--json`` document of ``liveput simulate``."""
        return {
            "trace": self.trace,
            "model": self.model,
            "interval_s": self.interval_s,
            "hours": self.hours,
            "policies": {name: run.summary(self.ideal_samples) for name, run in self.runs.items()},
        }
