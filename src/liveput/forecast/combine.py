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

from collections import OrderedDict
from itertools import combinations

import numpy as np
from numpy.linalg import LinAlgError, _umath_linalg

REMEMBERED = 1 << 15
"""Solutions remembered by value, a few MB: a simulation per candidate pool replays the same
forecasts (advise pool solved 68,400 of these, 17,100 of them distinct)."""

_remembered: OrderedDict[bytes, np.ndarray] = OrderedDict()


def simplex_weights(gram: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """``argmin_w w' A w + 2 b' w`` subject to constraints (1) and (2) (module docstring);
    ``gram`` is ``A`` (k x k), ``linear`` is ``b`` (k)."""
    gram = np.asarray(gram, dtype=float)
    linear = np.asarray(linear, dtype=float)
    return simplex_weights_stack(gram[np.newaxis], linear[np.newaxis])[0]


def simplex_weights_stack(grams: np.ndarray, linears: np.ndarray) -> np.ndarray:
    """Row t is ``simplex_weights(grams[t], linears[t])``; ``grams`` is (T, k, k), ``linears``
    (T, k). The problems not remembered are solved together."""
    grams = np.ascontiguousarray(grams, dtype=float)
    linears = np.ascontiguousarray(linears, dtype=float)
    weights = np.empty(linears.shape)
    keys = [grams[t].tobytes() + linears[t].tobytes() for t in range(len(linears))]
    unsolved = []
    for t, key in enumerate(keys):
        known = _remembered.get(key)
        if known is None:
            unsolved.append(t)
        else:
            _remembered.move_to_end(key)
            weights[t] = known
    if unsolved:
        solved = _solve(grams[unsolved], linears[unsolved])
        for t, solution in zip(unsolved, solved):
            weights[t] = solution
            _remembered[keys[t]] = solution.copy()
        while len(_remembered) > REMEMBERED:
            _remembered.popitem(last=False)
    return weights


def _solve(grams: np.ndarray, linears: np.ndarray) -> np.ndarray:
    """Row t: the problem of ``grams[t]``, ``linears[t]``. Every row's candidates are weighed
    together, in the order a loop over one problem would weigh them (active sets by size, the
    free point before the one on the sum), so each row keeps the first of equal optima."""
    count, members = linears.shape
    if members == 1:  # closed form of the enumeration below: -b / A clipped to [0, 1]
        return _solve_one_member(grams[:, 0, 0], linears[:, 0])[:, np.newaxis]
    best = np.zeros((count, members))
    best_value = np.zeros(count)
    for size in range(1, members + 1):
        for subset in combinations(range(members), size):
            index = list(subset)
            for weights in _stationary_points(grams[:, index][:, :, index], linears[:, index]):
                # (1), (2) above. NaN weights pass (as they did one row at a time) and lose on
                # value.
                kept = ~np.any(weights < -1e-12, axis=1) & ~(weights.sum(axis=1) > 1 + 1e-12)
                candidates = np.zeros((count, members))
                candidates[:, index] = np.clip(weights, 0.0, None)
                values = _objective(grams, linears, candidates)
                better = kept & (values < best_value - 1e-15)
                best[better], best_value[better] = candidates[better], values[better]
    return best


def _objective(grams: np.ndarray, linears: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Row t: ``w @ A @ w + 2 * b @ w`` with ``w = weights[t]``, through the same matrix
    products one row's expression makes (stacked ``matmul`` runs the same kernel per row), so
    equal to it to the bit."""
    rows = weights[:, np.newaxis, :]
    columns = weights[:, :, np.newaxis]
    quadratic = np.matmul(np.matmul(rows, grams), columns)[:, 0, 0]
    return quadratic + np.matmul((2 * linears)[:, np.newaxis, :], columns)[:, 0, 0]


def _solve_one_member(gram: np.ndarray, linear: np.ndarray) -> np.ndarray:
    """Row t: the one member's weight for ``A = gram[t]``, ``b = linear[t]`` (scalars)."""
    solvable = gram != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.clip(-linear / np.where(solvable, gram, 1.0), 0.0, 1.0)
    return np.where(solvable, ratio, np.where(2 * linear < -1e-15, 1.0, 0.0))


def _stationary_points(grams: np.ndarray, linears: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row t of each: the minimizers of problem t on one active set, free (only (1) active
    outside it) and on ``sum w = 1`` ((2) active). Singular systems take the least-squares
    solution."""
    count, size = linears.shape
    free = _least_squares(grams, -linears)
    kkt = np.zeros((count, size + 1, size + 1))
    kkt[:, :size, :size] = 2 * grams
    kkt[:, :size, size] = 1.0
    kkt[:, size, :size] = 1.0
    rhs = np.concatenate([-2 * linears, np.ones((count, 1))], axis=1)
    on_sum = np.ascontiguousarray(_least_squares(kkt, rhs)[:, :size])
    return free, on_sum


def _least_squares(matrices: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Row t: ``np.linalg.lstsq(matrices[t], vectors[t], rcond=None)[0]``, to the bit
    (tests/test_forecast.py checks it; numpy is pinned). ``_umath_linalg.lstsq`` is that
    function's own LAPACK (gelsd) loop, which takes a stack of systems where the public function
    takes one: one call instead of one per row, whose Python wrapper took 60% of each of these
    tiny solves."""
    rows, columns = matrices.shape[-2:]
    rcond = np.finfo(float).eps * max(rows, columns)
    with np.errstate(
        call=_not_converged, invalid="call", over="ignore", divide="ignore", under="ignore"
    ):
        solution = _umath_linalg.lstsq(
            matrices, vectors[..., np.newaxis], rcond, signature="ddd->ddid"
        )[0]
    return np.ascontiguousarray(solution[..., 0])


def _not_converged(error: object, flag: object) -> None:
    raise LinAlgError("SVD did not converge in Linear Least Squares")
