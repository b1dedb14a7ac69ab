"""Mixed GPU types in one Tiering cluster (which DeepVM does not do), as a MILP solved by HiGHS.

Notation
    i   GPU types: FLOPS f_i per instance, g_i GPUs, spot price s_i, vCPUs v_i, family F_i
    j   CPU checkpoint types: on-demand price o_j, memory M_j (GB), network B_j (Gb/s), vCPUs v_j
    N   total GPUs of the cluster, 1..N_max;  e_iN = S_i(N) / N, the scaling efficiency of type i's
        logistic fit (``scaling.scaling_for``) at N GPUs: each GPU of type i contributes its FLOPS
        at the efficiency its own fit has at the cluster's size
    PW, Q(F, market), K, G, r   as in ``deepvm.py``

Variables: n_iN >= 0 integers (spot instances of GPU type i when the cluster has N GPUs; 0 for
every other N), m_j >= 0 integers (on-demand CPU instances), z_N binary (the cluster has N GPUs).
The instances of type i are n_i = sum_N n_iN. Splitting n_i by N keeps the objective linear
without big-M terms (a tight formulation: the LP bound is close, HiGHS closes it fast).

Objective: maximize effective FLOPS  E = sum_{i,N} e_iN f_i n_iN  (for one type this is DeepVM's
(f_i / g_i) S_i(n g_i), so every single-type Tiering plan is feasible with its DeepVM value);
ties go to the lower $/h (a second solve with E fixed).

Constraints
    (1) sum_{i,N} s_i n_iN + sum_j o_j m_j <= PW
    (2) sum_{i in F, N} v_i n_iN <= Q(F, spot)        for each family F with a spot quota
    (3) sum_{j in F} v_j m_j <= Q(F, on-demand)       for each family F with an on-demand quota
    (4) sum_j M_j m_j >= K G
    (5) r sum_{i,N} n_iN <= sum_j B_j m_j
    (6) sum_j m_j >= 1
    (7) sum_N z_N = 1
    (8) sum_i g_i n_iN = N z_N                          for each N
    (9) 0 <= n_iN <= min(quota count of i, N / g_i)    (bounds)
Tested against enumeration of all (n, m) on small random catalogs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from liveput.advise.catalog import Catalog, Market
from liveput.advise.deepvm import DeepVMConfig
from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.scaling import scaling_for
from liveput.errors import LiveputError


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


def _max_gpus(catalog: Catalog, budget: float) -> int:
    best = 0
    for spec in catalog.gpu_types:
        by_budget = math.floor(budget / spec.spot_usd_per_hour + 1e-9)
        best = max(best, min(by_budget, catalog.max_count(spec, Market.SPOT)) * max(spec.gpus, 1))
    return best


def advise_mixed(catalog: Catalog, config: MixedConfig) -> Advice:
    """The best Tiering cluster of any mix of GPU types, solved as a MILP."""
    deep = config.deepvm
    if deep.revocation is not None:
        raise LiveputError("the mixed-type MILP maximizes effective FLOPS; it does not model "
                           "revocations (drop --revocation or --mixed)")
    gpus, cpus = catalog.gpu_types, catalog.cpu_types
    if not gpus or not cpus:
        raise LiveputError(f"catalog {catalog.name}: a mixed tiering plan needs GPU and CPU types")
    n_max = _max_gpus(catalog, deep.budget_usd_per_hour)
    if n_max < 1:
        raise LiveputError(f"budget ${deep.budget_usd_per_hour:g}/h buys no GPU instance")
    num_i, num_j = len(gpus), len(cpus)
    sizes = np.arange(1, n_max + 1)
    pairs = num_i * n_max                    # n_iN at index i * n_max + (N - 1)
    ns, mj = slice(0, pairs), slice(pairs, pairs + num_j)
    zs = slice(pairs + num_j, pairs + num_j + n_max)
    width = pairs + num_j + n_max
    flops = np.array([s.relative_flops for s in gpus])
    gpu_count = np.array([max(s.gpus, 1) for s in gpus], dtype=np.int64)
    # e[i, N - 1] = S_i(N) / N
    efficiency = np.array([scaling_for(spec, deep.fits).speedup(sizes) / sizes for spec in gpus])
    rows: list[tuple[np.ndarray, float, float]] = []

    def row(**parts: np.ndarray | float) -> np.ndarray:
        vector = np.zeros(width)
        for name, values in parts.items():
            vector[{"n": ns, "m": mj, "z": zs}[name]] = values
        return vector

    def per_type(values: np.ndarray) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=float), n_max)

    spot = np.array([s.spot_usd_per_hour for s in gpus])
    on_demand = np.array([s.on_demand_usd_per_hour for s in cpus])
    rows.append((row(n=per_type(spot), m=on_demand), -np.inf, deep.budget_usd_per_hour))  # (1)
    for family in sorted({s.family for s in gpus}):
        quota = catalog.quota_vcpus(family, Market.SPOT)
        if quota is not None:
            mask = [s.vcpus if s.family == family else 0 for s in gpus]
            rows.append((row(n=per_type(mask)), -np.inf, quota))                          # (2)
    for family in sorted({s.family for s in cpus}):
        quota = catalog.quota_vcpus(family, Market.ON_DEMAND)
        if quota is not None:
            mask = np.array([s.vcpus if s.family == family else 0 for s in cpus], float)
            rows.append((row(m=mask), -np.inf, quota))                                    # (3)
    rows.append((row(m=np.array([s.memory_gb for s in cpus])),
                 deep.checkpoint_memory_gb, np.inf))                                      # (4)
    rows.append((row(n=np.full(pairs, deep.stream_gbps),
                     m=-np.array([s.network_gbps for s in cpus])), -np.inf, 0.0))          # (5)
    rows.append((row(m=np.ones(num_j)), 1.0, np.inf))                                     # (6)
    rows.append((row(z=np.ones(n_max)), 1.0, 1.0))                                        # (7)
    for k, size in enumerate(sizes):
        column = np.zeros(pairs)
        column[np.arange(num_i) * n_max + k] = gpu_count
        unit = np.zeros(n_max)
        unit[k] = -float(size)
        rows.append((row(n=column, z=unit), 0.0, 0.0))                                    # (8)
    matrix = np.array([r[0] for r in rows])
    lower = np.array([r[1] for r in rows])
    upper = np.array([r[2] for r in rows])
    quota_counts = np.array([catalog.max_count(s, Market.SPOT) for s in gpus])
    n_bounds = np.minimum(quota_counts[:, None], sizes[None, :] // gpu_count[:, None])   # (9)
    upper_vars = np.concatenate([
        n_bounds.ravel(),
        [min(catalog.max_count(s, Market.ON_DEMAND),
             math.floor(deep.budget_usd_per_hour / s.on_demand_usd_per_hour + 1e-9)) for s in cpus],
        np.ones(n_max)]).astype(float)
    integrality = np.ones(width)
    bounds = Bounds(np.zeros(width), upper_vars)
    objective = row(n=-(efficiency * flops[:, None]).ravel())
    options = {"time_limit": config.time_limit_s, "mip_rel_gap": 1e-9}
    first = milp(objective, integrality=integrality, bounds=bounds,
                 constraints=LinearConstraint(matrix, lower, upper), options=options)
    if first.x is None:
        raise LiveputError(f"no mixed tiering plan fits ${deep.budget_usd_per_hour:g}/h with the "
                           "quotas and checkpoint constraints")
    best_value = -float(first.fun)
    # Second solve: the cheapest cluster with (almost) the same effective FLOPS.
    tolerance = 1e-7 * max(best_value, 1.0)
    cost = row(n=per_type(spot), m=on_demand)
    second = milp(cost, integrality=integrality, bounds=bounds,
                  constraints=[LinearConstraint(matrix, lower, upper),
                               LinearConstraint(-objective, best_value - tolerance, np.inf)],
                  options=options)
    solution = second.x if second.x is not None else first.x
    rounded = np.round(solution).astype(np.int64)
    gpu_counts = rounded[ns].reshape(num_i, n_max).sum(axis=1)
    cpu_counts = rounded[mj]
    items = [InstanceCount(s.name, int(c), Market.SPOT) for s, c in zip(gpus, gpu_counts) if c > 0]
    items += [InstanceCount(s.name, int(c), Market.ON_DEMAND, "checkpoint")
              for s, c in zip(cpus, cpu_counts) if c > 0]
    total_gpus = int(gpu_count @ gpu_counts)
    value = float((flops * gpu_counts) @ efficiency[:, total_gpus - 1])
    usd = float(spot @ gpu_counts + on_demand @ cpu_counts)
    plan = Plan("mixed", tuple(items), usd, "effective_flops", value,
                {"gpus": total_gpus, "effective_flops_per_usd": value / usd})
    reason = (f"MILP optimum (HiGHS) of effective FLOPS over mixes of {num_i} GPU types within "
              f"${deep.budget_usd_per_hour:g}/h")
    return Advice((plan,), reason, {"budget_usd_per_hour": deep.budget_usd_per_hour,
                                    "catalog": catalog.name})
