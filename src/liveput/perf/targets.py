"""The names of the built-in profile targets, apart from the profiler (on torch) that builds
them: ``liveput models`` lists them, and importing torch took most of that command's time."""

from __future__ import annotations

TARGET_NAMES = ("tiny-gpt",)
"""The keys of :data:`liveput.perf.profiler.TARGETS`."""
