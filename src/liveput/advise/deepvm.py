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
    (5) n r <= m B_j                    (the tier's network absorbs every node's checkpoint stream)
    (6) m >= 1

Exact method: for each (i, architecture[, j, m]) the best n is the largest one satisfying the
constraints (E grows with n), computed in closed form; every (i, j, m) is scanned. The result
equals exhaustive enumeration of (i, n, j, m) (tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from liveput.advise.catalog import Catalog, InstanceSpec, Market
from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.scaling import LogisticScaling, scaling_for
from liveput.errors import LiveputError

ARCHITECTURES = ("single-anchor", "tiering")
_EPS = 1e-9


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
    max_plans: int = 10
    """Plans returned (the best of each type and architecture, best first)."""
    fits: dict[str, LogisticScaling] = field(default_factory=dict, compare=False, hash=False)
    """The user's scaling fits by type name; others use ``scaling_for``'s defaults."""

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

    @property
    def stream_gbps(self) -> float:
        """r: Gb/s one GPU node streams to the checkpoint tier."""
        return 8.0 * self.checkpoint_gb / self.checkpoint_interval_s

    @property
    def checkpoint_memory_gb(self) -> float:
        return self.checkpoint_gb * self.checkpoint_buffers


def _quota_count(catalog: Catalog, spec: InstanceSpec, market: Market) -> int:
    return catalog.max_count(spec, market)


def _plan(catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, nodes: int,
          cpu: InstanceSpec | None, cpu_nodes: int) -> Plan:
    scaling = scaling_for(gpu, config.fits)
    speedup = float(scaling.speedup(nodes * max(gpu.gpus, 1)))
    if cpu is None:
        items = [InstanceCount(gpu.name, 1, Market.ON_DEMAND, "anchor")]
        if nodes > 1:
            items.append(InstanceCount(gpu.name, nodes - 1, Market.SPOT))
        cost = gpu.on_demand_usd_per_hour + (nodes - 1) * gpu.spot_usd_per_hour
        architecture = "single-anchor"
    else:
        items = [InstanceCount(gpu.name, nodes, Market.SPOT),
                 InstanceCount(cpu.name, cpu_nodes, Market.ON_DEMAND, "checkpoint")]
        cost = nodes * gpu.spot_usd_per_hour + cpu_nodes * cpu.on_demand_usd_per_hour
        architecture = "tiering"
    effective = gpu.relative_flops / max(gpu.gpus, 1) * speedup
    return Plan(architecture, tuple(items), cost, "effective_flops", effective,
                {"gpu_nodes": nodes, "speedup": speedup, "flopp": gpu.flopp,
                 "effective_flops_per_usd": effective / cost})


def _rank_key(plan: Plan) -> tuple[float, float, float, str]:
    return (-round(plan.value, 9), round(plan.usd_per_hour, 9), -plan.metrics["flopp"],
            plan.describe())


def _single_anchor(catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec,
                   budget: float) -> Plan | None:
    if gpu.on_demand_usd_per_hour > budget + _EPS:                          # (1) with n = 1
        return None
    if _quota_count(catalog, gpu, Market.ON_DEMAND) < 1:                     # (2)
        return None
    if gpu.memory_gb + _EPS < config.checkpoint_memory_gb:                   # (4)
        return None
    spot = math.floor((budget - gpu.on_demand_usd_per_hour) / gpu.spot_usd_per_hour + _EPS)  # (1)
    spot = min(spot, _quota_count(catalog, gpu, Market.SPOT))               # (3)
    return _plan(catalog, config, gpu, spot + 1, None, 0)


def _tiering(catalog: Catalog, config: DeepVMConfig, gpu: InstanceSpec, cpu: InstanceSpec,
             budget: float) -> Plan | None:
    max_cpu = min(math.floor(budget / cpu.on_demand_usd_per_hour + _EPS),  # (1) with n = 0
                  _quota_count(catalog, cpu, Market.ON_DEMAND))            # (3)
    if config.checkpoint_memory_gb > 0:
        need = config.checkpoint_memory_gb / cpu.memory_gb if cpu.memory_gb > 0 else math.inf
        min_cpu = max(1, math.ceil(need - _EPS))                           # (4), (6)
    else:
        min_cpu = 1                                                        # (6)
    if min_cpu > max_cpu:
        return None
    m = np.arange(min_cpu, max_cpu + 1)
    by_budget = np.floor((budget - m * cpu.on_demand_usd_per_hour) / gpu.spot_usd_per_hour + _EPS)
    n = np.minimum(by_budget, _quota_count(catalog, gpu, Market.SPOT))     # (1), (2)
    if config.stream_gbps > 0:
        n = np.minimum(n, np.floor(m * cpu.network_gbps / config.stream_gbps + _EPS))  # (5)
    if n.max(initial=0) < 1:
        return None
    best_n = int(n.max())
    # Fewest CPU nodes reaching the largest n: the cheapest way to get the best E.
    best_m = int(m[np.argmax(n == best_n)])
    return _plan(catalog, config, gpu, best_n, cpu, best_m)


def _candidates(catalog: Catalog, config: DeepVMConfig, budget: float) -> list[Plan]:
    plans: list[Plan] = []
    for gpu in catalog.gpu_types:
        if "single-anchor" in config.architectures:
            plan = _single_anchor(catalog, config, gpu, budget)
            if plan is not None:
                plans.append(plan)
        if "tiering" in config.architectures:
            tiered = [p for cpu in catalog.cpu_types
                      if (p := _tiering(catalog, config, gpu, cpu, budget)) is not None]
            if tiered:
                plans.append(min(tiered, key=_rank_key))
    return plans


def _cheapest_plan(catalog: Catalog, config: DeepVMConfig) -> Plan | None:
    """The cheapest feasible plan whatever the budget (what a too-small budget is closest to)."""
    unlimited = sum(spec.on_demand_usd_per_hour + spec.spot_usd_per_hour
                    for spec in catalog.instances) * 64
    options = []
    for gpu in catalog.gpu_types:
        if "single-anchor" in config.architectures and _single_anchor(
                catalog, config, gpu, unlimited) is not None:
            options.append(_plan(catalog, config, gpu, 1, None, 0))
        if "tiering" in config.architectures:
            for cpu in catalog.cpu_types:
                plan = _tiering(catalog, config, gpu, cpu, unlimited)
                if plan is not None:
                    need = max(1, math.ceil(config.checkpoint_memory_gb / cpu.memory_gb - _EPS)
                               if cpu.memory_gb > 0 else 1)
                    if config.stream_gbps > 0 and cpu.network_gbps < config.stream_gbps:
                        need = max(need, math.ceil(config.stream_gbps / cpu.network_gbps - _EPS))
                    options.append(_plan(catalog, config, gpu, 1, cpu, need))
    return min(options, key=lambda p: (p.usd_per_hour, p.describe()), default=None)


def advise_deepvm(catalog: Catalog, config: DeepVMConfig) -> Advice:
    """DeepVM's best plans under the price willingness, best first."""
    if not catalog.gpu_types:
        raise LiveputError(f"catalog {catalog.name} has no GPU type (an entry with 'flops' > 0)")
    if "tiering" in config.architectures and "single-anchor" not in config.architectures \
            and not catalog.cpu_types:
        raise LiveputError(f"catalog {catalog.name} has no CPU type for a checkpoint tier")
    plans = sorted(_candidates(catalog, config, config.budget_usd_per_hour), key=_rank_key)
    if not plans:
        closest = _cheapest_plan(catalog, config)
        if closest is None:
            raise LiveputError("no plan satisfies the quotas and checkpoint constraints of "
                               f"catalog {catalog.name} at any budget")
        raise LiveputError(
            f"budget ${config.budget_usd_per_hour:g}/h is below the cheapest plan; closest: "
            f"{closest.describe()} ({closest.architecture}) at ${closest.usd_per_hour:.4f}/h")
    best = plans[0]
    reason = (f"highest effective FLOPS ({best.value:.0f} = {best.metrics['speedup']:.2f}x "
              f"speedup of {best.metrics['gpu_nodes']:.0f} nodes) within "
              f"${config.budget_usd_per_hour:g}/h")
    if len(plans) > 1:
        reason += f", {best.value / plans[1].value:.2f}x the runner-up ({plans[1].describe()})"
    inputs = {"budget_usd_per_hour": config.budget_usd_per_hour, "catalog": catalog.name,
              "checkpoint_gb": config.checkpoint_gb}
    return Advice(tuple(plans[:config.max_plans]), reason, inputs)


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
                    and gpu.memory_gb + _EPS >= config.checkpoint_memory_gb):
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
                        and n * config.stream_gbps <= m * cpu.network_gbps + _EPS)
                    if feasible:
                        plan = _plan(catalog, config, gpu, n, cpu, m)
                        best = plan if best is None or _rank_key(plan) < _rank_key(best) else best
    return best
