"""The training engine's settings (:class:`liveput.runtime.engine.Engine`)."""

from __future__ import annotations

from dataclasses import dataclass

from liveput.errors import LiveputError
from liveput.perf.types import check_instance_memory_gb


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the training engine."""

    checkpoint_every: int = 10
    """K: checkpoint every K committed steps (0: never)."""
    comm_timeout_s: float = 30.0
    """Timeout of a process-group operation, seconds."""
    outcome_poll_s: float = 2.0
    """How long one wait for a step's outcome blocks before checking for a stop, seconds."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda[:i]`` (NCCL, tensors on the device)."""
    shared_gpu: bool = False
    """Other instances may compute on the same GPU (agents sharing one machine): gloo, each
    message staged through CPU memory, since NCCL refuses two ranks on one GPU."""
    instance_memory_gb: float | None = None
    """The per-instance memory budget, GB: a stage over it is refused (:mod:`.stage_memory`)."""
    checkpoint_spread: float = 0.5
    """Share of the time between two periodic checkpoints (K steps at the median step) over
    which one's write is spread, 0 to 1: a write at the link's full rate held the instance's
    link from its pipeline's activations (1-2 steps slower per checkpoint); a longer spread
    leaves the newest complete checkpoint older by as much. 0: at the link's rate."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0 or self.comm_timeout_s <= 0 or self.outcome_poll_s <= 0:
            raise LiveputError("engine: checkpoint_every >= 0 and positive timeouts required")
        if not 0 <= self.checkpoint_spread < 1:
            raise LiveputError(
                f"engine: checkpoint_spread must be in [0, 1), not {self.checkpoint_spread}"
            )
        check_instance_memory_gb(self.instance_memory_gb, "engine: instance_memory_gb")
