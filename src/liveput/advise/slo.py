"""SLO provisioning (spotDNN): the cheapest heterogeneous spot cluster that reaches a target loss
by a deadline, within quotas.

Notation
    t       worker types (catalog GPU types whose GPUs hold the model's training state)
    x_t     workers of type t (integers); n = sum_t x_t
    p_t     spot $/h of type t;  p_ps on-demand $/h of the parameter server;  v_t vCPUs, F_t family
    T_exp(x), j*(x)   iteration time and iterations to the target loss (``spotdnn.py``)
    f(x)    productive fraction under revocations (``revocation.py``, asynchronous; 1 without model)
    H(x)  = j*(x) T_exp(x) / 3600 / f(x)      hours to the target loss

Objective: minimize cost(x) = H(x) (sum_t p_t x_t + p_ps)  ($ to reach the target).

Constraints
    (1) H(x) <= deadline hours
    (2) sum_{t in F} v_t x_t <= Q(F, spot)          for each family F with a spot quota
    (3) 0 <= x_t <= U_t = min(max_workers_per_type, Q(F_t, spot) / v_t)
    (4) 1 <= n <= max_workers

Search
    exact:  every x in the box (3)-(4): the reference on small cases.
    window: spotDNN's: bounds (3)-(4), types sorted by one worker's speed (samples/s), then a window
            of ``window_types`` consecutive types slides over them and every x supported inside the
            window is scored (vectorized). A window as wide as the type list is the exact search;
            narrower ones trade optimality for speed on large catalogs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from liveput.advise.plans import Advice, InstanceCount, Plan
from liveput.advise.revocation import RevocationModel, RevocationOverhead
from liveput.advise.spotdnn import SpotDNNParams, WorkerType, iterations_to_loss, predict
from liveput.budget import check_memory
from liveput.catalog import Catalog, InstanceSpec, Market
from liveput.errors import LiveputError
from liveput.perf import ModelProfile

SEARCHES = ("window", "exact")


@dataclass(frozen=True)
class SLOConfig:
    """An SLO request."""

    target_loss: float
    """Loss to reach."""
    deadline_hours: float
    """By when, hours."""
    max_workers_per_type: int = 8
    """U: most workers of one type."""
    max_workers: int = 16
    """Most workers in the cluster."""
    window_types: int = 3
    """Width of spotDNN's sliding window over the speed-sorted types."""
    search: str = "window"
    """``window`` (spotDNN) or ``exact`` (every count vector; small cases)."""
    ps_usd_per_hour: float = 0.0
    """p_ps: the parameter server's on-demand price."""
    max_plans: int = 5
    """Plans returned, cheapest first."""
    revocation: RevocationModel | None = None
    """Revocation model applied to every worker (None: no revocations)."""
    overhead: RevocationOverhead = field(default_factory=RevocationOverhead)
    """What one revocation costs."""

    def __post_init__(self) -> None:
        if not self.deadline_hours > 0:
            raise LiveputError(f"--deadline-hours must be > 0, got {self.deadline_hours}")
        if self.max_workers_per_type < 1 or self.max_workers < 1 or self.window_types < 1:
            raise LiveputError("max workers and window width must be >= 1")
        if self.search not in SEARCHES:
            raise LiveputError(f"unknown search {self.search!r}; known: {', '.join(SEARCHES)}")
        if self.ps_usd_per_hour < 0 or self.max_plans < 1:
            raise LiveputError("ps price must be >= 0 and max_plans >= 1")


@dataclass(frozen=True)
class SLOProblem:
    """Worker types, their quotas and the models' parameters."""

    types: tuple[WorkerType, ...]
    """Candidate worker types."""
    params: SpotDNNParams
    """Performance and loss model parameters."""
    vcpu_quota: dict[str, int] = field(default_factory=dict)
    """Spot vCPU quota by family."""

    def __post_init__(self) -> None:
        if not self.types:
            raise LiveputError("an SLO problem needs at least one worker type")
        names = [t.name for t in self.types]
        if len(set(names)) != len(names):
            raise LiveputError(f"worker types repeat a name: {names}")


def worker_type(
    spec: InstanceSpec, profile: ModelProfile, reference_flops_per_gpu: float
) -> WorkerType | None:
    """A catalog type as a spotDNN worker of ``profile`` (None if its GPUs cannot hold the model).

    T_comp scales the profile's measured (or derived) time per iteration on its instance type by
    relative FLOPS per GPU; each GPU runs one micro-batch, so b = micro-batch x GPUs.
    """
    state_gb = profile.num_params * profile.state_bytes_per_param / 1e9
    gpus = max(spec.gpus, 1)
    if spec.gpu_memory_gb and spec.gpu_memory_gb / gpus < state_gb:
        return None
    per_microbatch_s = sum(layer.forward_s + layer.backward_s for layer in profile.layers)
    optimizer_s = sum(layer.optimizer_s for layer in profile.layers)
    speed = spec.relative_flops / gpus / reference_flops_per_gpu
    return WorkerType(
        spec.name,
        (per_microbatch_s + optimizer_s) / speed,
        profile.micro_batch_size * gpus,
        gpus,
        spec.network_gbps,
        spec.spot_usd_per_hour,
        spec.vcpus,
        spec.family,
    )


def problem_from_catalog(
    catalog: Catalog,
    profile: ModelProfile,
    ps_type: str,
    loss_g: Sequence[float] | None = None,
) -> tuple[SLOProblem, InstanceSpec]:
    """The SLO problem of ``profile`` over the catalog's GPU types, with ``ps_type`` as the PS."""
    ps = catalog.get(ps_type)
    reference = next((s for s in catalog.instances if s.name == profile.instance_type.name), None)
    reference_flops = reference.relative_flops / max(reference.gpus, 1) if reference else 350.0
    types = [
        w
        for spec in catalog.gpu_types
        if (w := worker_type(spec, profile, reference_flops)) is not None
    ]
    if not types:
        raise LiveputError(
            f"no GPU type of catalog {catalog.name} holds {profile.model}'s "
            "training state on one GPU"
        )
    params = SpotDNNParams(model_gb=profile.num_params * 4 / 1e9, ps_bandwidth_gbps=ps.network_gbps)
    if loss_g:
        g0, g1, g2, g3, g4 = loss_g  # the five constants of the loss curve (spotdnn.g)
        params = dataclasses.replace(params, g=(g0, g1, g2, g3, g4))
    quota = {
        family: q for (family, market), q in catalog.vcpu_quota.items() if market is Market.SPOT
    }
    return SLOProblem(tuple(types), params, quota), ps


def _box(bounds: list[int], max_workers: int) -> np.ndarray:
    size = math.prod(b + 1 for b in bounds)
    # Each count vector passes through a Python tuple, then an int64 row and its temporaries.
    check_memory(
        f"enumerating the {size:,} count vectors of {len(bounds)} worker types",
        size * (64.0 + 24.0 * len(bounds)),
        "fewer --types or --max-workers, or --search window",
    )
    grids = np.array(list(itertools.product(*[range(b + 1) for b in bounds])), dtype=np.int64)
    total = grids.sum(axis=1)
    return grids[(total >= 1) & (total <= max_workers)]  # (4)


def _score(
    counts: np.ndarray, types: list[WorkerType], problem: SLOProblem, config: SLOConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hours, $/h and cost of each cluster; infeasible ones cost inf."""
    prediction = predict(counts, types, problem.params)
    hours = (
        iterations_to_loss(config.target_loss, prediction, problem.params)
        * prediction.iteration_s
        / 3600.0
    )
    if config.revocation is not None:
        hours = config.revocation.expected_hours(
            hours, prediction.workers, config.overhead, synchronous=False
        )
    usd_per_hour = prediction.usd_per_hour + config.ps_usd_per_hour
    feasible = hours <= config.deadline_hours + 1e-12  # (1)
    for family, quota in problem.vcpu_quota.items():
        vcpus = np.array([t.vcpus if t.family == family else 0 for t in types])
        feasible &= counts @ vcpus <= quota  # (2)
    cost = np.where(feasible, hours * usd_per_hour, np.inf)
    return hours, usd_per_hour, cost


@dataclass(frozen=True)
class ScoredCluster:
    """One cluster the search scored."""

    counts: dict[str, int]
    """Workers per type name (types with none left out)."""
    hours: float
    """H(x): hours to the target loss."""
    usd_per_hour: float
    """Workers' and parameter server's price per hour."""
    cost: float
    """Dollars to the target loss; inf when a constraint fails."""


def search(problem: SLOProblem, config: SLOConfig) -> list[ScoredCluster]:
    """Every scored cluster the chosen search visits (feasible or not), deduplicated."""
    types = list(problem.types)
    upper = []
    for t in types:  # (3)
        quota = problem.vcpu_quota.get(t.family)
        by_quota = quota // max(t.vcpus, 1) if quota is not None else config.max_workers_per_type
        upper.append(min(config.max_workers_per_type, by_quota, config.max_workers))
    one = predict(np.eye(len(types)), types, problem.params)
    speed = np.array([t.batch for t in types]) / one.iteration_s
    order = list(np.argsort(-speed, kind="stable"))
    width = len(types) if config.search == "exact" else min(config.window_types, len(types))
    seen: dict[tuple[tuple[str, int], ...], ScoredCluster] = {}
    for start in range(len(types) - width + 1):
        window = order[start : start + width]
        counts = _box([upper[i] for i in window], config.max_workers)
        if len(counts) == 0:
            continue
        hours, usd, cost = _score(counts, [types[i] for i in window], problem, config)
        for row, h, u, c in zip(counts, hours, usd, cost):
            key = tuple((types[i].name, int(k)) for i, k in zip(window, row) if k > 0)
            if key not in seen:
                seen[key] = ScoredCluster(dict(key), float(h), float(u), float(c))
    return list(seen.values())


def _plan(scored: ScoredCluster, config: SLOConfig, ps_name: str) -> Plan:
    items = [InstanceCount(name, count, Market.SPOT) for name, count in scored.counts.items()]
    if ps_name:
        items.append(InstanceCount(ps_name, 1, Market.ON_DEMAND, "ps"))
    return Plan(
        "parameter-server",
        tuple(items),
        scored.usd_per_hour,
        "cost_usd",
        scored.cost,
        {
            "hours_to_target": scored.hours,
            "deadline_hours": config.deadline_hours,
            "target_loss": config.target_loss,
        },
    )


def advise_slo(problem: SLOProblem, config: SLOConfig, ps_name: str = "") -> Advice:
    """Cheapest plans that reach the target loss by the deadline, cheapest first."""
    visited = search(problem, config)
    feasible = sorted(
        (s for s in visited if np.isfinite(s.cost)),
        key=lambda s: (s.cost, s.hours, sorted(s.counts.items())),
    )
    if not feasible:
        fastest = min(visited, key=lambda s: (s.hours, s.usd_per_hour))
        closest = _plan(fastest, config, ps_name)
        raise LiveputError(
            f"no plan reaches loss {config.target_loss:g} within {config.deadline_hours:g} h; "
            f"closest: {closest.describe()} needs {fastest.hours:.2f} h at "
            f"${fastest.usd_per_hour:.2f}/h"
        )
    plans = tuple(_plan(s, config, ps_name) for s in feasible[: config.max_plans])
    best = feasible[0]
    reason = (
        f"cheapest cluster ({config.search} search) reaching loss {config.target_loss:g} "
        f"in {best.hours:.2f} h <= {config.deadline_hours:g} h: ${best.cost:.2f}"
    )
    if len(feasible) > 1:
        reason += f", ${feasible[1].cost - best.cost:.2f} below the runner-up"
    inputs = {
        "target_loss": config.target_loss,
        "deadline_hours": config.deadline_hours,
        "search": config.search,
        "loss_coefficients": list(problem.params.g),
    }
    return Advice(plans, reason, inputs)
