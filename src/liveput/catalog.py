"""Instance catalogs: what can be rented, at which price, within which vCPU quotas.

A catalog is package data (``liveput/data/catalog/*.json``) or a user's JSON file. Two formats are
read: liveput's own (each figure with a source id, sources listed with their dates) and DeepVM's
(``{"instances": [{"name", "type", "ondemand_price", "spot_price", "vCPU", "memory",
"network_bandwidth", "flops"?}], "available_vcpus": {family: {"ondemand", "spot"}}}``), accepted as
is. liveput's format is DeepVM's plus ``gpus``, ``gpu``, ``gpu_memory_gb``, ``sources``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any

from liveput.errors import LiveputError
from liveput.files import read_text_file

BUILTIN_CATALOGS = {"aws": "aws.json", "deepvm-aws": "deepvm_aws.json"}
"""Catalogs shipped as package data, by name."""


class Market(str, Enum):
    """How an instance is rented. The values are the clouds' own words (EC2's
    ``DefaultTargetCapacityType``, the agents' ``LIVEPUT_MARKET``, a registration's ``market``);
    catalog files and advise plans write DeepVM's (:attr:`catalog_name`)."""

    SPOT = "spot"
    """Cheap, preemptible with a notice."""
    ON_DEMAND = "on-demand"
    """Full price, never preempted."""

    @classmethod
    def parse(cls, value: str | Market) -> Market:
        """``spot`` or ``on-demand`` (``ondemand`` too); anything else is a one-line error."""
        if isinstance(value, Market):
            return value
        text = str(value).strip().lower()
        for market in cls:
            if text in (market.value, market.catalog_name):
                return market
        raise LiveputError(f"unknown market {value!r}; known: spot, on-demand")

    @property
    def catalog_name(self) -> str:
        """This market's name in catalog files (``available_vcpus``) and advise plans
        (``market``, :meth:`~liveput.advise.plans.Plan.describe`): DeepVM's ``ondemand``."""
        return _CATALOG_NAMES[self]


_CATALOG_NAMES = {Market.SPOT: "spot", Market.ON_DEMAND: "ondemand"}


@dataclass(frozen=True)
class InstanceSpec:
    """One rentable instance type."""

    name: str
    """Cloud name, e.g. ``g4dn.xlarge``."""
    family: str
    """Quota family letter (AWS counts vCPU quotas per family: ``G``, ``P``, ``C``, ...)."""
    vcpus: int
    """vCPUs per instance (what quotas count)."""
    memory_gb: float
    """Host memory, GB."""
    network_gbps: float
    """Network bandwidth, Gb/s."""
    on_demand_usd_per_hour: float
    """On-demand price per instance-hour."""
    spot_usd_per_hour: float
    """Spot price per instance-hour."""
    relative_flops: float = 0.0
    """Compute speed on DeepVM's relative scale (g3s.xlarge = 100); 0 for CPU-only types."""
    gpus: int = 0
    """GPUs per instance (DeepVM catalogs: 1 when ``flops`` is given, else 0)."""
    gpu: str = ""
    """GPU model (``T4``, ``A10G``, ``A100``, ...), empty when unknown or CPU-only."""
    gpu_memory_gb: float = 0.0
    """Accelerator memory per instance, GB."""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Source id of each figure (keys: ``specs``, ``flops``, ``ondemand_price``, ``spot_price``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise LiveputError("catalog: an instance has an empty name")
        for attr in (
            "vcpus",
            "memory_gb",
            "network_gbps",
            "on_demand_usd_per_hour",
            "spot_usd_per_hour",
            "relative_flops",
            "gpus",
            "gpu_memory_gb",
        ):
            value = getattr(self, attr)
            if not value >= 0:
                raise LiveputError(f"catalog: {self.name}: {attr} must be >= 0, got {value}")
        if self.on_demand_usd_per_hour <= 0 or self.spot_usd_per_hour <= 0:
            raise LiveputError(f"catalog: {self.name}: prices must be > 0")

    @property
    def is_gpu(self) -> bool:
        return self.relative_flops > 0

    def price_usd_per_hour(self, market: Market) -> float:
        return self.spot_usd_per_hour if market is Market.SPOT else self.on_demand_usd_per_hour

    @property
    def flopp(self) -> float:
        """DeepVM's FLOPP: relative FLOPS per spot dollar-hour."""
        return self.relative_flops / self.spot_usd_per_hour


@dataclass(frozen=True)
class Catalog:
    """Instance types and per-family vCPU quotas."""

    name: str
    """Where the catalog came from."""
    instances: tuple[InstanceSpec, ...]
    """The instance types, in file order."""
    vcpu_quota: dict[tuple[str, Market], int]
    """vCPUs allowed per (family, market); a family not listed is unlimited."""
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Source id -> what it is and its date."""

    def __post_init__(self) -> None:
        names = [spec.name for spec in self.instances]
        if len(set(names)) != len(names):
            duplicated = sorted({name for name in names if names.count(name) > 1})
            raise LiveputError(f"catalog {self.name}: duplicated instance types {duplicated}")
        if not self.instances:
            raise LiveputError(f"catalog {self.name}: no instance types")

    def get(self, name: str) -> InstanceSpec:
        for spec in self.instances:
            if spec.name == name:
                return spec
        known = ", ".join(spec.name for spec in self.instances)
        raise LiveputError(f"unknown instance type {name!r} in catalog {self.name}; known: {known}")

    @property
    def gpu_types(self) -> tuple[InstanceSpec, ...]:
        return tuple(spec for spec in self.instances if spec.is_gpu)

    @property
    def cpu_types(self) -> tuple[InstanceSpec, ...]:
        return tuple(spec for spec in self.instances if not spec.is_gpu)

    def max_count(self, spec: InstanceSpec, market: Market) -> int:
        """Most instances of ``spec`` the quota of its family allows in ``market`` (alone)."""
        quota = self.vcpu_quota.get((spec.family, market))
        if quota is None:
            return 1 << 20
        return quota // max(spec.vcpus, 1)

    def quota_vcpus(self, family: str, market: Market) -> int | None:
        return self.vcpu_quota.get((family, market))

    def subset(self, names: list[str]) -> Catalog:
        """The catalog restricted to ``names`` (each must exist)."""
        return replace(self, instances=tuple(self.get(name) for name in names))

    def with_spot_prices(self, prices: dict[str, float], source: str) -> Catalog:
        """A copy with the spot prices of ``prices`` (type -> $/h) and their source."""
        updated = []
        for spec in self.instances:
            if spec.name in prices:
                spec = replace(
                    spec,
                    spot_usd_per_hour=prices[spec.name],
                    sources={**spec.sources, "spot_price": "refresh"},
                )
            updated.append(spec)
        return replace(self, instances=tuple(updated), sources={**self.sources, "refresh": source})


def _number(entry: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = entry.get(key, default)
    if value is None:
        raise LiveputError(f"{where}: missing field {key!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LiveputError(f"{where}: field {key!r} must be a number, got {value!r}")
    return float(value)


def catalog_from_dict(data: Any, name: str) -> Catalog:
    """A catalog from parsed JSON in liveput's or DeepVM's format."""
    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise LiveputError(f"catalog {name}: expected an object with an 'instances' list")
    specs = []
    for index, entry in enumerate(data["instances"]):
        where = f"catalog {name}: instances[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise LiveputError(f"{where}: expected an object with a 'name'")
        where = f"catalog {name}: {entry['name']}"
        flops = _number(entry, "flops", where, 0.0)
        specs.append(
            InstanceSpec(
                name=entry["name"],
                family=str(entry.get("type", entry["name"][:1].upper())),
                vcpus=int(_number(entry, "vCPU", where)),
                memory_gb=_number(entry, "memory", where),
                network_gbps=_number(entry, "network_bandwidth", where),
                on_demand_usd_per_hour=_number(entry, "ondemand_price", where),
                spot_usd_per_hour=_number(entry, "spot_price", where),
                relative_flops=flops,
                gpus=int(_number(entry, "gpus", where, 1.0 if flops > 0 else 0.0)),
                gpu=str(entry.get("gpu", "")),
                gpu_memory_gb=_number(entry, "gpu_memory_gb", where, 0.0),
                sources=dict(entry.get("sources", {})),
            )
        )
    quota: dict[tuple[str, Market], int] = {}
    for family, markets in (data.get("available_vcpus") or {}).items():
        if not isinstance(markets, dict):
            raise LiveputError(f"catalog {name}: available_vcpus[{family!r}] must be an object")
        for market in Market:
            if market.catalog_name in markets:
                quota[(family, market)] = int(
                    _number(
                        markets, market.catalog_name, f"catalog {name}: available_vcpus[{family}]"
                    )
                )
    return Catalog(str(data.get("name", name)), tuple(specs), quota, dict(data.get("sources", {})))


def load_catalog(name_or_path: str | Path = "aws") -> Catalog:
    """A built-in catalog by name (``aws``, ``deepvm-aws``) or a JSON file of either format."""
    if str(name_or_path) in BUILTIN_CATALOGS:
        text = (
            resources.files("liveput.data")
            .joinpath("catalog", BUILTIN_CATALOGS[str(name_or_path)])
            .read_text()
        )
        return catalog_from_dict(json.loads(text), str(name_or_path))
    path = Path(name_or_path)
    if not path.exists():
        raise LiveputError(
            f"catalog {str(path)!r}: no such file; built-in catalogs: {', '.join(BUILTIN_CATALOGS)}"
        )
    text = read_text_file(path, "catalog")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise LiveputError(
            f"catalog {path}: invalid JSON at line {error.lineno}: {error.msg}"
        ) from None
    return catalog_from_dict(data, path.name)
