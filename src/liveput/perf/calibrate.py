"""Fit the per-model constants of the iteration-time formula to the measured table.

The formula is linear in its constants (alpha, c, beta, d), so we solve a non-negative least
squares problem on *relative* errors (each row divided by the measured iteration time), which is
what the MAPE target weighs. Run ``python -m liveput.perf.calibrate`` to rewrite
``data/perf_calibration.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
from scipy.optimize import lsq_linear

from liveput.perf.builtin import builtin_profile
from liveput.perf.estimator import Calibration, iteration_features
from liveput.perf.measured import measured_table
from liveput.perf.partition import partition_table

COMPUTE_SCALE_BOUNDS = (0.5, 4.0)
"""Allowed range of alpha (measured / derived compute time)."""


def fit_calibration(model: str) -> Calibration:
    """Least-squares constants of ``model`` against its measured configurations."""
    measured = measured_table()[model]
    profile = builtin_profile(model)
    table = partition_table(profile, int(measured.pipeline_stages.max()))
    features = iteration_features(profile, table, measured.data_parallel, measured.pipeline_stages)
    iteration_s = measured.global_batch_size / measured.samples_per_s
    weights = 1.0 / iteration_s
    # The derived compute time may be off by a constant factor, not by orders of magnitude: a
    # bounded scale keeps compute in the model where few or noisy points would let overheads
    # explain everything (GPT-6.7B has 10 points, VGG-19's are non-monotone).
    lower = [COMPUTE_SCALE_BOUNDS[0], 0.0, 0.0, 0.0, 0.0]
    upper = [COMPUTE_SCALE_BOUNDS[1], np.inf, np.inf, np.inf, np.inf]
    solution = lsq_linear(features * weights[:, None], iteration_s * weights,
                          bounds=(lower, upper)).x
    alpha, gamma, slot_s, beta, fixed_s = (float(v) for v in solution)
    return Calibration(compute_scale=alpha, transfer_scale=gamma, slot_overhead_s=slot_s,
                       allreduce_scale=beta, iteration_overhead_s=fixed_s)


def main() -> None:
    fitted = {model: asdict(fit_calibration(model)) for model in sorted(measured_table())}
    path = Path(__file__).resolve().parents[1] / "data" / "perf_calibration.json"
    path.write_text(json.dumps(fitted, indent=2) + "\n")


if __name__ == "__main__":
    main()
