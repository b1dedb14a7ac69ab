"""Spot availability traces: formats, the trace type, resampling, generation, plots."""

from liveput.traces.formats import FORMATS, read_trace, write_trace
from liveput.traces.generator import REGIMES, generate_trace
from liveput.traces.stats import trace_stats
from liveput.traces.trace import DEFAULT_INTERVAL_S, IntervalTrace, Trace

__all__ = [
    "DEFAULT_INTERVAL_S",
    "FORMATS",
    "REGIMES",
    "IntervalTrace",
    "Trace",
    "generate_trace",
    "read_trace",
    "trace_stats",
    "write_trace",
]
