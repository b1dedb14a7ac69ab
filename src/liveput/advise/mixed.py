"""Mixed GPU types in one Tiering cluster (which DeepVM does not do), as a MILP solved by HiGHS.

Notation
    i   GPU types: FLOPS f_i per instance, g_i GPUs, spot price s_i, vCPUs v_i, family F_i
    j   CPU checkpoint types: on-demand price o_j, memory M_j (GB), network B_j (Gb/s), vCPUs v_j
    N   total GPUs of the cluster, 1..N_max;  e_N = S(N) / N, the scaling efficiency of N GPUs
        under one logistic fit S (``MixedConfig.scaling``)
    PW, Q(F, market), K, G, r   as in ``deepvm.py``

Variables: n_i >= 0 and m_j >= 0 integers (spot GPU and on-demand CPU instances), z_N binary (the
cluster has N GPUs), u_N >= 0 (the cluster's FLOPS when it has N GPUs, else 0).

Objective: maximize effective FLOPS  E = e_N * sum_i f_i n_i  =  sum_N e_N u_N  (for one type this
is DeepVM's (f_i / g_i) S(n g_i)); ties go to the lower $/h (a second solve with E fixed).

Constraints
    (1) sum_i s_i n_i + sum_j o_j m_j <= PW
    (2) sum_{i in F} v_i n_i <= Q(F, spot)            for each family F with a spot quota
    (3) sum_{j in F} v_j m_j <= Q(F, on-demand)       for each family F with an on-demand quota
    (4) sum_j M_j m_j >= K G
    (5) r sum_i n_i <= sum_j B_j m_j
    (6) sum_j m_j >= 1
    (7) sum_N z_N = 1
    (8) sum_i g_i n_i = sum_N N z_N
    (9) u_N <= sum_i f_i n_i                           for each N
    (10) u_N <= U z_N, U = N_max max_i f_i / g_i       for each N
Tested against enumeration of all (n, m) on small random catalogs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from liveput.advise.catalog import Catalog, Market
from liveput.advise.deepvm import DeepVMConfig
from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.scaling import DEFAULT_FIT, PUBLISHED_FITS, LogisticScaling
from liveput.errors import LiveputError


@dataclass(frozen=True)
class MixedConfig:
    """A mixed-type request: DeepVM's constraints plus the cluster-wide scaling fit."""

    deepvm: DeepVMConfig
    """Budget and checkpoint constraints (shared with ``deepvm.py``)."""
    scaling: LogisticScaling = field(default_factory=lambda: PUBLISHED_FITS[DEFAULT_FIT])
    """One logistic fit for the whole mixed cluster, over its GPU count."""
    time_limit_s: float = 10.0
    """HiGHS time limit per solve."""

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise LiveputError("time_limit_s must be > 0")


def _efficiency(scaling: LogisticScaling, gpus: np.ndarray) -> np.ndarray:
    return scaling.speedup(gpus) / gpus


def _max_gpus(catalog: Catalog, budget: float) -> int:
    best = 0
    for spec in catalog.gpu_types:
        by_budget = math.floor(budget / spec.spot_usd_per_hour + 1e-9)
        best = max(best, min(by_budget, catalog.max_count(spec, Market.SPOT)) * max(spec.gpus, 1))
    return best


def advise_mixed(catalog: Catalog, config: MixedConfig) -> Advice:
    """The best Tiering cluster of any mix of GPU types, solved as a MILP."""
    deep = config.deepvm
    gpus, cpus = catalog.gpu_types, catalog.cpu_types
    if not gpus or not cpus:
        raise LiveputError(f"catalog {catalog.name}: a mixed tiering plan needs GPU and CPU types")
    n_max = _max_gpus(catalog, deep.budget_usd_per_hour)
    if n_max < 1:
        raise LiveputError(f"budget ${deep.budget_usd_per_hour:g}/h buys no GPU instance")
    num_i, num_j = len(gpus), len(cpus)
    sizes = np.arange(1, n_max + 1)
    ni, mj = slice(0, num_i), slice(num_i, num_i + num_j)
    zs = slice(num_i + num_j, num_i + num_j + n_max)
    us = slice(num_i + num_j + n_max, num_i + num_j + 2 * n_max)
    width = num_i + num_j + 2 * n_max
    flops = np.array([s.relative_flops for s in gpus])
    gpu_count = np.array([max(s.gpus, 1) for s in gpus], dtype=float)
    big_u = n_max * float((flops / gpu_count).max())
    rows: list[tuple[np.ndarray, float, float]] = []

    def row(**parts: np.ndarray | float) -> np.ndarray:
        vector = np.zeros(width)
        for name, values in parts.items():
            vector[{"n": ni, "m": mj, "z": zs, "u": us}[name]] = values
        return vector

    spot = np.array([s.spot_usd_per_hour for s in gpus])
    on_demand = np.array([s.on_demand_usd_per_hour for s in cpus])
    rows.append((row(n=spot, m=on_demand), -np.inf, deep.budget_usd_per_hour))        # (1)
    for family in sorted({s.family for s in gpus}):
        quota = catalog.quota_vcpus(family, Market.SPOT)
        if quota is not None:
            mask = np.array([s.vcpus if s.family == family else 0 for s in gpus], float)
            rows.append((row(n=mask), -np.inf, quota))                                  # (2)
    for family in sorted({s.family for s in cpus}):
        quota = catalog.quota_vcpus(family, Market.ON_DEMAND)
        if quota is not None:
            mask = np.array([s.vcpus if s.family == family else 0 for s in cpus], float)
            rows.append((row(m=mask), -np.inf, quota))                                  # (3)
    rows.append((row(m=np.array([s.memory_gb for s in cpus])),
                 deep.checkpoint_memory_gb, np.inf))                                    # (4)
    rows.append((row(n=np.full(num_i, deep.stream_gbps),
                     m=-np.array([s.network_gbps for s in cpus])), -np.inf, 0.0))        # (5)
    rows.append((row(m=np.ones(num_j)), 1.0, np.inf))                                   # (6)
    rows.append((row(z=np.ones(n_max)), 1.0, 1.0))                                      # (7)
    rows.append((row(n=gpu_count, z=-sizes.astype(float)), 0.0, 0.0))                   # (8)
    for k in range(n_max):
        unit = np.zeros(n_max)
        unit[k] = 1.0
        rows.append((row(u=unit, n=-flops), -np.inf, 0.0))                              # (9)
        rows.append((row(u=unit, z=-big_u * unit), -np.inf, 0.0))                       # (10)
    matrix = np.array([r[0] for r in rows])
    lower = np.array([r[1] for r in rows])
    upper = np.array([r[2] for r in rows])
    upper_vars = np.concatenate([
        [min(catalog.max_count(s, Market.SPOT), n_max) for s in gpus],
        [min(catalog.max_count(s, Market.ON_DEMAND),
             math.floor(deep.budget_usd_per_hour / s.on_demand_usd_per_hour + 1e-9)) for s in cpus],
        np.ones(n_max), np.full(n_max, big_u)]).astype(float)
    integrality = np.concatenate([np.ones(num_i + num_j + n_max), np.zeros(n_max)])
    bounds = Bounds(np.zeros(width), upper_vars)
    efficiency = _efficiency(config.scaling, sizes.astype(float))
    objective = row(u=-efficiency)
    options = {"time_limit": config.time_limit_s, "mip_rel_gap": 1e-9}
    first = milp(objective, integrality=integrality, bounds=bounds,
                 constraints=LinearConstraint(matrix, lower, upper), options=options)
    if first.x is None:
        raise LiveputError(f"no mixed tiering plan fits ${deep.budget_usd_per_hour:g}/h with the "
                           "quotas and checkpoint constraints")
    best_value = -float(first.fun)
    # Second solve: the cheapest cluster with (almost) the same effective FLOPS.
    tolerance = 1e-7 * max(best_value, 1.0)
    cost = row(n=spot, m=on_demand)
    second = milp(cost, integrality=integrality, bounds=bounds,
                  constraints=[LinearConstraint(matrix, lower, upper),
                               LinearConstraint(-objective, best_value - tolerance, np.inf)],
                  options=options)
    solution = second.x if second.x is not None else first.x
    counts = np.round(solution).astype(int)
    items = [InstanceCount(s.name, int(c), Market.SPOT) for s, c in zip(gpus, counts[ni]) if c > 0]
    items += [InstanceCount(s.name, int(c), Market.ON_DEMAND, "checkpoint")
              for s, c in zip(cpus, counts[mj]) if c > 0]
    total_gpus = int(gpu_count @ counts[ni])
    value = float(flops @ counts[ni]) * float(_efficiency(config.scaling, np.array(total_gpus)))
    usd = float(spot @ counts[ni] + on_demand @ counts[mj])
    plan = Plan("mixed", tuple(items), usd, "effective_flops", value,
                {"gpus": total_gpus, "effective_flops_per_usd": value / usd})
    reason = (f"MILP optimum (HiGHS) of effective FLOPS over mixes of {num_i} GPU types within "
              f"${deep.budget_usd_per_hour:g}/h")
    return Advice((plan,), reason, {"budget_usd_per_hour": deep.budget_usd_per_hour,
                                    "catalog": catalog.name})
