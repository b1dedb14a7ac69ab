"""The models x traces x policies matrix: the table a paper prints (samples of each policy
relative to ``reactive`` and to ``ideal``, for every model on every trace)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from liveput.perf import load_profile
from liveput.sim.config import SimulationConfig
from liveput.sim.engine import simulate
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
    return [generate_trace(16 if regime == "v100-like" else 32, hours, seed=index, regime=regime)
            .resample(interval_s) for index, regime in enumerate(SWEEP_REGIMES)]


def sweep(models: Sequence[str], traces: Sequence[IntervalTrace], policies: Sequence[str],
          config: SimulationConfig | None = None,
          on_cell: Callable[[str, str], None] | None = None) -> list[SweepRow]:
    """Simulate every policy for every model on every trace."""
    config = config or SimulationConfig()
    profiles = {model: load_profile(model) for model in models}
    rows: list[SweepRow] = []
    for model, profile in profiles.items():
        for trace in traces:
            result = simulate(trace, profile, list(policies), config)
            reactive = result.runs["reactive"].samples if "reactive" in result.runs else 0.0
            for name, run in result.runs.items():
                rows.append(SweepRow(
                    model=model, trace=trace.name, policy=name, samples=run.samples,
                    cost_usd=run.cost_usd,
                    vs_reactive=run.samples / reactive if reactive > 0 else None,
                    vs_ideal=result.fraction_of_ideal(name)))
            if on_cell is not None:
                on_cell(model, trace.name)
    return rows
