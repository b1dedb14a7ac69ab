"""The measured throughput table shipped as package data (source: data/SOURCES.md)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np


@dataclass(frozen=True)
class MeasuredConfigs:
    """Measured samples/s of the configurations of one model on p3.2xlarge."""

    model: str
    global_batch_size: int
    micro_batch_size: int
    data_parallel: np.ndarray
    pipeline_stages: np.ndarray
    samples_per_s: np.ndarray


@lru_cache(maxsize=1)
def measured_table() -> dict[str, MeasuredConfigs]:
    """Every model of ``measured_throughput_v100.csv``, by name."""
    text = resources.files("liveput.data").joinpath("measured_throughput_v100.csv").read_text()
    rows: dict[str, list[dict[str, str]]] = {}
    for row in csv.DictReader(text.splitlines()):
        rows.setdefault(row["model"], []).append(row)
    return {
        model: MeasuredConfigs(
            model=model,
            global_batch_size=int(group[0]["global_batch_size"]),
            micro_batch_size=int(group[0]["micro_batch_size"]),
            data_parallel=np.array([int(r["data_parallel"]) for r in group]),
            pipeline_stages=np.array([int(r["pipeline_stages"]) for r in group]),
            samples_per_s=np.array([float(r["samples_per_s"]) for r in group]),
        )
        for model, group in rows.items()
    }
