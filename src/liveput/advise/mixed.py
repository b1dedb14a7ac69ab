"""Mixed GPU types in one Tiering cluster (which DeepVM does not do), as MILPs solved by HiGHS.

Notation
    i   GPU types: FLOPS f_i per instance, g_i GPUs, spot price s_i, vCPUs v_i, family F_i
    j   CPU checkpoint types: on-demand price o_j, memory M_j (GB), network B_j (Gb/s), vCPUs v_j
    N   total GPUs of the cluster;  e_iN = S_i(N) / N, the scaling efficiency of type i's logistic
        fit (``scaling.scaling_for``) at N GPUs: each GPU of type i contributes its FLOPS at the
        efficiency its own fit has at the cluster's size
    PW, Q(F, market), K, G, r   as in ``deepvm.py``

Variables: n_i >= 0 and m_j >= 0 integers (spot GPU and on-demand CPU instances).

Objective: maximize effective FLOPS  E = sum_i e_iN f_i n_i  with N = sum_i g_i n_i. For one type
this is DeepVM's (f_i / g_i) S_i(n g_i), so every single-type Tiering plan is feasible with its
DeepVM value. Ties go to the lower $/h (a second solve with E fixed).

E is linear once N is fixed, so the problem is max over N of MILP(N):
    maximize sum_i e_iN f_i n_i  subject to
    (1) sum_i s_i n_i + sum_j o_j m_j <= PW
    (2) sum_{i in F} v_i n_i <= Q(F, spot)          for each family F with a spot quota
    (3) sum_{j in F} v_j m_j <= Q(F, on-demand)     for each family F with an on-demand quota
    (4) sum_j M_j m_j >= K G
    (5) r sum_i n_i <= sum_j B_j m_j                 (liveput's stream bound: DeepVM's
                                                      saturation table is per pair of types)
    (6) sum_j m_j >= 1
    (7) sum_i g_i n_i = N
    (8) n_i <= Q(F_i, spot) / v_i,  m_j <= Q(F_j, on-demand) / v_j     (bounds)
    (9) E >= E_1, the best single-type Tiering plan's value (``deepvm.py``): a feasible point, so
        the cut removes no optimum and lets HiGHS prune
Search (exact): N runs up to a bound on the GPUs any plan affords (budget knapsack, vCPU quotas).
Each N gets an upper bound UB_N on the LP keeping (1) (less the cheapest tier meeting (4) and
(6)), (7) and the family quotas in GPUs (Lagrangian bound, ``_size_bounds``); the N are visited by
decreasing UB_N and the search stops when UB_N <= the best E found. GPU types dominated by another
of the same family, GPU count and fit (no more vCPUs, no higher price, no fewer FLOPS) are dropped
first: swapping them out never lowers E. Tested against enumeration of all (n, m) on small random
catalogs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from liveput.advise.deepvm import DeepVMConfig, advise_deepvm
from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.scaling import scaling_for
from liveput.catalog import Catalog, InstanceSpec, Market
from liveput.errors import LiveputError

if TYPE_CHECKING:
    from scipy.optimize import Bounds, LinearConstraint


@dataclass(frozen=True)
class MixedConfig:
    """A mixed-type request: DeepVM's budget, checkpoint constraints and scaling fits."""

    deepvm: DeepVMConfig
    """Budget, checkpoint constraints and the user's fits (shared with ``deepvm.py``)."""
    time_limit_s: float = 10.0
    """HiGHS time limit per solve."""

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise LiveputError("time_limit_s must be > 0")


def _max_gpus(catalog: Catalog, gpus: tuple[InstanceSpec, ...], budget: float) -> int:
    """An upper bound on the GPUs any plan has: the smaller of a fractional knapsack of the
    budget (cheapest $/GPU first, each type up to its quota) and the families' vCPU quotas
    spent on their fewest vCPUs per GPU."""
    by_budget, left = 0.0, budget
    for spec in sorted(gpus, key=lambda s: s.spot_usd_per_hour / max(s.gpus, 1)):
        count = min(left / spec.spot_usd_per_hour, catalog.max_count(spec, Market.SPOT))
        by_budget += count * max(spec.gpus, 1)
        left -= count * spec.spot_usd_per_hour
        if left <= 0:
            break
    by_quota = 0.0
    for family in {s.family for s in gpus}:
        quota = catalog.quota_vcpus(family, Market.SPOT)
        if quota is None:
            by_quota = math.inf
            break
        by_quota += quota / min(s.vcpus / max(s.gpus, 1) for s in gpus if s.family == family)
    return int(math.floor(min(by_budget, by_quota) + 1e-9))


def _undominated(gpus: tuple[InstanceSpec, ...], deep: DeepVMConfig) -> tuple[InstanceSpec, ...]:
    """GPU types no other type beats: k dominates i when both share family, GPU count and scaling
    fit and k has no more vCPUs, no higher spot price and no fewer FLOPS (swapping every i for a
    k keeps every constraint and never lowers E). Of identical types the first is kept."""
    kept = []
    for index, spec in enumerate(gpus):
        fit = scaling_for(spec, deep.fits)
        dominated = False
        for other_index, other in enumerate(gpus):
            if (
                other_index == index
                or other.family != spec.family
                or other.gpus != spec.gpus
                or scaling_for(other, deep.fits) != fit
            ):
                continue
            no_worse = (
                other.vcpus <= spec.vcpus
                and other.spot_usd_per_hour <= spec.spot_usd_per_hour
                and other.relative_flops >= spec.relative_flops
            )
            strictly = (other.vcpus, other.spot_usd_per_hour, -other.relative_flops) != (
                spec.vcpus,
                spec.spot_usd_per_hour,
                -spec.relative_flops,
            )
            if no_worse and (strictly or other_index < index):
                dominated = True
                break
        if not dominated:
            kept.append(spec)
    return tuple(kept)


def _size_bounds(
    per_gpu_value: np.ndarray,
    per_gpu_price: np.ndarray,
    families: list[str],
    family_gpus: dict[str, float],
    sizes: np.ndarray,
    budget: float,
) -> np.ndarray:
    """UB_N >= the LP  max sum_t a_tN x_t  s.t.  sum_t x_t = N,  sum_t p_t x_t <= budget,
    sum_{t in F} x_t <= C_F,  x >= 0  (x_t GPUs of type t, C_F the GPUs family F's quota allows).

    Weak duality on the budget row: for every lambda >= 0 the bound is lambda * budget plus the
    best filling of N GPUs at values a_tN - lambda p_t, which takes each family's best type up to
    C_F, best family first (a greedy that is optimal for these nested caps). The least bound over
    a grid of lambda is kept. -inf where the quotas cannot hold N GPUs."""
    lambdas = np.concatenate([[0.0], np.logspace(-2, 5, 57)])
    names = sorted(set(families))
    member = np.array([[f == name for f in families] for name in names])  # F x T
    caps = np.array([family_gpus.get(name, np.inf) for name in names])
    # reduced[l, t, N] = a_tN - lambda_l p_t; family value = best member's.
    reduced = per_gpu_value[None, :, :] - lambdas[:, None, None] * per_gpu_price[None, :, None]
    family_value = np.stack(
        [np.where(mask[None, :, None], reduced, -np.inf).max(axis=1) for mask in member]
    )  # F x L x N
    order = np.argsort(-family_value, axis=0)
    ranked_value = np.take_along_axis(family_value, order, axis=0)
    ranked_caps = caps[order]
    before = np.concatenate(
        [np.zeros((1, *ranked_caps.shape[1:])), np.cumsum(ranked_caps, axis=0)[:-1]]
    )
    fill = np.clip(sizes[None, None, :] - before, 0.0, ranked_caps)
    with np.errstate(invalid="ignore"):
        total = np.where(fill > 0, fill * ranked_value, 0.0).sum(axis=0)  # L x N
    total = np.where(caps.sum() >= sizes[None, :], total, -np.inf)
    return (lambdas[:, None] * budget + total).min(axis=0)


class _SizeProblem:
    """MILP(N) for any N: the rows that do not depend on N, built once."""

    def __init__(
        self,
        catalog: Catalog,
        deep: DeepVMConfig,
        gpus: tuple[InstanceSpec, ...],
        cpus: tuple[InstanceSpec, ...],
    ) -> None:
        num_i, num_j = len(gpus), len(cpus)
        self.num_i, self.width = num_i, num_i + num_j
        self.spot = np.array([s.spot_usd_per_hour for s in gpus])
        self.on_demand = np.array([s.on_demand_usd_per_hour for s in cpus])
        self.gpu_count = np.array([max(s.gpus, 1) for s in gpus], dtype=float)
        rows: list[tuple[np.ndarray, float, float]] = []

        def row(n: np.ndarray | float = 0.0, m: np.ndarray | float = 0.0) -> np.ndarray:
            vector = np.zeros(self.width)
            vector[:num_i] = n
            vector[num_i:] = m
            return vector

        self.row = row
        rows.append((row(self.spot, self.on_demand), -np.inf, deep.budget_usd_per_hour))  # (1)
        for family in sorted({s.family for s in gpus}):
            quota = catalog.quota_vcpus(family, Market.SPOT)
            if quota is not None:
                mask = np.array([s.vcpus if s.family == family else 0 for s in gpus], float)
                rows.append((row(n=mask), -np.inf, quota))  # (2)
        for family in sorted({s.family for s in cpus}):
            quota = catalog.quota_vcpus(family, Market.ON_DEMAND)
            if quota is not None:
                mask = np.array([s.vcpus if s.family == family else 0 for s in cpus], float)
                rows.append((row(m=mask), -np.inf, quota))  # (3)
        rows.append(
            (row(m=np.array([s.memory_gb for s in cpus])), deep.checkpoint_memory_gb, np.inf)
        )  # (4)
        rows.append(
            (row(n=deep.stream_gbps, m=-np.array([s.network_gbps for s in cpus])), -np.inf, 0.0)
        )  # (5)
        rows.append((row(m=1.0), 1.0, np.inf))  # (6)
        self.matrix = np.array([r[0] for r in rows])
        self.lower = np.array([r[1] for r in rows])
        self.upper = np.array([r[2] for r in rows])
        self.upper_vars = np.array(
            [catalog.max_count(s, Market.SPOT) for s in gpus]
            + [
                min(
                    catalog.max_count(s, Market.ON_DEMAND),
                    math.floor(deep.budget_usd_per_hour / s.on_demand_usd_per_hour + 1e-9),
                )
                for s in cpus
            ],
            dtype=float,
        )  # (8)

    def _constraints(
        self, size: int, value: np.ndarray, floor: float
    ) -> tuple[list[LinearConstraint], Bounds]:
        # scipy is imported on use: the CLI imports this module at start-up.
        from scipy.optimize import Bounds, LinearConstraint

        constraints = [
            LinearConstraint(self.matrix, self.lower, self.upper),
            LinearConstraint(self.row(n=self.gpu_count)[None, :], size, size),  # (7)
            LinearConstraint(value[None, :], floor, np.inf),
        ]  # (9)
        upper = self.upper_vars.copy()
        upper[: self.num_i] = np.minimum(upper[: self.num_i], size // self.gpu_count)
        return constraints, Bounds(np.zeros(self.width), upper)

    def best_value(
        self, size: int, value_per_instance: np.ndarray, floor: float, options: dict[str, float]
    ) -> float | None:
        """E of MILP(N = size) when some plan has E >= floor, else None."""
        value = self.row(n=value_per_instance)
        constraints, bounds = self._constraints(size, value, floor)
        from scipy.optimize import milp

        result = milp(
            -value,
            integrality=np.ones(self.width),
            bounds=bounds,
            constraints=constraints,
            options=options,
        )
        return None if result.x is None else -float(result.fun)

    def cheapest(
        self, size: int, value_per_instance: np.ndarray, best: float, options: dict[str, float]
    ) -> np.ndarray:
        """Counts of the cheapest plan of MILP(N = size) with E = best (to rounding)."""
        value = self.row(n=value_per_instance)
        constraints, bounds = self._constraints(size, value, best - 1e-7 * max(best, 1.0))
        from scipy.optimize import milp

        result = milp(
            self.row(self.spot, self.on_demand),
            integrality=np.ones(self.width),
            bounds=bounds,
            constraints=constraints,
            options=options,
        )
        if result.x is None:
            raise LiveputError("HiGHS lost a solution it had found; raise time_limit_s")
        return np.round(result.x).astype(np.int64)


def _tier_floor_usd_per_hour(cpus: tuple[InstanceSpec, ...], deep: DeepVMConfig) -> float:
    """The cheapest checkpoint tier of one CPU type that holds the checkpoint ((4) and (6))."""
    return min(
        (
            s.on_demand_usd_per_hour
            * max(1, math.ceil(deep.checkpoint_memory_gb / s.memory_gb - 1e-9))
            for s in cpus
            if s.memory_gb > 0
        ),
        default=0.0,
    )


def _family_gpus(catalog: Catalog, gpus: tuple[InstanceSpec, ...]) -> dict[str, float]:
    """The spot vCPU quota of each family that has one, in GPUs of its fewest vCPUs per GPU."""
    family_gpus = {}
    for family in {s.family for s in gpus}:
        quota = catalog.quota_vcpus(family, Market.SPOT)
        if quota is not None:
            family_gpus[family] = quota / min(
                s.vcpus / max(s.gpus, 1) for s in gpus if s.family == family
            )
    return family_gpus


def _mixed_plan(
    gpus: tuple[InstanceSpec, ...],
    cpus: tuple[InstanceSpec, ...],
    counts: np.ndarray,
    usd: float,
    value: float,
    total_gpus: int,
    solved: int,
) -> Plan:
    """The plan of ``counts`` (GPU instances, then CPU instances): spot GPUs, on-demand tier."""
    items = [
        InstanceCount(s.name, int(c), Market.SPOT)
        for s, c in zip(gpus, counts[: len(gpus)])
        if c > 0
    ]
    items += [
        InstanceCount(s.name, int(c), Market.ON_DEMAND, "checkpoint")
        for s, c in zip(cpus, counts[len(gpus) :])
        if c > 0
    ]
    return Plan(
        "mixed",
        tuple(items),
        usd,
        "effective_flops",
        value,
        {"gpus": total_gpus, "effective_flops_per_usd": value / usd, "sizes_solved": solved},
    )


def advise_mixed(catalog: Catalog, config: MixedConfig) -> Advice:
    """The best Tiering cluster of any mix of GPU types (exact; module docstring)."""
    deep = config.deepvm
    if deep.revocation is not None:
        raise LiveputError(
            "the mixed-type MILP maximizes effective FLOPS; it does not model "
            "revocations (drop --revocation or --mixed)"
        )
    gpus, cpus = catalog.gpu_types, catalog.cpu_types
    if not gpus or not cpus:
        raise LiveputError(f"catalog {catalog.name}: a mixed tiering plan needs GPU and CPU types")
    infeasible = LiveputError(
        f"no mixed tiering plan fits ${deep.budget_usd_per_hour:g}/h with "
        "the quotas and checkpoint constraints"
    )
    try:
        # The cut's single-type plan under this MILP's own (5), the stream bound: a feasible point.
        single = (
            advise_deepvm(
                catalog, replace(deep, architectures=("tiering",), network_bound="stream")
            )
            .plans[0]
            .value
        )
    except LiveputError:
        raise infeasible from None
    gpus = _undominated(gpus, deep)
    sizes = np.arange(1, _max_gpus(catalog, gpus, deep.budget_usd_per_hour) + 1)
    flops = np.array([s.relative_flops for s in gpus])
    gpu_count = np.array([max(s.gpus, 1) for s in gpus], dtype=float)
    efficiency = np.array([scaling_for(s, deep.fits).speedup(sizes) / sizes for s in gpus])
    bounds = _size_bounds(
        efficiency * (flops / gpu_count)[:, None],
        np.array([s.spot_usd_per_hour for s in gpus]) / gpu_count,
        [s.family for s in gpus],
        _family_gpus(catalog, gpus),
        sizes,
        deep.budget_usd_per_hour - _tier_floor_usd_per_hour(cpus, deep),
    )
    problem = _SizeProblem(catalog, deep, gpus, cpus)
    options = {"time_limit": config.time_limit_s, "mip_rel_gap": 1e-9}
    found: list[tuple[float, int]] = []  # (E, k) of every size that beat the incumbent
    incumbent = single * (1 - 1e-9)
    solved = 0
    for k in np.argsort(-bounds, kind="stable"):
        if not np.isfinite(bounds[k]) or bounds[k] < incumbent * (1 - 1e-9):
            break
        value = problem.best_value(
            int(sizes[k]), efficiency[:, k] * flops, incumbent * (1 - 1e-9), options
        )
        solved += 1
        if value is not None:
            found.append((value, int(k)))
            incumbent = max(incumbent, value)
    if not found:
        raise infeasible
    # Of the sizes reaching the best E (to rounding), the cheapest plan.
    top = max(value for value, _k in found)
    plans = []
    for value, k in found:
        if value >= top * (1 - 1e-9):
            counts = problem.cheapest(int(sizes[k]), efficiency[:, k] * flops, value, options)
            usd = float(
                problem.spot @ counts[: len(gpus)] + problem.on_demand @ counts[len(gpus) :]
            )
            plans.append((usd, -value, int(sizes[k]), counts))
    usd, negative, total_gpus, counts = min(plans, key=lambda plan: plan[:3])
    plan = _mixed_plan(gpus, cpus, counts, usd, -negative, total_gpus, solved)
    reason = (
        f"MILP optimum (HiGHS) of effective FLOPS over mixes of {len(gpus)} undominated GPU "
        f"types within ${deep.budget_usd_per_hour:g}/h ({solved} cluster sizes solved)"
    )
    return Advice(
        (plan,), reason, {"budget_usd_per_hour": deep.budget_usd_per_hour, "catalog": catalog.name}
    )
