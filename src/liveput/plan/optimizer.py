"""The liveput optimizer: model-predictive control over the next H intervals.

Notation.
- Intervals h = 1..H of length T seconds; h = 1 starts now.
- ``n_h``: spot instances available at the start of interval h: known for h = 1
  (``num_available``), the forecast's distribution ``pmf[h - 2]`` for h >= 2. ``o``: on-demand
  instances (never preempted).
- ``q_h``: probability that an instance is preempted during interval h,
  ``expected_preempted[h - 1] / point[h - 1]`` (the forecast's own estimate; see below).
- Candidates c = (D, P), feasible in memory, plus "run nothing". ``thr(c)``: samples/s.
- ``mig(c, c')``: seconds lost to move from c to c' (``migration_seconds``).

Reward of running c' in interval h, having run c before (expected samples):

    R_h(c, c') = sum_n pmf_h[n] * [|c'| <= n + o] * S_h(c', n) * max(0, T - mig(c, c')) / T

with ``S_h(c', n) = T * sum_k Bin(k; n, q_h) * ((thr(c') + E[thr after k losses]) / 2)``: the
preemptions of the interval fall at a uniformly random time, so on average half of it runs at
full speed and half with the pipelines that survive (exact, ``plan.liveput``); k = 0 keeps full
speed.

Objective (``throughput``): maximize ``sum_h R_h(c_{h-1}, c_h)`` over sequences c_1..c_H, with c_0
the running configuration. Constraints: (1) ``|c_h| <= n_h + o`` (enforced inside the expectation:
a configuration that does not fit the count that occurs trains nothing); (2) c_h feasible in
memory (only such candidates exist); (3) a migration's time is lost in the interval it starts.

Objective (``cost``): maximize samples per dollar; solved by Dinkelbach's method: maximize
``sum_h R_h - lambda * dollars_h`` and update lambda to the achieved samples per dollar (a few
rounds). ``dollars_h = T / 3600 * (|c_h| * spot_price + o * on_demand_price)``: spares are released.

Recursion (dynamic program, applied then re-solved every interval):

    V_{H+1}(c) = 0,    V_h(c) = max_{c'} R_h(c, c') + V_{h+1}(c'),    decision = argmax at h = 1.

Ties go to the shallower pipeline, then to fewer instances (candidates are sorted that way and
``argmax`` returns the first maximum).

Computation (what keeps a thousand instances cheap). ``S_h(c', n)`` is the same for every
n >= |c'| - o (the mixture over k is an expectation under independent losses, in which spares
play no part: ``plan.interval``), so ``R_h(c, c') = P_h(n + o >= |c'|) * S_h(c') * keep(c, c')``
with ``keep = max(0, T - mig) / T``: a tail sum of the pmf and one value per candidate and rate,
O(sum of D over candidates) per rate, no table over instances. ``mig`` depends on a pair only
through the depths and the order of D, D' (``plan.transitions``), so a DP step costs
O(depths x candidates), not O(candidates^2), and no candidates x candidates matrix is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from liveput.budget import check_memory
from liveput.errors import LiveputError
from liveput.forecast.base import Forecast
from liveput.perf.configuration import Configuration, MigrationKind
from liveput.perf.types import ConfigTable, ModelProfile
from liveput.plan.costs import CostModel, migration_kind
from liveput.plan.interval import IntervalThroughput
from liveput.plan.transitions import Transitions

OBJECTIVES = ("throughput", "cost")


@dataclass(frozen=True)
class OptimizerConfig:
    """Settings of the liveput optimizer."""

    horizon: int = 12
    """H: intervals looked ahead."""
    interval_s: float = 60.0
    """T: length of an interval, seconds."""
    objective: str = "throughput"
    """``throughput`` (expected samples) or ``cost`` (expected samples per dollar)."""
    spot_price_usd_per_hour: float = 1.25
    """Price of a spot instance-hour (p3.2xlarge, spotDNN paper, Jan 2023)."""
    on_demand_price_usd_per_hour: float = 3.06
    """Price of an on-demand instance-hour (same source)."""

    def __post_init__(self) -> None:
        if self.horizon < 1:
            raise LiveputError(f"optimizer horizon must be >= 1, got {self.horizon}")
        if self.interval_s <= 0:
            raise LiveputError("optimizer interval must be positive")
        if self.objective not in OBJECTIVES:
            raise LiveputError(
                f"unknown objective {self.objective!r}; known: {', '.join(OBJECTIVES)}"
            )


@dataclass(frozen=True)
class Alternative:
    """A configuration considered for the interval that starts now."""

    configuration: Configuration | None
    expected_samples: float
    """Expected samples over the horizon if it is chosen now (optimal afterwards)."""
    migration: MigrationKind


@dataclass(frozen=True)
class PlanDecision:
    """What the optimizer decided for the interval that starts now."""

    configuration: Configuration | None
    migration: MigrationKind
    migration_s: float
    expected_samples: float
    """Expected samples of the whole plan over the horizon."""
    alternatives: tuple[Alternative, ...]
    """The best value of each candidate for now, best first (at most 10)."""


class LiveputOptimizer:
    """Decides the configuration of each interval (pure: no clock, no I/O)."""

    def __init__(
        self,
        profile: ModelProfile,
        table: ConfigTable,
        costs: CostModel,
        config: OptimizerConfig | None = None,
    ) -> None:
        self.profile = profile
        self.costs = costs
        self.config = config or OptimizerConfig()
        keep = np.flatnonzero(table.feasible)
        order = np.lexsort((table.data_parallel[keep], table.pipeline_stages[keep]))
        keep = keep[order]
        # Candidate 0 is "run nothing".
        self.data_parallel = np.concatenate(([0], table.data_parallel[keep])).astype(int)
        self.stages = np.concatenate(([0], table.pipeline_stages[keep])).astype(int)
        self.throughput = np.concatenate(([0.0], table.samples_per_s[keep]))
        self.sizes = self.data_parallel * self.stages
        self.capacity = int(self.sizes.max(initial=0))
        check_memory(
            f"the optimizer's tables for {self.capacity} instances and "
            f"{len(self.sizes) - 1:,} configurations",
            self._table_bytes(),
            "fewer instances (--nodes, the forecast, the trace's capacity)",
        )
        # grid[t, P]: throughput of t pipelines of P stages (t <= the widest D of the table).
        grid = np.zeros(
            (int(self.data_parallel.max(initial=0)) + 1, int(self.stages.max(initial=0)) + 1)
        )
        grid[self.data_parallel, self.stages] = self.throughput
        self._index = {(d, p): i for i, (d, p) in enumerate(zip(self.data_parallel, self.stages))}
        self._interval = IntervalThroughput(self.data_parallel, self.stages, grid)
        self._transitions = Transitions(
            profile, costs, self.data_parallel, self.stages, self.config.interval_s
        )

    def _table_bytes(self) -> float:
        """Bytes the tables below hold at their largest: the (candidate, t) terms of
        ``IntervalThroughput`` (about ten arrays of them alive at once, for one on-demand
        count), its binomial tables over (D, l) and the DP's depths x candidates arrays."""
        terms = float(self.data_parallel.sum())
        widths = float(self.data_parallel.max(initial=0) + 1) ** 2
        depths = float(len(np.unique(self.stages)))
        return 8.0 * (10 * terms + 10 * widths + 4 * depths * len(self.sizes))

    # --- decision -------------------------------------------------------------------------
    def decide(
        self,
        current: Configuration | None,
        num_available: int,
        forecast: Forecast,
        num_on_demand: int = 0,
    ) -> PlanDecision:
        """The configuration for the interval that starts now, and the alternatives."""
        horizon = self.config.horizon
        if forecast.horizon < horizon - 1:
            raise LiveputError(
                f"forecast has {forecast.horizon} steps; the optimizer needs {horizon - 1}"
            )
        if num_available < 0 or num_on_demand < 0:
            raise LiveputError("instance counts must be >= 0")
        interval_s = self.config.interval_s
        rewards = self._rewards(num_available, forecast, num_on_demand)
        start = (
            0
            if current is None
            else self._index.get((current.data_parallel, current.pipeline_stages), 0)
        )
        instances = max(num_available + num_on_demand, 1)
        start_keep = self._transitions.keep_row(start, instances)
        dollars = np.zeros((horizon, len(self.sizes)))
        if self.config.objective == "cost":
            dollars[:] = (
                interval_s
                / 3600
                * (
                    self.sizes * self.config.spot_price_usd_per_hour
                    + num_on_demand * self.config.on_demand_price_usd_per_hour
                )
            )
        price_weight = 0.0
        best: tuple[float, int, np.ndarray, float] | None = None
        for _ in range(4 if self.config.objective == "cost" else 1):
            penalty = dollars * price_weight
            future = self._values(rewards, penalty, instances)
            first = rewards[0] * start_keep - penalty[0] + future[1]
            choice = int(np.argmax(first))
            path = self._path(rewards, penalty, future, choice, instances)
            previous = [start, *path[:-1]]
            keeps = {b: self._transitions.keep_row(b, instances) for b in set(previous)}
            samples = float(
                sum(
                    rewards[h, c] * keeps[b][c]
                    for h, (b, c) in enumerate(zip(previous, path, strict=True))
                )
            )
            spent = float(sum(dollars[h, c] for h, c in enumerate(path)))
            ratio = samples / spent if spent > 0 else 0.0
            # At Dinkelbach's fixed point the best plan is worth 0, as much as running nothing:
            # keep the plan of the best ratio seen, not the last argmax (a tie may pick nothing);
            # the latest round among those as good (up to rounding), as before that fix.
            if best is None or ratio >= best[0] * (1.0 - 1e-9):
                best = (ratio, choice, first, samples)
            if spent > 0:
                price_weight = ratio
        assert best is not None  # the first round always keeps its plan
        _, choice, first, samples = best
        order = np.argsort(-first, kind="stable")[:10]
        alternatives = tuple(
            Alternative(
                self._configuration(c),
                float(first[c]),
                migration_kind(
                    self.data_parallel[start],
                    self.stages[start],
                    self.data_parallel[c],
                    self.stages[c],
                ),
            )
            for c in order
            if np.isfinite(first[c])
        )
        return PlanDecision(
            configuration=self._configuration(choice),
            migration=migration_kind(
                self.data_parallel[start],
                self.stages[start],
                self.data_parallel[choice],
                self.stages[choice],
            ),
            migration_s=float(self._transitions.seconds_row(start, instances)[choice]),
            expected_samples=float(samples),
            alternatives=alternatives,
        )

    def _rewards(self, num_available: int, forecast: Forecast, num_on_demand: int) -> np.ndarray:
        """Expected samples of each candidate in each interval of the horizon (rows), before
        migrations: the interval's samples times the chance the candidate fits its count."""
        horizon = self.config.horizon
        max_spot = max(num_available, forecast.capacity)
        # Spot instances each candidate needs besides the on-demand ones (constraint 1).
        needed = np.clip(self.sizes - num_on_demand, 0, None)
        rewards = np.zeros((horizon, len(self.sizes)))
        for h in range(horizon):
            if h == 0:
                fit_mass = (needed <= num_available).astype(float)
                point = float(num_available)
            else:
                pmf = forecast.pmf[h - 1]
                # tail[n] = P(count >= n), n = 0..max_spot + 1.
                tail = np.zeros(max_spot + 2)
                tail[: len(pmf)] = np.cumsum(pmf[::-1])[::-1]
                fit_mass = tail[np.minimum(needed, max_spot + 1)]
                point = max(float(forecast.point[h - 1]), 1.0)
            step = min(h, forecast.horizon - 1)
            rate = float(np.clip(forecast.expected_preempted[step] / max(point, 1.0), 0.0, 1.0))
            per_candidate = self._interval.per_candidate(rate, num_on_demand)
            rewards[h] = self.config.interval_s * (fit_mass * per_candidate)
        return rewards

    def migration_s(
        self, current: Configuration | None, target: Configuration | None, num_instances: int
    ) -> float:
        """Seconds to move from ``current`` to ``target`` on ``num_instances`` instances."""
        begin = (
            0
            if current is None
            else self._index.get((current.data_parallel, current.pipeline_stages), 0)
        )
        end = (
            0
            if target is None
            else self._index.get((target.data_parallel, target.pipeline_stages), 0)
        )
        return float(self._transitions.seconds_row(begin, max(num_instances, 1))[end])

    def recover(
        self,
        start: Configuration | None,
        num_available: int,
        remaining_s: float,
        num_on_demand: int = 0,
        salvage_stages: int | None = None,
    ) -> PlanDecision:
        """The configuration for the rest of an interval, right after a loss.

        ``start`` is what the survivors form without moving state (the complete pipelines they
        regroup into; None when a stage lost every replica). Each candidate c that fits
        ``num_available + num_on_demand`` is worth ``thr(c) * max(0, remaining_s - mig(start,
        c))`` samples; the best one is chosen (the next interval's decision looks ahead again).
        When no candidate trains before the interval ends, they are ranked the same way over
        the rest of the interval and the optimizer's horizon after it.

        A stage that lost every replica has its state only on the leaving instances. With
        ``salvage_stages`` (the depth P of the configuration that was hit) they send it out
        during the cloud's preemption notice: reaching depth P again costs a rebuild plus one
        stage's state (``mig((1, P), (D', P))``, and for D' = 1 the same rebuild and transfer),
        another depth a re-partition from P. Without it the state comes from the checkpoint
        (``mig(nothing, c)``).
        """
        if num_available < 0 or num_on_demand < 0 or remaining_s < 0:
            raise LiveputError("instance counts and remaining time must be >= 0")
        instances = max(num_available + num_on_demand, 1)
        begin = (
            0 if start is None else self._index.get((start.data_parallel, start.pipeline_stages), 0)
        )
        migration = self._transitions.seconds_row(begin, instances)
        salvaged = self._index.get((1, salvage_stages or 0)) if start is None else None
        if salvaged is not None and salvage_stages:
            migration = self._transitions.seconds_row(salvaged, instances)
            stage_bytes = float(self.profile.layer_state_bytes().sum()) / salvage_stages
            migration[salvaged] = self.costs.rebuild_s(instances) + self.costs.transfer_s(
                stage_bytes
            )
        fits = self.sizes <= num_available + num_on_demand

        def trained(window_s: float) -> np.ndarray:
            return np.where(fits, self.throughput * np.clip(window_s - migration, 0.0, None), 0.0)

        value = ranked = trained(remaining_s)
        if not value.any():
            # Nothing trains in the rest of the interval: every move outlasts it (gigabytes over
            # slow links next to short intervals). Run nothing, and the state the move would
            # have kept is gone: the next decision could only restore the checkpoint. Rank the
            # moves by what they train over the look-ahead after it instead.
            ranked = trained(remaining_s + self.config.horizon * self.config.interval_s)
        choice = int(np.argmax(ranked))
        if ranked[choice] <= ranked[begin] and fits[begin]:
            choice = begin
        origin = begin if salvaged is None else salvaged
        kind = migration_kind(
            self.data_parallel[origin],
            self.stages[origin],
            self.data_parallel[choice],
            self.stages[choice],
        )
        if salvaged is not None and choice == salvaged:
            kind = MigrationKind.INTER_STAGE
        return PlanDecision(
            self._configuration(choice), kind, float(migration[choice]), float(value[choice]), ()
        )

    def _values(
        self, rewards: np.ndarray, penalty: np.ndarray, num_instances: int
    ) -> list[np.ndarray]:
        """``values[h][c]``: best value of intervals h..H (0-based) having run c before."""
        horizon, count = rewards.shape
        values = [np.zeros(count) for _ in range(horizon + 1)]
        for h in range(horizon - 1, 0, -1):
            values[h] = self._transitions.step(rewards[h], penalty[h], values[h + 1], num_instances)
        return values

    def _path(
        self,
        rewards: np.ndarray,
        penalty: np.ndarray,
        values: list[np.ndarray],
        choice: int,
        num_instances: int,
    ) -> list[int]:
        """The optimal sequence of candidates that starts with ``choice``."""
        path = [choice]
        for h in range(1, rewards.shape[0]):
            keep = self._transitions.keep_row(path[-1], num_instances)
            totals = rewards[h] * keep - penalty[h] + values[h + 1]
            path.append(int(np.argmax(totals)))
        return path

    def _configuration(self, index: int) -> Configuration | None:
        if index == 0:
            return None
        return Configuration(int(self.data_parallel[index]), int(self.stages[index]))
