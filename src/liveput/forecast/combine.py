"""CRPS-optimal weights of a forecast combination, on the simplex.

Notation. A baseline predictive CDF ``F_0`` (persistence) and ``k`` member CDFs ``F_1..F_k``
over the integer counts; the combination is ``F = F_0 + sum_j w_j (F_j - F_0)``, that is the
members weigh ``w_j`` and the baseline ``1 - sum_j w_j``. Against an outcome ``y``, with
``O_y(c) = 1[c >= y]`` and sums over counts ``c``:

    CRPS(w) = sum_c (F(c) - O_y(c))^2 = w' A w + 2 b' w + C,
    A_jl = sum_c (F_j - F_0)(F_l - F_0),   b_j = sum_c (F_j - F_0)(F_0 - O_y),

so summed over scored forecasts the total CRPS is quadratic in ``w`` (``A`` is a Gram matrix:
positive semi-definite, the problem is convex).

Problem. minimize ``w' A w + 2 b' w`` over ``w`` subject to
  (1) ``w_j >= 0`` for every member (no short positions: a combination of CDFs stays a CDF);
  (2) ``sum_j w_j <= 1`` (the baseline's weight is not negative).

Method. ``k`` is 1 or 2 in practice, so every active set is tried: for each non-empty subset
``S`` of members with (1) active outside ``S``, with and without (2) active, solve the
equality-constrained KKT system, keep the solutions that satisfy (1) and (2), and return the one
of least objective (``w = 0``, all weight on the baseline, included). For a convex problem the
optimum is the solution of its own active set, so this is exact.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np


def simplex_weights(gram: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """``argmin_w w' A w + 2 b' w`` subject to constraints (1) and (2) (module docstring);
    ``gram`` is ``A`` (k x k), ``linear`` is ``b`` (k)."""
    gram = np.asarray(gram, dtype=float)
    linear = np.asarray(linear, dtype=float)
    # Remembered by value: a simulation per candidate pool replays the same forecasts (advise
    # pool solved 68,400 of these, 17,100 of them distinct).
    return _remembered(gram.tobytes(), linear.tobytes(), len(linear)).copy()


@lru_cache(maxsize=1 << 15)  # a few MB; a pool simulation solves 17,100
def _remembered(gram_bytes: bytes, linear_bytes: bytes, members: int) -> np.ndarray:
    gram = np.frombuffer(gram_bytes).reshape(members, members)
    linear = np.frombuffer(linear_bytes)
    return _solve(gram, linear)


def _solve(gram: np.ndarray, linear: np.ndarray) -> np.ndarray:
    members = len(linear)
    if members == 1:  # closed form of the enumeration below: -b / A clipped to [0, 1]
        if gram[0, 0] != 0:
            return np.clip(-linear / gram[0, 0], 0.0, 1.0)
        return np.ones(1) if 2 * linear[0] < -1e-15 else np.zeros(1)
    best = np.zeros(members)
    best_value = 0.0
    for size in range(1, members + 1):
        for subset in combinations(range(members), size):
            index = list(subset)
            for weights in _stationary_points(gram[np.ix_(index, index)], linear[index]):
                if np.any(weights < -1e-12) or weights.sum() > 1 + 1e-12:  # (1), (2)
                    continue
                candidate = np.zeros(members)
                candidate[index] = np.clip(weights, 0.0, None)
                value = float(candidate @ gram @ candidate + 2 * linear @ candidate)
                if value < best_value - 1e-15:
                    best, best_value = candidate, value
    return best


def _stationary_points(gram: np.ndarray, linear: np.ndarray) -> list[np.ndarray]:
    """Minimizers on one active set: free (only (1) active outside it), and on ``sum w = 1``
    ((2) active). Singular systems take the least-squares solution."""
    size = len(linear)
    free = np.linalg.lstsq(gram, -linear, rcond=None)[0]
    kkt = np.zeros((size + 1, size + 1))
    kkt[:size, :size] = 2 * gram
    kkt[:size, size] = 1.0
    kkt[size, :size] = 1.0
    rhs = np.concatenate([-2 * linear, [1.0]])
    on_sum = np.linalg.lstsq(kkt, rhs, rcond=None)[0][:size]
    return [free, on_sum]
