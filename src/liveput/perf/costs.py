"""Migration cost model: what moving training state between configurations costs, in seconds.

- ``transfer_s(bytes)``: peer-to-peer transfer, interpolated (log-log) on the measured 10 Gb/s
  table (``data/p2p_transfer_10gbps.csv``: about 1.2 s per GB), scaled by 10 / bandwidth.
- ``rebuild_s(n)``: rendezvous and communication-group rebuild of n instances,
  ``rebuild_base_s + rebuild_per_node_s * n`` (about 2 s for GPT-1.5B at (4, 8), Parcae paper).
- ``restart_s(n)``: a full restart of n instances, interpolated on the measured V100 table
  (``data/restart_cost_v100.csv``: 29 s to 43 s).
- ``checkpoint_save_s(bytes)`` / ``checkpoint_load_s(bytes)``: ``latency_s + bytes / bandwidth`` to
  remote storage; defaults reproduce the about 14 s to save and load GPT-1.5B's state that the
  Parcae paper reports for its reactive baseline (18 GB of state at ~2.6 GB/s each way + 0.5 s).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.types import ModelProfile


@cache
def _table(name: str) -> tuple[np.ndarray, np.ndarray]:
    text = resources.files("liveput.data").joinpath(name).read_text()
    rows = list(csv.reader(text.splitlines()))[1:]
    return np.array([float(r[0]) for r in rows]), np.array([float(r[1]) for r in rows])


@dataclass(frozen=True)
class MigrationCostModel:
    """Costs of moving state, in seconds (module docstring gives the formulas)."""

    network_gbps: float = 10.0
    """Bandwidth between instances, Gb/s (the p2p table is scaled from 10 Gb/s)."""
    rebuild_base_s: float = 1.5
    """Fixed part of a communication-group rebuild, s."""
    rebuild_per_node_s: float = 0.016
    """Per-instance part of a rebuild, s."""
    checkpoint_bandwidth_bytes_per_s: float = 2.6e9
    """Checkpoint storage bandwidth, bytes/s, each way."""
    checkpoint_latency_s: float = 0.5
    """Fixed latency of a checkpoint save or load, s."""
    measured_restart_s: float | None = None
    """A restart's seconds as measured on the machine that runs the job (``bench runtime``),
    whatever the instance count; None: the V100 table."""

    def __post_init__(self) -> None:
        if self.network_gbps <= 0 or self.checkpoint_bandwidth_bytes_per_s <= 0:
            raise LiveputError("migration cost model: bandwidths must be positive")
        if self.measured_restart_s is not None and not self.measured_restart_s >= 0:
            raise LiveputError(
                "migration cost model: a measured restart must be >= 0 s, got "
                f"{self.measured_restart_s}"
            )

    @classmethod
    def from_profile(cls, profile: ModelProfile) -> MigrationCostModel:
        return cls(network_gbps=profile.instance_type.network_gbps)

    def transfer_s(self, num_bytes: float) -> float:
        if num_bytes <= 0:
            return 0.0
        sizes, micros = _table("p2p_transfer_10gbps.csv")
        scale = 10.0 / self.network_gbps
        if num_bytes > sizes[-1]:
            per_byte = micros[-1] / sizes[-1]
            return float(num_bytes * per_byte * 1e-6 * scale)
        log_us = np.interp(np.log(num_bytes), np.log(sizes), np.log(micros))
        return float(np.exp(log_us) * 1e-6 * scale)

    def rebuild_s(self, num_nodes: int) -> float:
        return self.rebuild_base_s + self.rebuild_per_node_s * max(num_nodes, 0)

    def restart_s(self, num_nodes: int) -> float:
        if self.measured_restart_s is not None:
            return self.measured_restart_s
        nodes, seconds = _table("restart_cost_v100.csv")
        return float(np.interp(max(num_nodes, 1), nodes, seconds))

    def checkpoint_save_s(self, num_bytes: float) -> float:
        return self.checkpoint_latency_s + num_bytes / self.checkpoint_bandwidth_bytes_per_s

    def checkpoint_load_s(self, num_bytes: float) -> float:
        return self.checkpoint_latency_s + num_bytes / self.checkpoint_bandwidth_bytes_per_s
