"""What the coordinator's decision sees and says: the :class:`CoordinatorView` of the job, each
:class:`Member` in it, and the :class:`Action` decided (:mod:`liveput.runtime.decide` has the rules,
and re-exports these where they have always been imported from)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from liveput.perf.configuration import Configuration
from liveput.runtime.protocol import FailureReport, RuntimePlan

__all__ = ["Action", "ActionKind", "Choose", "CoordinatorView", "Member", "moves_after_s"]


@dataclass(frozen=True)
class Member:
    """One registered instance, as the coordinator sees it."""

    host: str
    """Address the others reach it at."""
    heartbeat_age_s: float
    """Seconds since its heartbeat last moved."""
    noticed: bool = False
    """It has a preemption notice (alive, can still send its layers)."""
    on_demand: bool = False
    """It is rented on-demand (never preempted): the planner spreads such over the stages."""
    left: bool = False
    """It said it left the job, or the cloud said its instance ended (``gone/<id>``)."""
    done: bool = False
    """It applied the job's last step and says so (its store writes are over)."""
    layers: tuple[int, ...] = ()
    """Layers it holds at ``(held_epoch, held_step)``."""
    held_epoch: int = -1
    """Restore epoch of its layers' values (-1: holds nothing known)."""
    held_step: int = -2
    """Last step applied to its layers."""
    reported: int = -1
    """Newest generation whose end it reported (its failure or its holdings after the end)."""
    arrived: bool = False
    """It arrived at the plan's start."""
    notice_age_s: float = 0.0
    """Seconds since its notice was first seen."""
    notice_lead_s: float | None = None
    """Seconds from its notice to its end, as the notice says (None: the notice gives none)."""

    def going(self, margin_s: float) -> bool:
        """It has a notice and less than ``margin_s`` of its lead left (module docstring)."""
        return self.noticed and self.notice_age_s >= self.moves_after_s(margin_s)

    def past_announced_end(self) -> bool:
        """Its notice gave a lead and that lead is spent."""
        return (
            self.noticed
            and self.notice_lead_s is not None
            and self.notice_age_s >= self.notice_lead_s
        )

    def moves_after_s(self, margin_s: float) -> float:
        """Seconds after its notice at which the job moves off it."""
        return moves_after_s(self.notice_lead_s, margin_s)

    def end_in_s(self) -> float | None:
        """Seconds left before the end its notice announces (None: no notice, or one that
        announces no end); negative once that end has passed."""
        if not self.noticed or self.notice_lead_s is None:
            return None
        return self.notice_lead_s - self.notice_age_s


def moves_after_s(lead_s: float | None, margin_s: float) -> float:
    """Seconds after a notice with lead ``lead_s`` (None: none given) at which the job moves off
    its instance: the coordinator plans without it from then, and its agent leaves by the same
    rule."""
    return 0.0 if lead_s is None else max(0.0, lead_s - margin_s)


@dataclass(frozen=True)
class CoordinatorView:
    """Everything a decision depends on."""

    now_s: float
    """Wall seconds since the coordinator started."""
    members: Mapping[int, Member]
    """Registered instances."""
    plan: RuntimePlan | None
    """The newest published plan."""
    started: RuntimePlan | None
    """The newest plan that ran (None: none yet)."""
    committed: int
    """The last step committed (-1: none)."""
    fenced: bool = False
    """The step after ``committed`` was aborted although this coordinator did not plan it."""
    all_arrived: bool = False
    """Every instance of the plan arrived."""
    plan_age_s: float = 0.0
    """Seconds since the plan was published (or first seen)."""
    failures: Mapping[int, FailureReport] = field(default_factory=dict)
    """Failure reports of the plan's generation."""
    failure_age_s: float = 0.0
    """Seconds since its first failure report was seen."""
    failed_in_row: int = 0
    """Plans in a row, the newest last, that failed or were superseded before running."""
    latest_checkpoint: int | None = None
    """Step of the newest complete checkpoint."""
    last_step_recorded: bool = False
    """The ledger has the job's last step."""
    finish_age_s: float = 0.0
    """Seconds since the last step was seen committed."""
    interval_due: bool = False
    """An interval decision is due."""
    arrival: bool = False
    """Instances registered outside every plan so far, and none for ``arrival_settle_s``:
    the policy is asked now rather than at the next interval (Rule 7). True once per arrival."""
    checkpoint_requested: bool = False
    """The plan's instances were asked to checkpoint the step they end at, and the plan was
    fenced for it (Rule 9)."""
    checkpoint_request_age_s: float = 0.0
    """Seconds since that request was first seen."""
    step_s: float | None = None
    """The plan's generation's measured median step time, seconds; until it has one, its
    configuration's in earlier generations (None: not measured, or no instance has a notice:
    only Rule 9 reads it)."""
    checkpoint_write_s: float | None = None
    """Seconds the newest checkpoint that recorded it took to write, from its writer's
    snapshot; until one has, the write estimated for the plan where the coordinator has an
    estimate (None: neither; as ``step_s``, only while an instance has a notice)."""
    auto_notice_margin_s: float = 20.0
    """The notice margin ``--notice-margin auto`` gives now, wall seconds: the executor's
    ``notice_margin_safety`` x the move measured (or, until one is, predicted), at least
    ``notice_margin_min_s``; a fixed ``notice_margin_s`` overrides it."""
    fewest_instances: int = 1
    """The fewest instances a configuration of the job runs on (the coordinator's table)."""
    registration_age_s: float = 0.0
    """Seconds since the newest member registered (Rule 1; 0 before any has)."""
    instances_held: int | None = None
    """Instances the objective's latest provisioning holds (a deadline job's market; None: no
    provisioning yet, or the market offers them all): a first plan waits for no more."""


class ActionKind(str, enum.Enum):
    """What the executor does."""

    NONE = "none"
    """Nothing: training goes on."""
    WAIT = "wait"
    """Nothing yet, for the reason in ``status`` (instances, notices settling, a culprit)."""
    REPLAN = "replan"
    """Fence the running generation and publish a plan for ``target``."""
    FINISH = "finish"
    """Mark the job done."""
    CHECKPOINT = "checkpoint"
    """Ask the running generation's instances to checkpoint the step they end at, and fence
    the generation at the next step boundary (Rule 9)."""


@dataclass(frozen=True)
class Wanted:
    """A configuration the rules want from the policy before their action is whole (decide
    without a ``choose``): the policy is asked ``choose(num_available, event, lost_slots)``
    and :func:`liveput.runtime.decide.complete` makes the action of its answer."""

    num_available: int
    event: str
    lost_slots: tuple[tuple[int, int], ...] = ()
    unless_running: Configuration | None = None
    """Rule 7: the configuration running; only an answer that differs replans."""


@dataclass(frozen=True)
class Action:
    """A decision of the coordinator."""

    kind: ActionKind
    status: str
    """What the job is doing, for people (progress display, logs)."""
    reason: str = ""
    """Why a plan: start, loss, failure, recovery or interval."""
    target: Configuration | None = None
    """Configuration of the new plan."""
    workers: tuple[int, ...] = ()
    """Instances that may take a slot, in order."""
    senders: tuple[int, ...] = ()
    """Going instances (module docstring) that may only send layers."""
    holdings: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """Current holders' layers (at ``committed``), of workers and senders."""
    restore: bool = False
    """Every layer from the newest complete checkpoint, whatever the holders have."""
    suspects: frozenset[int] = frozenset()
    """Plan members left out as lost or suspect."""
    lost_slots: tuple[tuple[int, int], ...] = ()
    """Slots of the running plan that were lost (for the policy)."""
    noticed_workers: tuple[int, ...] = ()
    """Workers that are going (Rule 6: no other instance is up)."""
    notice_margin_s: float | None = None
    """For a plan: the notice margin it was decided with, wall seconds (its agents leave by
    it)."""
    checkpoint_before_s: float | None = None
    """For a checkpoint (Rule 9): seconds left before the earliest end the notices of the
    last holders announce, by which the checkpoint is to be written."""
    wanted: Wanted | None = None
    """Set while the action waits for the policy's configuration (:class:`Wanted`)."""


Choose = Callable[[int, str, tuple[tuple[int, int], ...]], Configuration | None]
"""``choose(num_available, event, lost_slots)``: the configuration to run (the policy's answer
fitted to what is available), or None when nothing can run."""
