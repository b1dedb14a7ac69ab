"""Moves between candidates, by depth: the migration seconds and the dynamic program's step.

``mig(c, c')`` (``plan.costs``) depends on the pair only through the depths P, P' and whether
D' is below, equal to or above D: on n instances, with ``rb = rebuild_s(n)``,

- from nothing (c = 0): ``restore(n)`` to any c' != 0;
- to nothing (c' = 0), or c' = c: 0;
- P' = P: ``rb`` when D' < D, ``rb + stage_transfer[P]`` when D' > D;
- P' != P: ``rb + repartition[P, P']``.

So the step of the dynamic program, ``V(c) = max_{c'} R(c') keep(c, c') - pen(c') + V'(c')`` with
``keep = max(0, T - mig) / T``, needs no candidates x candidates matrix: per source depth, the
best target of every other depth (a depths x candidates array), and within a depth a prefix
maximum (D' < D) and a suffix maximum (D' > D). The terms are the same floating-point
expressions as with the dense matrix, so the values are identical, not just close. (In the
depths x candidates array a target of the source's own depth gets keep 0: with R >= 0 its term
is no larger than its true one, which the within-depth maxima count, so the maximum is the
same.)
"""

from __future__ import annotations

import numpy as np

from liveput.perf.types import ModelProfile
from liveput.plan.costs import CostModel, depth_costs, restore_s

KEPT_ROWS = 256
"""The most rows of keep a :class:`Transitions` keeps (a row per candidate: 256 rows of a
1024-instance table's few thousand candidates take some megabytes)."""


class Transitions:
    """Migration seconds between candidates ``(data_parallel[i], stages[i])`` (candidate 0 is
    "run nothing"; candidates of one depth sorted by D) and the DP step over them."""

    def __init__(
        self,
        profile: ModelProfile,
        costs: CostModel,
        data_parallel: np.ndarray,
        stages: np.ndarray,
        interval_s: float,
    ) -> None:
        self.profile = profile
        self.costs = costs
        self.data_parallel = data_parallel
        self.stages = stages
        self.interval_s = interval_s
        self.repartition, self.stage_transfer = depth_costs(profile, costs, stages)
        running = data_parallel > 0
        self.depths = np.unique(stages[running])
        group = np.searchsorted(self.depths, stages)
        self.group = np.where(running, group, -1)
        # layout[g, j]: the candidate of depth depths[g] with the j-th smallest D (-1: none).
        width = int(np.bincount(group[running], minlength=len(self.depths)).max(initial=0))
        self.layout = np.full((len(self.depths), width), -1)
        self.position = np.zeros(len(stages), dtype=int)
        for g in range(len(self.depths)):
            members = np.flatnonzero(self.group == g)
            members = members[np.argsort(data_parallel[members], kind="stable")]
            self.layout[g, : len(members)] = members
            self.position[members] = np.arange(len(members))
        self._valid = self.layout >= 0
        self._safe_layout = np.where(self._valid, self.layout, 0)
        other_depth = self.group[None, 1:] != np.arange(len(self.depths))[:, None]
        self._cross_mask = other_depth & running[None, 1:]
        self._running = np.flatnonzero(running)
        self._running_group = self.group[self._running]
        self._running_position = self.position[self._running]
        # Rows of keep by source, and what _keeps gives: both for one count, _cached_count.
        self._cached_count: int | None = None
        self._rows: dict[int, np.ndarray] = {}
        self._cached_keeps: tuple[np.ndarray, ...] | None = None

    def seconds_row(self, source: int, num_instances: int) -> np.ndarray:
        """``mig(source, c')`` for every c' on ``num_instances`` instances."""
        d, p = int(self.data_parallel[source]), int(self.stages[source])
        seconds = np.zeros(len(self.stages))
        targets = self.data_parallel > 0
        if d == 0:
            seconds[targets] = restore_s(self.profile, self.costs, num_instances)
            return seconds
        rebuild = self.costs.rebuild_s(num_instances)
        same = targets & (self.stages == p)
        seconds = np.where(same & (self.data_parallel < d), rebuild, seconds)
        seconds = np.where(
            same & (self.data_parallel > d), rebuild + self.stage_transfer[p], seconds
        )
        other = targets & (self.stages != p)
        return np.where(other, rebuild + self.repartition[p, self.stages], seconds)

    def keep_row(self, source: int, num_instances: int) -> np.ndarray:
        """``keep(source, c') = max(0, T - mig(source, c')) / T`` (read-only).

        Cached for the last count: a decision asks for the rows of its start and of every
        step of its plan, in each of its rounds, on one count (14 rows a decision of ``advise
        pool``, a tenth of its time), and the next decision usually has the same count."""
        self._cache_count(num_instances)
        row = self._rows.get(source)
        if row is None:
            seconds = self.seconds_row(source, num_instances)
            row = np.clip(self.interval_s - seconds, 0.0, None) / self.interval_s
            row.flags.writeable = False
            if len(self._rows) >= KEPT_ROWS:
                self._rows.clear()
            self._rows[source] = row
        return row

    def _cache_count(self, num_instances: int) -> None:
        """Drop what is cached when the count changes (keep depends on it through the
        rebuild's seconds)."""
        if self._cached_count != num_instances:
            self._rows.clear()
            self._cached_keeps = None
            self._cached_count = num_instances

    def _keeps(self, num_instances: int) -> tuple[np.ndarray, ...]:
        """What keep is on ``num_instances`` (one count per decision: cached for the last one):
        ``(from nothing, to another depth [source depth, target], fewer pipelines, more)``."""
        self._cache_count(num_instances)
        if self._cached_keeps is None:
            interval_s = self.interval_s
            rebuild = self.costs.rebuild_s(num_instances)
            depths = self.depths
            cross_s = rebuild + self.repartition[depths[:, None], self.stages[None, 1:]]
            cross = np.clip(interval_s - cross_s, 0.0, None) / interval_s
            cross[~self._cross_mask] = 0.0
            down = np.clip(interval_s - rebuild, 0.0, None) / interval_s
            up = (
                np.clip(interval_s - (rebuild + self.stage_transfer[depths]), 0.0, None)
                / interval_s
            )
            self._cached_keeps = (self.keep_row(0, num_instances), cross, down, up)
        return self._cached_keeps

    def step(
        self, rewards: np.ndarray, penalty: np.ndarray, values: np.ndarray, num_instances: int
    ) -> np.ndarray:
        """``V(c) = max_{c'} rewards[c'] * keep(c, c') - penalty[c'] + values[c']`` for every c
        (rewards >= 0)."""
        from_nothing, cross_keep, down_keep, up_keep = self._keeps(num_instances)
        priced = bool(penalty.any())  # x - 0.0 == x: skipping a zero penalty changes no bit

        def total(
            reward: np.ndarray, keep: np.ndarray | float, index: slice | np.ndarray = slice(None)
        ) -> np.ndarray:
            value = reward * keep
            if priced:
                value = value - penalty[index]
            return value + values[index]

        result = np.empty(len(self.stages))
        result[0] = np.max(total(rewards, from_nothing))
        if len(self.depths) == 0:
            return result
        # To another depth: keep depends on (P, P') only.
        best_cross = total(rewards[None, 1:], cross_keep, slice(1, None)).max(axis=1)
        # Within a depth: fewer pipelines (regroup) or more (one stage's state each).
        layout = self._safe_layout
        down = np.where(self._valid, total(rewards[layout], down_keep, layout), -np.inf)
        up = np.where(self._valid, total(rewards[layout], up_keep[:, None], layout), -np.inf)
        below = np.full_like(down, -np.inf)
        below[:, 1:] = np.maximum.accumulate(down, axis=1)[:, :-1]
        above = np.full_like(up, -np.inf)
        above[:, :-1] = np.maximum.accumulate(up[:, ::-1], axis=1)[:, ::-1][:, 1:]
        within = np.maximum(below, above)
        # To nothing (keep 1; "run nothing" trains nothing) and staying put (mig 0, keep 1).
        to_nothing = total(rewards[:1], 1.0, slice(0, 1))[0]
        stay = total(rewards, 1.0)
        candidates = self._running
        result[candidates] = np.maximum(
            np.maximum(
                best_cross[self._running_group], within[self._running_group, self._running_position]
            ),
            np.maximum(stay[candidates], to_nothing),
        )
        return result
