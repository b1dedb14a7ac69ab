"""Performance model: throughput and memory of every (D, P), migration costs, and a profiler."""

from __future__ import annotations

from pathlib import Path

from liveput.errors import LiveputError
from liveput.perf.builtin import BUILTIN_SPECS, builtin_profile
from liveput.perf.costs import MigrationCostModel
from liveput.perf.estimator import Calibration, estimate_configs
from liveput.perf.partition import partition_layers
from liveput.perf.types import ConfigTable, InstanceType, LayerProfile, ModelProfile

LOCAL_MODELS = ("tiny-gpt",)
"""Performance models measured on this machine when asked for (built-in jobs are too, by name:
``liveput perf llama-tiny``)."""


def builtin_model_names() -> list[str]:
    return sorted([*BUILTIN_SPECS, *LOCAL_MODELS])


def load_profile(name_or_path: str) -> ModelProfile:
    """A built-in model by name, or a profile JSON written by ``liveput profile``."""
    if name_or_path in BUILTIN_SPECS:
        return builtin_profile(name_or_path)
    path = Path(name_or_path)
    if name_or_path in LOCAL_MODELS or (path.suffix != ".json" and _is_job(name_or_path)):
        from liveput.perf.profiler import local_profile

        return local_profile(name_or_path)
    if path.suffix == ".json" and path.is_file():
        from liveput.perf.profile_io import read_profile

        return read_profile(path)
    raise LiveputError(
        f"unknown model {name_or_path!r}; built-in: {', '.join(builtin_model_names())} "
        "(or a built-in job, module:function returning a liveput.Job, or a profile .json "
        "written by `liveput profile`)"
    )


def _is_job(name: str) -> bool:
    from liveput.models.reference import is_reference

    if is_reference(name):  # a user's module:function: profiled here, as a built-in job is
        return True
    # Imported here: the job registry imports PyTorch, which the other models never need.
    from liveput.models.jobs import JOBS

    return name in JOBS


__all__ = [
    "Calibration",
    "ConfigTable",
    "InstanceType",
    "LayerProfile",
    "MigrationCostModel",
    "ModelProfile",
    "builtin_model_names",
    "estimate_configs",
    "load_profile",
    "partition_layers",
]
