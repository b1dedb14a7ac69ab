"""The tables a paper prints: the models x traces x policies matrix (samples of each policy
relative to ``reactive`` and to ``ideal``, for every model on every trace), and for deadline
jobs deadlines x seeds x traces (dollars and deadlines met, each deadline a multiple of the
all-on-demand time)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from liveput.perf import load_profile
from liveput.perf.types import ModelProfile
from liveput.policies.deadline import DEADLINE_POLICY_NAMES
from liveput.policies.objective import JobObjective
from liveput.sim.config import SimulationConfig
from liveput.sim.deadline import all_on_demand_hours, simulate_deadline
from liveput.sim.engine import simulate
from liveput.sim.result import PolicyRun
from liveput.traces import IntervalTrace, generate_trace

SWEEP_MODELS = ("gpt-1.5b", "gpt-6.7b", "bert-large")
SWEEP_REGIMES = ("default", "calm", "volatile", "v100-like")


@dataclass(frozen=True)
class SweepRow:
    """One policy on one model and trace."""

    model: str
    """Model name."""
    trace: str
    """Trace name."""
    policy: str
    """Policy name."""
    samples: float
    """Samples trained."""
    cost_usd: float
    """Dollars paid."""
    vs_reactive: float | None
    """Samples over ``reactive``'s (None when reactive trains nothing or was not run)."""
    vs_ideal: float | None
    """Samples over ``ideal``'s (None when ideal trains nothing)."""


def default_sweep_traces(interval_s: float = 60.0, hours: float = 12.0) -> list[IntervalTrace]:
    """The project's own generated traces of the sweep: one per market regime."""
    return [
        generate_trace(
            16 if regime == "v100-like" else 32, hours, seed=index, regime=regime
        ).resample(interval_s)
        for index, regime in enumerate(SWEEP_REGIMES)
    ]


def sweep(
    models: Sequence[str],
    traces: Sequence[IntervalTrace],
    policies: Sequence[str],
    config: SimulationConfig | None = None,
    on_cell: Callable[[str, str], None] | None = None,
) -> list[SweepRow]:
    """Simulate every policy for every model on every trace."""
    config = config or SimulationConfig()
    profiles = {model: load_profile(model) for model in models}
    rows: list[SweepRow] = []
    for model, profile in profiles.items():
        for trace in traces:
            result = simulate(trace, profile, list(policies), config)
            reactive = result.runs["reactive"].samples if "reactive" in result.runs else 0.0
            for name, run in result.runs.items():
                rows.append(
                    SweepRow(
                        model=model,
                        trace=trace.name,
                        policy=name,
                        samples=run.samples,
                        cost_usd=run.cost_usd,
                        vs_reactive=run.samples / reactive if reactive > 0 else None,
                        vs_ideal=result.fraction_of_ideal(name),
                    )
                )
            if on_cell is not None:
                on_cell(model, trace.name)
    return rows


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

    @classmethod
    def of(
        cls, trace: str, factor: float, deadline_hours: float, seed: int, run: PolicyRun
    ) -> DeadlineSweepRow:
        """The row of a deadline job's run (one whose deadline fields are filled)."""
        if run.deadline_met is None or run.hours_late is None or run.usd_on_demand is None:
            raise ValueError(f"{run.policy}: not a deadline job's run")
        return cls(
            trace=trace,
            factor=factor,
            deadline_hours=deadline_hours,
            seed=seed,
            policy=run.policy,
            deadline_met=run.deadline_met,
            hours_late=run.hours_late,
            usd=run.cost_usd,
            usd_on_demand=run.usd_on_demand,
        )


def deadline_sweep(
    traces: Sequence[IntervalTrace],
    profile: ModelProfile,
    objective: JobObjective,
    factors: Sequence[float] = SWEEP_FACTORS,
    seeds: Sequence[int] = (0,),
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
                result = simulate_deadline(
                    trace, profile, job, policies, dataclasses.replace(config, seed=seed)
                )
                rows += [
                    DeadlineSweepRow.of(trace.name, factor, job.deadline_hours, seed, run)
                    for run in result.runs.values()
                ]
                if on_cell is not None:
                    on_cell(trace.name, factor, seed)
    return rows
