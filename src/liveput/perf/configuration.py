"""What a decision is about: a data x pipeline configuration, the kinds of migration between two,
and the events that ask for a decision.

These words sit below the planners and the policies (``plan``, ``policies``), the simulator and the
runtime, which all speak them. The Enums are ``str`` Enums: a member equals its value (``"none"``,
``"preemption"``), prints as it, and is written to JSON, to the store and to reports as it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from liveput.errors import LiveputError


@dataclass(frozen=True)
class Configuration:
    """D data-parallel pipelines of P stages."""

    data_parallel: int
    """D: number of pipelines (data-parallel replicas)."""
    pipeline_stages: int
    """P: stages per pipeline."""

    def __post_init__(self) -> None:
        if self.data_parallel < 1 or self.pipeline_stages < 1:
            raise LiveputError(
                f"configuration {self.data_parallel}x{self.pipeline_stages}: D and P must be >= 1"
            )

    @property
    def num_instances(self) -> int:
        return self.data_parallel * self.pipeline_stages

    def __str__(self) -> str:
        return f"{self.data_parallel}x{self.pipeline_stages}"

    @classmethod
    def parse(cls, text: str) -> Configuration:
        """Parse ``DxP`` (e.g. ``4x8``)."""
        try:
            d, p = text.lower().split("x")
            return cls(int(d), int(p))
        except ValueError:
            raise LiveputError(
                f"configuration {text!r} is not of the form DxP (e.g. 4x8)"
            ) from None


class MigrationKind(enum.StrEnum):
    """How a job gets from the configuration that ran to the one that runs next."""

    NONE = "none"
    """Nothing moves: the same configuration on the same instances."""
    INTRA_STAGE = "intra-stage"
    """The same depth; replicas of a stage take over lost slots (no layer moves between
    stages)."""
    INTER_STAGE = "inter-stage"
    """The same depth; some instances receive the layers of another stage."""
    PIPELINE = "pipeline"
    """The depth changes: the layers are re-partitioned over the stages."""
    CHECKPOINT_RESTORE = "checkpoint-restore"
    """Some layers have no live holder and come back from the last checkpoint."""
    RESTART = "restart"
    """Training stops and restarts from a checkpoint in the new configuration."""
    RECONFIGURE = "reconfigure"
    """Bamboo's reconfiguration of its redundant pipelines."""
    FAILOVER = "failover"
    """Bamboo's failover: a replica runs a lost stage as well, at reduced speed."""
    FREE = "free"
    """A change that costs nothing (the ``ideal`` baseline)."""


def migration_kind_of(value: str) -> MigrationKind:
    """The kind named ``value`` (a one-line error when there is none)."""
    try:
        return MigrationKind(value)
    except ValueError:
        raise LiveputError(
            f"unknown migration kind {value!r}; known: "
            f"{', '.join(kind.value for kind in MigrationKind)}"
        ) from None


class ObservationEvent(enum.StrEnum):
    """Why a policy is asked for a decision."""

    INTERVAL = "interval"
    """A decision interval starts."""
    PREEMPTION = "preemption"
    """Instances were just lost inside the interval."""


def observation_event_of(value: str) -> ObservationEvent:
    """The event named ``value`` (a one-line error when there is none)."""
    try:
        return ObservationEvent(value)
    except ValueError:
        raise LiveputError(
            f"unknown observation event {value!r}; known: "
            f"{', '.join(event.value for event in ObservationEvent)}"
        ) from None
