"""Results of a deadline simulation: one :class:`DeadlineRun` per deadline policy, gathered in a
:class:`DeadlineResult` (its ``to_json`` is ``liveput simulate --deadline-hours ... --json``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class DeadlineRun:
    """One deadline policy replayed on one trace until its work was done (or the cap)."""

    policy: str
    """Policy name."""
    deadline_met: bool
    """Whether the work was done by the deadline."""
    hours_late: float
    """Hours after the deadline the work was done (0 when met; to the cap when unfinished)."""
    finished_hours: float | None
    """Hours from the start to the end of the work (None: unfinished at the cap)."""
    usd: float
    """Dollars paid: ``usd_spot + usd_on_demand``."""
    usd_spot: float
    """Dollars paid for spot instance-seconds."""
    usd_on_demand: float
    """Dollars paid for on-demand instance-seconds, grant to release."""
    on_demand_hours: float
    """On-demand instance-hours paid."""
    samples: float
    """Samples trained."""
    interval_s: float = 60.0
    """Length of an interval, seconds."""
    spot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Spot instances kept in each interval."""
    on_demand: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """On-demand instances running in each interval."""
    data_parallel: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """D run at the start of each interval (0: nothing)."""
    pipeline_stages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """P run at the start of each interval (0: nothing)."""
    cumulative_samples: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Samples trained by the end of each interval (or the finish)."""
    cumulative_usd: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Dollars paid by the end of each interval (or the finish)."""
    on_demand_ledger: tuple[tuple[float, float], ...] = ()
    """(grant, release) seconds of every on-demand instance: what was billed."""

    def summary(self) -> dict[str, float | bool | None]:
        """The figures of ``--json``."""
        return {
            "deadline_met": self.deadline_met,
            "hours_late": self.hours_late,
            "finished_hours": self.finished_hours,
            "usd": self.usd,
            "usd_spot": self.usd_spot,
            "usd_on_demand": self.usd_on_demand,
            "on_demand_hours": self.on_demand_hours,
            "samples": self.samples,
        }


@dataclass(frozen=True)
class DeadlineResult:
    """Every deadline policy on the same job and trace."""

    trace: str
    """Trace name."""
    model: str
    """Model name."""
    interval_s: float
    """Length of an interval, seconds."""
    deadline_hours: float
    """The job's deadline, hours from its start."""
    target_samples: float
    """The job's work, samples."""
    on_demand_max: int
    """Most on-demand instances held at once."""
    fastest_hours: float
    """Hours the work takes on the largest allowed on-demand cluster (the all-on-demand time)."""
    runs: dict[str, DeadlineRun]
    """Each policy's run, by name, in the order asked."""

    def to_json(self) -> dict:
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
