"""The least-cost schedule that finishes a job's work by its deadline, the future known.

Notation.
- Intervals k = 0..K-1 before the deadline; choices c = 0..C-1 in each (what to rent: e.g.
  whether to hold the spot instances, how many on-demand ones).
- ``g[k, c]``: work units trained in interval k under choice c (integers >= 0: samples divided
  by a unit and rounded down, so a schedule that is feasible here is feasible in samples).
- ``u[k, c]``: dollars it costs. W: the work, in units.

Objective: minimize ``sum_k u[k, c_k]`` over sequences c_0..c_{K-1}.
Constraints: (1) ``sum_k g[k, c_k] >= W`` (the work is done by the deadline); (2) one choice per
interval.

Recursion (backward dynamic program over the work left, b = 0..W):

    V_K(0) = 0,  V_K(b > 0) = inf,
    V_k(b) = min_c u[k, c] + V_{k+1}(max(b - g[k, c], 0)),

so ``V_0(W)`` is the least cost (inf: no schedule meets the deadline, constraint 1) and
``argmin`` tables give the best choice for any interval and any work left: a closed-loop policy
that reads the table with the work actually left re-plans for free. Ties go to the lowest choice.
Cost O(K * C * W) in numpy, memory O(K * W) for the choice table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from liveput.errors import LiveputError


@dataclass(frozen=True)
class DeadlineSchedule:
    """The solved program: least costs and best choices for every interval and work left."""

    values: np.ndarray
    """``values[k, b]``: least dollars from interval k with b units left, shape (K + 1, W + 1)."""
    choices: np.ndarray
    """``choices[k, b]``: the best choice then, shape (K, W + 1)."""
    gains: np.ndarray
    """``g``, shape (K, C)."""

    @property
    def cost(self) -> float:
        """Least dollars for the whole work from interval 0 (inf: infeasible)."""
        return float(self.values[0, -1])

    def choice(self, interval: int, units_left: int) -> int | None:
        """Best choice at ``interval`` with ``units_left`` work units left (None: past the last
        interval, or no schedule can finish from there)."""
        units_left = int(np.clip(units_left, 0, self.values.shape[1] - 1))
        if interval >= len(self.choices) or not np.isfinite(self.values[interval, units_left]):
            return None
        return int(self.choices[interval, units_left])

    def path(self) -> list[int]:
        """The best sequence of choices from interval 0 with all the work left."""
        left = self.values.shape[1] - 1
        path = []
        for k in range(len(self.choices)):
            c = int(self.choices[k, left])
            path.append(c)
            left = max(left - int(self.gains[k, c]), 0)
        return path


def solve_deadline(gains: np.ndarray, costs: np.ndarray, work_units: int) -> DeadlineSchedule:
    """Solve the program of the module docstring."""
    gains = np.asarray(gains, dtype=np.int64)
    costs = np.asarray(costs, dtype=float)
    if gains.ndim != 2 or gains.shape != costs.shape or gains.shape[1] == 0:
        raise LiveputError("deadline program: gains and costs must be (intervals, choices) alike")
    if (gains < 0).any() or (costs < 0).any() or work_units < 0:
        raise LiveputError("deadline program: gains, costs and work must be >= 0")
    num_intervals, num_choices = gains.shape
    left = np.arange(work_units + 1)
    values = np.full((num_intervals + 1, work_units + 1), np.inf)
    values[num_intervals, 0] = 0.0
    choices = np.zeros(
        (num_intervals, work_units + 1), dtype=np.int16 if num_choices < 2**15 else np.int32
    )
    for k in range(num_intervals - 1, -1, -1):
        best = np.full(work_units + 1, np.inf)
        best_choice = np.zeros(work_units + 1, dtype=choices.dtype)
        after = values[k + 1]
        for c in range(num_choices):
            candidate = costs[k, c] + after[np.maximum(left - gains[k, c], 0)]
            better = candidate < best
            best[better] = candidate[better]
            best_choice[better] = c
        values[k] = best
        choices[k] = best_choice
    return DeadlineSchedule(values, choices, gains)
