"""Spot availability traces: formats, the trace type, resampling, generation, plots."""

from liveput.traces.trace import DEFAULT_INTERVAL_S, IntervalTrace, Trace

__all__ = ["DEFAULT_INTERVAL_S", "IntervalTrace", "Trace"]
