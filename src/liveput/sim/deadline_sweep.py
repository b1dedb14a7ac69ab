"""Deadlines x seeds x traces: the table a paper prints for deadline policies (dollars and
deadlines met, each deadline a multiple of the all-on-demand time)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from liveput.perf.types import ModelProfile
from liveput.policies.deadline import DEADLINE_POLICY_NAMES
from liveput.policies.objective import JobObjective
from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import all_on_demand_hours, simulate_deadline
from liveput.traces import IntervalTrace

SWEEP_FACTORS = (1.1, 1.3, 1.5, 2.0)
"""Deadlines of ``liveput simulate --sweep`` with a job: multiples of the all-on-demand time."""


@dataclass(frozen=True)
class DeadlineSweepRow:
    """One policy on one trace, deadline and seed."""

    trace: str
    """Trace name."""
    factor: float
    """The deadline over the all-on-demand time."""
    deadline_hours: float
    """The deadline, hours."""
    seed: int
    """Seed of the losses and launch delays."""
    policy: str
    """Policy name."""
    deadline_met: bool
    """Whether the work was done by the deadline."""
    hours_late: float
    """Hours after the deadline (0 when met)."""
    usd: float
    """Dollars paid."""
    usd_on_demand: float
    """Of which on-demand."""


def deadline_sweep(traces: Sequence[IntervalTrace], profile: ModelProfile, objective: JobObjective,
                   factors: Sequence[float] = SWEEP_FACTORS, seeds: Sequence[int] = (0,),
                   policies: Sequence[str] = DEADLINE_POLICY_NAMES,
                   config: SimulationConfig | None = None,
                   on_cell: Callable[[str, float, int], None] | None = None,
                   ) -> list[DeadlineSweepRow]:
    """Every policy on every trace, deadline (``factor x`` the all-on-demand time) and seed; the
    objective gives the work, budget and on-demand cap (its deadline is replaced)."""
    config = config or SimulationConfig()
    rows: list[DeadlineSweepRow] = []
    for trace in traces:
        base_hours = all_on_demand_hours(trace, profile, objective, config)
        for factor in factors:
            job = dataclasses.replace(objective, deadline_hours=factor * base_hours)
            for seed in seeds:
                result = simulate_deadline(trace, profile, job, policies,
                                           dataclasses.replace(config, seed=seed))
                for name, run in result.runs.items():
                    rows.append(DeadlineSweepRow(
                        trace=trace.name, factor=factor, deadline_hours=job.deadline_hours,
                        seed=seed, policy=name, deadline_met=run.deadline_met,
                        hours_late=run.hours_late, usd=run.usd,
                        usd_on_demand=run.usd_on_demand))
                if on_cell is not None:
                    on_cell(trace.name, factor, seed)
    return rows
