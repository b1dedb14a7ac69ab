"""The performance model re-fitted to the step times the runtime measures (online calibration).

A running job measures the iteration time ``T_k`` of each configuration ``(D_k, P_k)`` it runs
(``runtime.step_times``). :func:`fit_online` is a pure function from those measurements to the
estimator's constants, by the same fit as the built-in models' (``calibrate.fit_constants``,
which minimizes the throughput MAPE). Notation as in ``estimator`` and ``calibrate``: feature
rows ``f_k`` (``iteration_features``), constants ``theta = (alpha, gamma, c, beta, d)``, the
prior constants ``theta0`` (the job's calibration before any measurement).

A few configurations cannot pin five constants, so only a set F of them is fitted and the rest
keep their prior values:

    minimize    (1 / K) sum_k |T_k / (f_k[F] . theta[F] + f_k[~F] . theta0[~F]) - 1|
    subject to  (1') 0.001 <= alpha <= 1000,   (2) theta[F] >= 0

(1') is wider than the built-in tables' (1), 0.5 <= alpha <= 4: their layer times are derived
from FLOPs, here they were measured on this machine, and the measurements are the truth when a
profile was taken while the machine was busy (on this shared 2-core machine a fresh profile of
the same layers came out 1x and 17x slower in two runs minutes apart).

F takes the constants in the order alpha (compute), d (fixed per iteration), c (per slot),
beta (all-reduce), gamma (boundary transfer), skipping any whose column the measured rows cannot
tell from those already taken (beta while only D = 1 ran, gamma while only P = 1 ran or, for a
transformer, whose boundary activation is the same at every cut, gamma beside c), and holds
``K - 1`` of them (none when one configuration ran, at most all five): fewer constants than
measured configurations, so the fit is checked by more than it explains. One configuration
measured tells nothing about how the others compare with it, so it leaves every prediction at
the prior's: a single measured 1x1 that fitted alpha alone once made one instance look as fast
as two.

A constant that the fit drives to its bound (alpha to either end of (1'), another to 0) is one
the data cannot pin either: the measurements are explained only by an extreme that nothing else
supports (a busy machine measuring 1x1 as slow as 2x1 makes alpha tiny and d the whole step).
That constant goes back to its prior, leaves F, and the rest are fitted again, until no fitted
constant is at a bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from liveput.errors import LiveputError
from liveput.perf.calibrate import fit_constants, throughput_mape
from liveput.perf.estimator import Calibration, calibration_for, iteration_features
from liveput.perf.partition import partition_table
from liveput.perf.types import Measurement, ModelProfile

__all__ = [
    "FIT_ORDER",
    "Measurement",
    "fit_online",
    "free_constants",
    "measured_features",
    "prediction_mape",
    "refit",
]

ONLINE_COMPUTE_SCALE_BOUNDS = (1e-3, 1e3)
"""Constraint (1'): the range of alpha the online fit may choose."""
FIT_ORDER = (0, 4, 2, 3, 1)
"""Indices into theta, in the order constants become free: alpha, d, c, beta, gamma."""


def _theta(calibration: Calibration) -> np.ndarray:
    return np.array(
        [
            calibration.compute_scale,
            calibration.transfer_scale,
            calibration.slot_overhead_s,
            calibration.allreduce_scale,
            calibration.iteration_overhead_s,
        ]
    )


def _calibration(theta: np.ndarray) -> Calibration:
    alpha, gamma, slot_s, beta, fixed_s = (float(v) for v in theta)
    return Calibration(
        compute_scale=alpha,
        transfer_scale=gamma,
        slot_overhead_s=slot_s,
        allreduce_scale=beta,
        iteration_overhead_s=fixed_s,
    )


def measured_features(profile: ModelProfile, measurements: Sequence[Measurement]) -> np.ndarray:
    """The formula's feature rows of the measured configurations, shape (K, 5)."""
    data_parallel = np.array([m.data_parallel for m in measurements])
    stages = np.array([m.pipeline_stages for m in measurements])
    if stages.max() > profile.num_layers:
        raise LiveputError(
            f"measurement with P = {stages.max()} > the model's {profile.num_layers} layers"
        )
    table = partition_table(profile, int(stages.max()))
    return iteration_features(profile, table, data_parallel, stages)


def free_constants(features: np.ndarray) -> list[int]:
    """F of the module docstring: the theta indices fitted, ascending (alpha first)."""
    # Columns scaled to unit length, so the rank test does not depend on their units.
    scaled = features / np.maximum(np.linalg.norm(features, axis=0), 1e-300)
    identifiable: list[int] = []
    for index in FIT_ORDER:
        trial = identifiable + [index]
        if np.linalg.matrix_rank(scaled[:, trial], tol=1e-9) == len(trial):
            identifiable = trial
    count = max(0, min(len(features) - 1, len(identifiable)))
    return sorted(identifiable[:count])


BOUND_MARGIN = 1e-3
"""How close (relative) to a bound of (1') alpha may come before it counts as at the bound."""
NEGLIGIBLE_SHARE = 1e-6
"""A non-negative constant whose seconds are below this share of every measured step is 0."""


def _at_bound(theta: np.ndarray, index: int, features: np.ndarray, iteration_s: np.ndarray) -> bool:
    if index == 0:
        low, high = ONLINE_COMPUTE_SCALE_BOUNDS
        return bool(theta[0] <= low * (1 + BOUND_MARGIN) or theta[0] >= high / (1 + BOUND_MARGIN))
    seconds = features[:, index] * theta[index]
    return bool(np.all(seconds <= NEGLIGIBLE_SHARE * iteration_s))


def fit_online(
    profile: ModelProfile, measurements: Sequence[Measurement], prior: Calibration | None = None
) -> Calibration:
    """The constants that best explain ``measurements`` (module docstring); ``prior`` when
    there are none. Several measurements of one configuration count as one, their
    step-weighted mean."""
    prior = prior or Calibration()
    pooled: dict[tuple[int, int], tuple[float, int]] = {}
    for m in measurements:
        total_s, steps = pooled.get((m.data_parallel, m.pipeline_stages), (0.0, 0))
        pooled[(m.data_parallel, m.pipeline_stages)] = (
            total_s + m.iteration_s * m.steps,
            steps + m.steps,
        )
    rows = [
        Measurement(d, p, total_s / steps, steps)
        for (d, p), (total_s, steps) in sorted(pooled.items())
    ]
    if not rows:
        return prior
    features = measured_features(profile, rows)
    iteration_s = np.array([m.iteration_s for m in rows])
    prior_theta = _theta(prior)
    free = free_constants(features)
    while True:
        theta = prior_theta.copy()
        if not free:
            return prior
        fixed = [i for i in range(len(theta)) if i not in free]
        offset_s = features[:, fixed] @ theta[fixed]
        theta[free] = _fit(features[:, free], iteration_s, offset_s, free)
        pinned = [i for i in free if _at_bound(theta, i, features, iteration_s)]
        if not pinned:
            return _calibration(theta)
        free = [i for i in free if i not in pinned]


def _fit(
    features: np.ndarray, iteration_s: np.ndarray, offset_s: np.ndarray, free: list[int]
) -> np.ndarray:
    """``fit_constants`` on the free columns. It bounds its first column as alpha, so with alpha
    held at its prior a column of zeros stands in for alpha's (its value moves nothing)."""
    if free[0] == 0:
        return fit_constants(features, iteration_s, offset_s, ONLINE_COMPUTE_SCALE_BOUNDS)
    padded = np.column_stack([np.zeros(len(features)), features])
    return fit_constants(padded, iteration_s, offset_s, ONLINE_COMPUTE_SCALE_BOUNDS)[1:]


def refit(profile: ModelProfile, measurements: Sequence[Measurement]) -> Calibration:
    """The constants a job plans with once it has measured ``measurements``: the fit from the
    job's own prior (``estimator.calibration_for``; the runtime's coordinator, and the
    simulator when it does what the coordinator does)."""
    return fit_online(profile, measurements, calibration_for(profile.model))


def prediction_mape(
    profile: ModelProfile, measurements: Sequence[Measurement], calibration: Calibration
) -> float:
    """Throughput MAPE of ``calibration`` on ``measurements`` (a fraction)."""
    features = measured_features(profile, measurements)
    iteration_s = np.array([m.iteration_s for m in measurements])
    return throughput_mape(features, iteration_s, _theta(calibration))
