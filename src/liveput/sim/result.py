"""Results of a simulation: one :class:`PolicyRun` per policy, gathered in a
:class:`SimulationResult` (with each policy's fraction of the ``ideal`` policy's samples).

A deadline job's runs and result fill the optional deadline fields (None otherwise); their
``--json`` is then the deadline one (``liveput simulate --deadline-hours ... --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class PolicyRun:
    """One policy replayed on one trace."""

    policy: str
    """Policy name."""
    samples: float
    """Samples trained over the whole trace (a deadline job: until its work was done)."""
    cost_usd: float
    """Dollars paid for every instance-hour held (a deadline job: ``usd_spot +
    usd_on_demand``)."""
    usd_per_1k_samples: float
    """``cost_usd / samples * 1000`` (inf when nothing was trained)."""
    reconfigurations: int
    """Decisions that changed what runs (any migration, restart or checkpoint restore)."""
    downtime_s: float
    """Seconds lost to migrations, restarts, checkpoints and re-done (rolled back) work."""
    interval_s: float = 60.0
    """Length of an interval, seconds."""
    available: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Spot instances the market offers at the start of each interval (the trace's count)."""
    spot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Spot instances held (billed) in each interval: those available less the spares released
    at its start."""
    data_parallel: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """D chosen at the start of each interval (0: nothing runs)."""
    pipeline_stages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """P chosen at the start of each interval (0: nothing runs)."""
    on_demand: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """On-demand instances held at the start of each interval."""
    cumulative_samples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Samples trained by the end of each interval."""
    cumulative_cost_usd: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Dollars paid by the end of each interval (a deadline job's last: by its finish)."""
    deadline_met: bool | None = None
    """Deadline jobs: whether the work was done by the deadline (None: not a deadline job)."""
    hours_late: float | None = None
    """Deadline jobs: hours after the deadline the work was done (0 when met; to the cap when
    unfinished)."""
    finished_hours: float | None = None
    """Deadline jobs: hours from the start to the end of the work (None: unfinished at the cap,
    or not a deadline job)."""
    usd_spot: float | None = None
    """Deadline jobs: dollars paid for spot instance-seconds."""
    usd_on_demand: float | None = None
    """Deadline jobs: dollars paid for on-demand instance-seconds, grant to release."""
    on_demand_hours: float | None = None
    """Deadline jobs: on-demand instance-hours paid."""
    on_demand_ledger: tuple[tuple[float, float], ...] = ()
    """Deadline jobs: (grant, release) seconds of every on-demand instance: what was billed."""

    @property
    def hours(self) -> float:
        return len(self.available) * self.interval_s / 3600.0

    def summary(self, ideal_samples: float | None = None) -> dict[str, float | int | None]:
        """The figures of ``--json`` (with the fraction of ``ideal`` when it is known; a
        deadline job's own figures when it is one)."""
        if self.deadline_met is not None:
            return {
                "deadline_met": self.deadline_met,
                "hours_late": self.hours_late,
                "finished_hours": self.finished_hours,
                "usd": self.cost_usd,
                "usd_spot": self.usd_spot,
                "usd_on_demand": self.usd_on_demand,
                "on_demand_hours": self.on_demand_hours,
                "samples": self.samples,
            }
        return {
            "samples": self.samples,
            "cost_usd": self.cost_usd,
            "usd_per_1k_samples": self.usd_per_1k_samples,
            "reconfigurations": self.reconfigurations,
            "downtime_s": self.downtime_s,
            "fraction_of_ideal": (self.samples / ideal_samples if ideal_samples else None),
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
    deadline_hours: float | None = None
    """Deadline jobs: the deadline, hours from the start (None: not a deadline job)."""
    target_samples: float | None = None
    """Deadline jobs: the work, samples."""
    on_demand_max: int | None = None
    """Deadline jobs: most on-demand instances held at once."""
    fastest_hours: float | None = None
    """Deadline jobs: hours the work takes on the largest allowed on-demand cluster (the
    all-on-demand time)."""

    def fraction_of_ideal(self, policy: str) -> float | None:
        """The policy's samples over ``ideal``'s (None when ideal trains nothing)."""
        if not self.ideal_samples:
            return None
        return float(self.runs[policy].samples / self.ideal_samples)

    def to_json(self) -> dict:
        """The ``--json`` document of ``liveput simulate`` (with a deadline: of ``liveput
        simulate --deadline-hours``)."""
        if self.deadline_hours is not None:
            return {
                "trace": self.trace,
                "model": self.model,
                "interval_s": self.interval_s,
                "deadline_hours": self.deadline_hours,
                "target_samples": self.target_samples,
                "on_demand_max": self.on_demand_max,
                "fastest_hours": self.fastest_hours,
                "policies": {name: run.summary() for name, run in self.runs.items()},
            }
        return {
            "trace": self.trace,
            "model": self.model,
            "interval_s": self.interval_s,
            "hours": self.hours,
            "policies": {name: run.summary(self.ideal_samples) for name, run in self.runs.items()},
        }
