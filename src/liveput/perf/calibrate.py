"""Fit the per-model constants of the iteration-time formula to the measured table.

The accuracy target is the mean absolute percentage error of throughput, so that is what we
minimize. With measured iteration times ``T_k`` (s), the formula's feature rows ``f_k`` and its
constants ``theta = (alpha, gamma, c, beta, d)`` (``estimator.iteration_features``), the
prediction is ``T_hat_k = f_k . theta`` and the throughput error of row k is
``|B / T_hat_k - B / T_k| / (B / T_k) = |T_k / T_hat_k - 1|``:

    minimize    MAPE(theta) = (1 / K) sum_k |T_k / (f_k . theta) - 1|
    subject to  (1) 0.5 <= alpha <= 4   (derived compute time is off by a factor, not by orders)
                (2) gamma, c, beta, d >= 0

MAPE is not convex in theta, so we start from two convex fits, non-negative least squares of
relative iteration-time errors (``scipy.optimize.lsq_linear``) and least absolute relative
iteration-time error (a linear program, HiGHS), and refine each by Nelder-Mead on a
reparametrization that keeps (1) and (2) (a logistic for alpha, exponentials for the rest).
Least squares alone lets a few noisy rows (ResNet-152's (1, 10) runs at a fifth of its
neighbours) drag every prediction. Run ``python -m liveput.perf.calibrate`` to rewrite
``data/perf_calibration.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from liveput.perf.builtin import builtin_profile
from liveput.perf.estimator import Calibration, iteration_features
from liveput.perf.measured import measured_table
from liveput.perf.partition import partition_table

COMPUTE_SCALE_BOUNDS = (0.5, 4.0)
"""Constraint (1): allowed range of alpha (measured / derived compute time)."""
TINY = 1e-12
"""Floor of the non-negative constants in log space (a constant this small is zero)."""


def throughput_mape(
    features: np.ndarray,
    iteration_s: np.ndarray,
    theta: np.ndarray,
    offset_s: np.ndarray | float = 0.0,
) -> float:
    """Mean absolute percentage error of the throughput predicted with ``theta`` (plus the
    seconds ``offset_s`` of constants held fixed)."""
    predicted_s = features @ theta + offset_s
    return float(np.mean(np.abs(iteration_s / np.maximum(predicted_s, TINY) - 1)))


def _least_squares(
    features: np.ndarray,
    iteration_s: np.ndarray,
    offset_s: np.ndarray | float = 0.0,
    bounds: tuple[float, float] = COMPUTE_SCALE_BOUNDS,
) -> np.ndarray:
    # scipy.optimize in the fits, not at import: a coordinator imports this module (its online
    # re-fit) and most jobs end before they fit anything (the import is about 0.3 CPU-s).
    from scipy.optimize import lsq_linear

    width = features.shape[1]
    lower = [bounds[0]] + [0.0] * (width - 1)
    upper = [bounds[1]] + [np.inf] * (width - 1)
    weights = 1.0 / iteration_s
    return lsq_linear(
        features * weights[:, None], (iteration_s - offset_s) * weights, bounds=(lower, upper)
    ).x


def _least_absolute(
    features: np.ndarray,
    iteration_s: np.ndarray,
    offset_s: np.ndarray | float = 0.0,
    bounds: tuple[float, float] = COMPUTE_SCALE_BOUNDS,
) -> np.ndarray:
    """min (1/K) sum e_k  s.t.  -e_k <= (f_k . theta + o_k) / T_k - 1 <= e_k, with (1), (2)."""
    from scipy.optimize import linprog

    rows, width = features.shape
    relative = features / iteration_s[:, None]
    identity = np.eye(rows)
    free = 1 - offset_s / iteration_s
    result = linprog(
        np.concatenate([np.zeros(width), np.full(rows, 1.0 / rows)]),
        A_ub=np.block([[relative, -identity], [-relative, -identity]]),
        b_ub=np.concatenate([free, -free]),
        bounds=[bounds] + [(0.0, None)] * (width - 1 + rows),
        method="highs",
    )
    return result.x[:width]


def _to_theta(z: np.ndarray, bounds: tuple[float, float] = COMPUTE_SCALE_BOUNDS) -> np.ndarray:
    low, high = bounds
    alpha = low + (high - low) / (1 + np.exp(-z[0]))
    return np.concatenate([[alpha], np.exp(z[1:])])


def _to_z(theta: np.ndarray, bounds: tuple[float, float] = COMPUTE_SCALE_BOUNDS) -> np.ndarray:
    low, high = bounds
    share = np.clip((theta[0] - low) / (high - low), 1e-6, 1 - 1e-6)
    return np.concatenate([[np.log(share / (1 - share))], np.log(np.maximum(theta[1:], TINY))])


def fit_constants(
    features: np.ndarray,
    iteration_s: np.ndarray,
    offset_s: np.ndarray | None = None,
    compute_scale_bounds: tuple[float, float] = COMPUTE_SCALE_BOUNDS,
) -> np.ndarray:
    """theta minimizing the throughput MAPE (module docstring), deterministic.

    ``features`` may hold a subset of the formula's columns, alpha's first (constraint (1)
    bounds the first constant, to ``compute_scale_bounds``); ``offset_s`` are the seconds of
    each row that the constants held fixed contribute (the online fit, ``perf.online``)."""
    from scipy.optimize import minimize

    offset = np.zeros(len(iteration_s)) if offset_s is None else np.asarray(offset_s, float)
    bounds = compute_scale_bounds
    best = _least_squares(features, iteration_s, offset, bounds)
    for start in (best, _least_absolute(features, iteration_s, offset, bounds)):
        refined = minimize(
            lambda z: throughput_mape(features, iteration_s, _to_theta(z, bounds), offset),
            _to_z(start, bounds),
            method="Nelder-Mead",
            options={"maxiter": 20000, "xatol": 1e-7, "fatol": 1e-10},
        )
        for candidate in (start, _to_theta(refined.x, bounds)):
            if throughput_mape(features, iteration_s, candidate, offset) < throughput_mape(
                features, iteration_s, best, offset
            ):
                best = candidate
    return best


def fit_calibration(model: str) -> Calibration:
    """Constants of ``model`` minimizing its throughput MAPE on the measured configurations."""
    measured = measured_table()[model]
    profile = builtin_profile(model)
    table = partition_table(profile, int(measured.pipeline_stages.max()))
    features = iteration_features(profile, table, measured.data_parallel, measured.pipeline_stages)
    iteration_s = measured.global_batch_size / measured.samples_per_s
    alpha, gamma, slot_s, beta, fixed_s = (float(v) for v in fit_constants(features, iteration_s))
    return Calibration(
        compute_scale=alpha,
        transfer_scale=gamma,
        slot_overhead_s=slot_s,
        allreduce_scale=beta,
        iteration_overhead_s=fixed_s,
    )


def mape_floor(model: str) -> float:
    """A floor under the MAPE of *any* partition and constants of the estimator's formula.

    At one depth P, whatever the cut and the constants, T(D, P) = slots(D) * s_P + ring(D) * A_P
    + F_P with s_P > 0 and A_P, F_P >= 0 (compute, transfer and slot overhead are per slot; the
    all-reduce scales with ring(D) = 2 (D - 1) / D; optimizer and fixed costs do not depend on
    D). So for D' > D the predicted speed-up T(D) / T(D') lies between min(1, ring(D) /
    ring(D')) and slots(D) / slots(D'). A measured speed-up q outside [lo, hi] forces the two
    rows' absolute relative errors to sum to at least 1 - hi / q (or 1 - q / lo); summed over
    disjoint pairs and divided by the row count, that bounds the MAPE from below.
    """
    measured = measured_table()[model]
    data_parallel, stages = measured.data_parallel, measured.pipeline_stages
    samples_per_s = measured.samples_per_s
    micro = measured.global_batch_size / (data_parallel * measured.micro_batch_size)
    slots = micro + stages - 1
    ring = 2 * (data_parallel - 1) / data_parallel
    forced = []
    for i in range(len(stages)):
        for j in range(len(stages)):
            if stages[i] != stages[j] or data_parallel[j] <= data_parallel[i]:
                continue
            high = slots[i] / slots[j]
            low = min(1.0, ring[i] / ring[j])
            speedup = samples_per_s[j] / samples_per_s[i]
            error = (
                1 - high / speedup
                if speedup > high
                else 1 - speedup / low
                if speedup < low
                else 0.0
            )
            if error > 0:
                forced.append((error, i, j))
    used: set[int] = set()
    total = 0.0
    for error, i, j in sorted(forced, reverse=True):
        if i not in used and j not in used:
            used |= {i, j}
            total += error
    return total / len(stages)


def main() -> None:
    fitted = {model: asdict(fit_calibration(model)) for model in sorted(measured_table())}
    path = Path(__file__).resolve().parents[1] / "data" / "perf_calibration.json"
    path.write_text(json.dumps(fitted, indent=2) + "\n")


if __name__ == "__main__":
    main()
