"""liveput: proactive, liveput-optimized DNN training on preemptible (spot) instances."""

from __future__ import annotations

from typing import TYPE_CHECKING

from liveput.errors import LiveputError

if TYPE_CHECKING:
    from liveput.models.job import Job
    from liveput.models.lazy import empty_parameters, seeded_init
    from liveput.models.training import LRSchedule, TrainingConfig

__version__ = "0.1.0"

__all__ = [
    "Job",
    "LRSchedule",
    "LiveputError",
    "TrainingConfig",
    "__version__",
    "empty_parameters",
    "seeded_init",
]


def __getattr__(name: str) -> object:
    # ``liveput.Job`` imports PyTorch: only when asked for, so the CLI starts fast.
    if name == "Job":
        from liveput.models.job import Job

        return Job
    if name in ("TrainingConfig", "LRSchedule"):
        from liveput.models import training

        return getattr(training, name)
    if name in ("empty_parameters", "seeded_init"):
        from liveput.models import lazy

        return getattr(lazy, name)
    raise AttributeError(f"module 'liveput' has no attribute {name!r}")
