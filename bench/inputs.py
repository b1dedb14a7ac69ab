"""The benchmarks' inputs committed in the repository: the real traces of ``data/traces/``
(their public sources in ``data/README.md``)."""

from __future__ import annotations

import sys
from pathlib import Path

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
P3_TRACE = "aws-p3-32node.events.csv"
"""32 p3.2xlarge instances, 11.4 h (the Bamboo and Parcae trace)."""
V100_TRACE = "aws-v100-16node-us-west-2a.json"
"""16 p3.2xlarge instances in us-west-2a, 16 days (SkyPilot's spot traces)."""


def real_trace(name: str) -> Path:
    """The path of the committed real trace ``name``. A missing one ends the benchmark with a
    one-line message and exit status 1: its figures would be incomplete, so it never skips."""
    path = TRACES / name
    if not path.is_file():
        sys.exit(f"bench: input {path} is missing (data/README.md lists the committed inputs)")
    return path
