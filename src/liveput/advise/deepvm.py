"""DeepVM: the best cluster of one GPU type (spot, with on-demand checkpoint keepers) under a
price willingness, solved exactly.

Notation
    i       a GPU instance type: relative FLOPS f_i, spot price s_i, on-demand price o_i ($/h),
            vCPUs v_i, host memory M_i (GB), family F_i; scaling S_i(n) (logistic, ``scaling.py``)
    j       a CPU instance type (checkpoint node): on-demand price o_j, memory M_j, network B_j Gb/s
    n       GPU nodes; m   CPU checkpoint nodes
    PW      price willingness, $/h;  Q(F, market)  vCPU quota of family F in a market
    G       checkpoint size (GB), K checkpoint buffers kept, T_c checkpoint interval (s);
            r = 8 G / T_c is the Gb/s one GPU node streams to the checkpoint tier

Objective (both architectures): maximize effective FLOPS  E = (f_i / g_i) S_i(n g_i), with g_i GPUs
per instance (DeepVM's fits are per single-GPU node, so S counts GPUs); ties go to the lower
$/h, then to the higher FLOPP. S_i grows with n, so the price willingness is spent on as many nodes
as the constraints allow: that is how DeepVM's published $3/h plan (17 g4dn.xlarge spot + 1 CPU
node) arises. FLOPP = f_i / s_i ranks the types (reported with each plan).

Single Anchor (1 on-demand node of type i keeps the checkpoints, n - 1 spot nodes of type i):
    (1) o_i + (n - 1) s_i <= PW
    (2) v_i <= Q(F_i, on-demand)
    (3) (n - 1) v_i <= Q(F_i, spot)
    (4) M_i >= K G                      (the anchor holds K checkpoints in host memory)
Tiering (n spot nodes of type i, m >= 1 on-demand CPU nodes of one type j):
    (1) n s_i + m o_j <= PW
    (2) n v_i <= Q(F_i, spot)
    (3) m v_j <= Q(F_j, on-demand)
    (4) m M_j >= K G                    (the tier holds K checkpoints in memory)
    (5) n < m NSP(min(B_i, B_j))        (DeepVM's network saturation: at most NSP - 1 GPU nodes
                                         per checkpoint node, NSP by the slower link's Gb/s)
        or, with ``network_bound="stream"`` (liveput's own bound),
        n r <= m B_j                    (the tier's network absorbs every node's checkpoint stream)
    (6) m >= 1

NSP(B) is DeepVM's measured saturation point (its published artifact's ``solution/run.py``):
0.3 Gb/s -> 2, 1.7 -> 12, 5 -> 16, 10 -> 20, 12.5 -> 24, 15 -> 24, 25 -> 28, 30 -> 32, taken at
the largest tabulated bandwidth not above B (the first entry below 0.3 Gb/s, 32 above 30).

With a revocation model (``revocation.py``) the objective is expected effective FLOPS E f(n_spot),
f the productive fraction of a synchronous cluster, which can peak before the largest n.

Exact method: feasibility is monotone in n, so for each (i, architecture) the largest feasible n
is found in closed form over every (j, m) (vectorized over m), the objective is scored for every
n up to it, and the cheapest (j, m) supporting the best n is kept. The result
equals exhaustive enumeration of (i, n, j, m) (tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.revocation import RevocationModel, RevocationOverhead
from liveput.advise.scaling import LogisticScaling, scaling_for
from liveput.catalog import Catalog, InstanceSpec, Market
from liveput.errors import LiveputError

ARCHITECTURES = ("single-anchor", "tiering")
NETWORK_BOUNDS = ("saturation", "stream")
_EPS = 1e-9
SATURATION_POINTS = (
    (0.3, 2),
    (1.7, 12),
    (5.0, 16),
    (10.0, 20),
    (12.5, 24),
    (15.0, 24),
    (25.0, 28),
    (30.0, 32),
)
"""DeepVM's network saturation point NSP by link bandwidth (Gb/s -> GPU nodes per checkpoint
node, strict): the (5) of its published search."""


def saturation_point(bandwidth_gbps: float) -> int:
    """NSP at the largest tabulated bandwidth not above ``bandwidth_gbps`` (the first entry
    below it)."""
    point = SATURATION_POINTS[0][1]
    for gbps, nodes in SATURATION_POINTS:
        if bandwidth_gbps + _EPS >= gbps:
            point = nodes
    return point


@dataclass(frozen=True)
class DeepVMConfig:
    """A DeepVM request."""

    budget_usd_per_hour: float
    """Price willingness PW: most the whole cluster may cost per hour."""
    checkpoint_gb: float = 1.0
    """Checkpoint size G (model and optimizer state), GB."""
    checkpoint_buffers: int = 2
    """Checkpoints K kept in memory by the anchor or the tier (2: the last good one and the one
    being written)."""
    checkpoint_interval_s: float = 60.0
    """Seconds T_c between checkpoints each GPU node streams to the checkpoint tier."""
    architectures: tuple[str, ...] = ARCHITECTURES
    """Architectures considered."""
    network_bound: str = "saturation"
    """Tiering's (5): ``saturation``, DeepVM's own (fewer than NSP GPU nodes per checkpoint
    node), or ``stream``, liveput's (the tier's Gb/s absorbs every node's checkpoint stream)."""
    max_plans: int = 10
    """Plans returned (the best of each type and architecture, best first)."""
    fits: dict[str, LogisticScaling] = field(default_factory=dict, compare=False, hash=False)
    """The user's scaling fits by type name; others use ``scaling_for``'s defaults."""
    revocation: RevocationModel | None = None
    """When given, plans are ranked by expected effective FLOPS: E times the productive fraction
    of a synchronous cluster whose spot nodes are revoked at this model's rate."""
    overhead: RevocationOverhead = field(default_factory=RevocationOverhead)
    """What one revocation costs (with ``revocation``)."""

    def __post_init__(self) -> None:
        if not self.budget_usd_per_hour > 0:
            raise LiveputError(f"--budget-usd-per-hour must be > 0, got {self.budget_usd_per_hour}")
        if not self.checkpoint_gb >= 0:
            raise LiveputError(f"--checkpoint-gb must be >= 0, got {self.checkpoint_gb}")
        if self.checkpoint_buffers < 1 or not self.checkpoint_interval_s > 0:
            raise LiveputError("checkpoint buffers must be >= 1 and the interval > 0")
        unknown = set(self.architectures) - set(ARCHITECTURES)
        if unknown or not self.architectures:
            raise LiveputError(f"unknown architectures {sorted(unknown)}; known: {ARCHITECTURES}")
        if self.max_plans < 1:
            raise LiveputError("max_plans must be >= 1")
        if self.network_bound not in NETWORK_BOUNDS:
            raise LiveputError(
                f"unknown network bound {self.network_bound!r}; known: {', '.join(NETWORK_BOUNDS)}"
            )

    @property
    def objective_name(self) -> str:
        return "effective_flops" if self.revocation is None else "expected_effective_flops"

    @property
    def stream_gbps(self) -> float:
        """r: Gb/s one GPU node streams to the checkpoint tier."""
        return 8.0 * self.checkpoint_gb / self.checkpoint_interval_s

    @property
    def checkpoint_memory_gb(self) -> float:
        return self.checkpoint_gb * self.checkpoint_buffers


def _quota_count(catalog: Catalog, spec: InstanceSpec, market: Market) -> int:
    return catalog.max_count(spec, market)


def _plan(
    catalog: Catalog,
    config: DeepVMConfig,
    gpu: InstanceSpec,
    nodes: int,
    cpu: InstanceSpec | None,
    cpu_nodes: int,
) -> Plan:
    speedup = float(scaling_for(gpu, config.fits).speedup(nodes * max(gpu.gpus, 1)))
    if cpu is None:
        items = [InstanceCount(gpu.name, 1, Market.ON_DEMAND, "anchor")]
        if nodes > 1:
            items.append(InstanceCount(gpu.name, nodes - 1, Market.SPOT))
        cost = gpu.on_demand_usd_per_hour + (nodes - 1) * gpu.spot_usd_per_hour
        architecture = "single-anchor"
    else:
        items = [
            InstanceCount(gpu.name, nodes, Market.SPOT),
            InstanceCount(cpu.name, cpu_nodes, Market.ON_DEMAND, "checkpoint"),
        ]
        cost = nodes * gpu.spot_usd_per_hour + cpu_nodes * cpu.on_demand_usd_per_hour
        architecture = "tiering"
    spot_nodes = nodes - 1 if cpu is None else nodes
    value = float(_objective(config, gpu, np.array(nodes), np.array(spot_nodes)))
    effective = gpu.relative_flops / max(gpu.gpus, 1) * speedup
    metrics = {
        "gpu_nodes": nodes,
        "speedup": speedup,
        "flopp": gpu.flopp,
        "effective_flops": effective,
        "effective_flops_per_usd": effective / cost,
    }
    if config.revocation is not None:
        fraction = float(config.revocation.productive_fraction(spot_nodes, config.overhead))
        metrics["productive_fraction"] = fraction
    return Plan(architecture, tuple(items), cost, config.objective_name, value, metrics)


def _rank_key(plan: Plan) -> tuple[float, float, float, str]:
    return (
        -round(plan.value, 9),
        round(plan.usd_per_hour, 9),
        -plan.metrics["flopp"],
        plan.describe(),
    )


def _anchor_max_nodes(
    catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, budget: float
) -> int:
    """Largest n of a feasible Single Anchor cluster of ``gpu`` (0 if none)."""
    if gpu.on_demand_usd_per_hour > budget + _EPS:  # (1) with n = 1
        return 0
    if _quota_count(catalog, gpu, Market.ON_DEMAND) < 1:  # (2)
        return 0
    if gpu.memory_gb + _EPS < config.checkpoint_memory_gb:  # (4)
        return 0
    spot = math.floor((budget - gpu.on_demand_usd_per_hour) / gpu.spot_usd_per_hour + _EPS)  # (1)
    return min(spot, _quota_count(catalog, gpu, Market.SPOT)) + 1  # (3)


def _tier_sizes(
    catalog: Catalog, config: DeepVMConfig, cpu: InstanceSpec, budget: float
) -> np.ndarray:
    """Feasible checkpoint-tier sizes m of ``cpu`` by (1) with n = 0, (3), (4) and (6)."""
    max_cpu = min(
        math.floor(budget / cpu.on_demand_usd_per_hour + _EPS),
        _quota_count(catalog, cpu, Market.ON_DEMAND),
    )  # (1), (3)
    if config.checkpoint_memory_gb > 0:
        need = config.checkpoint_memory_gb / cpu.memory_gb if cpu.memory_gb > 0 else math.inf
        min_cpu = max(1, math.ceil(need - _EPS)) if math.isfinite(need) else max_cpu + 1  # (4)
    else:
        min_cpu = 1  # (6)
    return np.arange(min_cpu, max_cpu + 1)


def _tier_max_nodes(
    catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, cpu: InstanceSpec, budget: float
) -> tuple[np.ndarray, np.ndarray]:
    """For each feasible tier size m, the largest n of ``gpu`` it allows (arrays m, n)."""
    m = _tier_sizes(catalog, config, cpu, budget)
    by_budget = np.floor((budget - m * cpu.on_demand_usd_per_hour) / gpu.spot_usd_per_hour + _EPS)
    n = np.minimum(by_budget, _quota_count(catalog, gpu, Market.SPOT))  # (1), (2)
    return m, np.minimum(n, _network_max_nodes(config, gpu, cpu, m)).astype(np.int64)  # (5)


def _network_max_nodes(
    config: DeepVMConfig, gpu: InstanceSpec, cpu: InstanceSpec, m: np.ndarray
) -> np.ndarray:
    """The most GPU nodes ``m`` checkpoint nodes serve by (5)."""
    if config.network_bound == "saturation":
        return m * saturation_point(min(gpu.network_gbps, cpu.network_gbps)) - 1
    if config.stream_gbps > 0:
        return np.floor(m * cpu.network_gbps / config.stream_gbps + _EPS)
    return np.full(np.shape(m), np.inf)


def _best_nodes(config: DeepVMConfig, gpu: InstanceSpec, max_nodes: int, spot_offset: int) -> int:
    """The n in 1..max_nodes of highest objective (feasibility is monotone in n, so every n up
    to the largest feasible one is feasible); ties go to the smaller, cheaper n."""
    nodes = np.arange(1, max_nodes + 1)
    values = _objective(config, gpu, nodes, nodes - spot_offset)
    return int(nodes[int(np.argmax(np.round(values, 9)))])


def _objective(
    config: DeepVMConfig, gpu: InstanceSpec, nodes: np.ndarray, spot_nodes: np.ndarray
) -> np.ndarray:
    scaling = scaling_for(gpu, config.fits)
    effective = gpu.relative_flops / max(gpu.gpus, 1) * scaling.speedup(nodes * max(gpu.gpus, 1))
    if config.revocation is None:
        return effective
    return effective * config.revocation.productive_fraction(spot_nodes, config.overhead)


def _single_anchor(
    catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, budget: float
) -> Plan | None:
    max_nodes = _anchor_max_nodes(catalog, config, gpu, budget)
    if max_nodes < 1:
        return None
    return _plan(catalog, config, gpu, _best_nodes(config, gpu, max_nodes, 1), None, 0)


def _tiering(
    catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, budget: float
) -> Plan | None:
    tiers = {
        cpu.name: _tier_max_nodes(catalog, config, gpu, cpu, budget) for cpu in catalog.cpu_types
    }
    max_nodes = max((int(n.max(initial=0)) for _m, n in tiers.values()), default=0)
    if max_nodes < 1:
        return None
    nodes = _best_nodes(config, gpu, max_nodes, 0)
    # The cheapest tier (type j, fewest m) that supports the chosen n.
    options = []
    for cpu in catalog.cpu_types:
        m, n = tiers[cpu.name]
        fits = np.flatnonzero(n >= nodes)
        if len(fits):
            count = int(m[fits[0]])
            options.append((count * cpu.on_demand_usd_per_hour, cpu.name, cpu, count))
    _cost, _name, cpu, count = min(options, key=lambda option: option[:2])
    return _plan(catalog, config, gpu, nodes, cpu, count)


def _candidates(catalog: Catalog, config: DeepVMConfig, budget: float) -> list[Plan]:
    plans: list[Plan] = []
    for gpu in catalog.gpu_types:
        if "single-anchor" in config.architectures:
            plan = _single_anchor(catalog, config, gpu, budget)
            if plan is not None:
                plans.append(plan)
        if "tiering" in config.architectures:
            plan = _tiering(catalog, config, gpu, budget)
            if plan is not None:
                plans.append(plan)
    return plans


def _cheapest_plan(catalog: Catalog, config: DeepVMConfig) -> Plan | None:
    """The cheapest plan whatever the budget (what a too-small budget is closest to): one GPU
    node, and for Tiering the fewest CPU nodes meeting (3)-(6)."""
    options = []
    for gpu in catalog.gpu_types:
        if (
            "single-anchor" in config.architectures
            and _anchor_max_nodes(catalog, config, gpu, gpu.on_demand_usd_per_hour) >= 1
        ):
            options.append(_plan(catalog, config, gpu, 1, None, 0))
        if "tiering" not in config.architectures or _quota_count(catalog, gpu, Market.SPOT) < 1:
            continue
        for cpu in catalog.cpu_types:
            need = 1.0  # (6)
            if config.checkpoint_memory_gb > 0:
                need = max(
                    need,
                    config.checkpoint_memory_gb / cpu.memory_gb if cpu.memory_gb > 0 else math.inf,
                )  # (4)
            if config.network_bound == "stream" and config.stream_gbps > 0:
                need = max(
                    need,
                    config.stream_gbps / cpu.network_gbps if cpu.network_gbps > 0 else math.inf,
                )  # (5)
            # (5) by saturation: one node is below every NSP (at least 2) for any m >= 1.
            if math.isfinite(need):
                count = math.ceil(need - _EPS)
                if count <= _quota_count(catalog, cpu, Market.ON_DEMAND):  # (3)
                    options.append(_plan(catalog, config, gpu, 1, cpu, count))
    return min(options, key=lambda p: (p.usd_per_hour, p.describe()), default=None)


def advise_deepvm(catalog: Catalog, config: DeepVMConfig) -> Advice:
    """DeepVM's best plans under the price willingness, best first."""
    if not catalog.gpu_types:
        raise LiveputError(f"catalog {catalog.name} has no GPU type (an entry with 'flops' > 0)")
    if (
        "tiering" in config.architectures
        and "single-anchor" not in config.architectures
        and not catalog.cpu_types
    ):
        raise LiveputError(f"catalog {catalog.name} has no CPU type for a checkpoint tier")
    plans = sorted(_candidates(catalog, config, config.budget_usd_per_hour), key=_rank_key)
    if not plans:
        closest = _cheapest_plan(catalog, config)
        if closest is None:
            raise LiveputError(
                "no plan satisfies the quotas and checkpoint constraints of "
                f"catalog {catalog.name} at any budget"
            )
        raise LiveputError(
            f"budget ${config.budget_usd_per_hour:g}/h is below the cheapest plan; closest: "
            f"{closest.describe()} ({closest.architecture}) at ${closest.usd_per_hour:.4f}/h"
        )
    best = plans[0]
    reason = (
        f"highest {best.objective.replace('_', ' ')} ({best.value:.0f}; "
        f"{best.metrics['speedup']:.2f}x "
        f"speedup of {best.metrics['gpu_nodes']:.0f} nodes) within "
        f"${config.budget_usd_per_hour:g}/h"
    )
    if len(plans) > 1:
        reason += f", {best.value / plans[1].value:.2f}x the runner-up ({plans[1].describe()})"
    inputs = {
        "budget_usd_per_hour": config.budget_usd_per_hour,
        "catalog": catalog.name,
        "checkpoint_gb": config.checkpoint_gb,
    }
    return Advice(tuple(plans[: config.max_plans]), reason, inputs)


def enumerate_deepvm(catalog: Catalog, config: DeepVMConfig, max_nodes: int) -> Plan | None:
    """Best plan by exhaustive enumeration of (i, n, j, m), n and m up to ``max_nodes``:
    the reference the exact method is tested against (slow; small catalogs only)."""
    best: Plan | None = None
    budget = config.budget_usd_per_hour
    for gpu in catalog.gpu_types:
        for n in range(1, max_nodes + 1):
            if "single-anchor" in config.architectures and (
                gpu.on_demand_usd_per_hour + (n - 1) * gpu.spot_usd_per_hour <= budget + _EPS
                and _quota_count(catalog, gpu, Market.ON_DEMAND) >= 1
                and n - 1 <= _quota_count(catalog, gpu, Market.SPOT)
                and gpu.memory_gb + _EPS >= config.checkpoint_memory_gb
            ):
                plan = _plan(catalog, config, gpu, n, None, 0)
                best = plan if best is None or _rank_key(plan) < _rank_key(best) else best
            if "tiering" not in config.architectures:
                continue
            for cpu in catalog.cpu_types:
                for m in range(1, max_nodes + 1):
                    feasible = (
                        n * gpu.spot_usd_per_hour + m * cpu.on_demand_usd_per_hour <= budget + _EPS
                        and n <= _quota_count(catalog, gpu, Market.SPOT)
                        and m <= _quota_count(catalog, cpu, Market.ON_DEMAND)
                        and m * cpu.memory_gb + _EPS >= config.checkpoint_memory_gb
                        and (
                            n < m * saturation_point(min(gpu.network_gbps, cpu.network_gbps))
                            if config.network_bound == "saturation"
                            else n * config.stream_gbps <= m * cpu.network_gbps + _EPS
                        )
                    )
                    if feasible:
                        plan = _plan(catalog, config, gpu, n, cpu, m)
                        best = plan if best is None or _rank_key(plan) < _rank_key(best) else best
    return best
