"""The seam between deciding and acting: observation in, decision out.

A policy is pure: it reads an :class:`Observation` (built by an executor: the simulator or the
real runtime's coordinator) and returns a :class:`Decision`. Executors never branch on which policy
they run; every policy-specific effect (a restart to pay, a rollback, a throughput overhead) is
expressed in the decision's fields. Policies are registered by name in :data:`POLICIES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from liveput.errors import LiveputError
from liveput.perf.configuration import (
    Configuration,
    MigrationKind,
    ObservationEvent,
    migration_kind_of,
    observation_event_of,
)
from liveput.perf.costs import MigrationCostModel
from liveput.perf.types import ConfigTable, ModelProfile
from liveput.registry import Registry
from liveput.traces.trace import IntervalTrace


@dataclass(frozen=True)
class Observation:
    """What a policy sees at the start of an interval."""

    time_s: float
    """Time now, seconds since the job started (from the executor's clock)."""
    interval_index: int
    """Index of the interval that starts now."""
    interval_s: float
    """Length of an interval, seconds."""
    history: IntervalTrace
    """Availability seen so far, intervals ``0..interval_index`` (see ``forecast.base``)."""
    num_available: int
    """Spot instances available now."""
    current: Configuration | None
    """The configuration running now (None before the first decision or after a total loss)."""
    num_on_demand: int = 0
    """On-demand instances held (never preempted), in addition to the spot ones."""
    future: IntervalTrace | None = None
    """The true future, from ``interval_index + 1`` on; only an executor that knows it (the
    simulator) fills it, and only oracle policies read it."""
    capacity: int = 0
    """Instances requested from the cloud (an upper bound of the available count)."""
    steps_since_checkpoint_s: float = 0.0
    """Training seconds since the last checkpoint (for checkpoint-based policies)."""
    event: ObservationEvent = ObservationEvent.INTERVAL
    """Why the policy is asked: ``interval`` (an interval starts) or ``preemption`` (instances
    were just lost inside the interval; ``time_s`` is the time of the loss). Given as a string,
    it is read as its :class:`ObservationEvent`."""
    lost_slots: tuple[tuple[int, int], ...] = ()
    """On ``preemption``: the ``(pipeline, stage)`` slots of ``current`` whose instance was lost
    (0-based; ``current`` is the configuration that was hit)."""
    lost_spares: int = 0
    """On ``preemption``: idle spot instances (spares) lost."""
    remaining_s: float = 0.0
    """Seconds left in the interval when the policy is asked (``interval_s`` at its start)."""
    samples_done: float = 0.0
    """Samples trained so far (deadline jobs; 0 otherwise)."""
    samples_remaining: float = 0.0
    """Samples still to train before the job is done (deadline jobs; 0: no fixed amount)."""
    seconds_to_deadline: float = float("inf")
    """Seconds from ``time_s`` to the job's deadline (negative once it has passed; inf: no
    deadline)."""
    on_demand_pending: int = 0
    """On-demand instances requested and still launching (not usable yet, not billed yet)."""
    usd_spent: float = 0.0
    """Dollars paid so far (spot and on-demand)."""
    noticed_ends_s: tuple[float, ...] = ()
    """Seconds from ``time_s`` to the end announced by each preemption notice held by one of the
    ``num_available`` instances (policy seconds, as ``time_s``): they are certain to go by then.
    An executor that hears the cloud's notices fills it (the runtime); the simulator's intervals
    carry none."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "event", observation_event_of(self.event))


@dataclass(frozen=True)
class Provisioning:
    """How many instances the job wants to hold from now on (a target the executor reaches:
    the simulator's emulated cloud or a provider). Pure data: effects live in the executor."""

    spot: int
    """Spot instances to hold and request: those available above it are released (gone for
    the next interval), those below it are asked for (granted as the market allows)."""
    on_demand: int
    """On-demand instances to hold from the next interval on: more are requested now (usable
    after their launch delay), fewer are released now (pending launches first)."""
    spot_hold: int | None = None
    """Most spot instances worth holding, the spares the policy expects to use within its
    horizon included: a provider's holder asks for more up to it and gives back those above it
    (a released spare is a new request later). None: as many as the market offers. The
    simulator, whose market is the trace itself, holds ``spot`` and ignores this."""

    def __post_init__(self) -> None:
        if self.spot < 0 or self.on_demand < 0 or (self.spot_hold or 0) < 0:
            raise LiveputError(
                f"provisioning: spot ({self.spot}), on-demand ({self.on_demand}) and spot to "
                f"hold ({self.spot_hold}) counts must be >= 0"
            )


@dataclass(frozen=True)
class Decision:
    """What to run in the interval that starts now, and what it costs to get there."""

    configuration: Configuration | None
    """The configuration to run (None: run nothing this interval)."""
    migration: MigrationKind = MigrationKind.NONE
    """Kind of migration to reach it (:class:`MigrationKind`: ``none``, ``intra-stage``,
    ``inter-stage``, ``pipeline``, ``checkpoint-restore``, ``restart``...). Given as a string, it
    is read as its kind."""
    downtime_s: float = 0.0
    """Training time lost to reach the configuration (migration, restart), seconds."""
    rollback_s: float = 0.0
    """Training time already done that is lost and must be redone (checkpoint rollback)."""
    throughput_factor: float = 1.0
    """Fraction of the configuration's throughput actually delivered (e.g. redundancy overhead)."""
    expected_samples: float = 0.0
    """The policy's own estimate of the samples this interval (for reports)."""
    release: int = 0
    """Spare instances to give back to the cloud (saves their price)."""
    notes: dict[str, float] = field(default_factory=dict)
    """Extra figures for reports and debugging."""
    num_on_demand: int | None = None
    """On-demand instances to hold from now on (None: keep the executor's current number)."""
    checkpoint_s: float = 0.0
    """Seconds spent saving a checkpoint in this interval (lost training time)."""
    num_instances_used: int | None = None
    """Instances the configuration actually occupies when fewer than ``D * P`` (a degraded mode
    where survivors cover lost stages); None: ``D * P``."""
    provisioning: Provisioning | None = None
    """Instances to hold next (deadline policies); None: the executor's current targets. When
    given, ``num_on_demand`` is its on-demand target (derived when left None)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "migration", migration_kind_of(self.migration))
        if self.provisioning is not None:
            if self.num_on_demand is None:
                object.__setattr__(self, "num_on_demand", self.provisioning.on_demand)
            elif self.num_on_demand != self.provisioning.on_demand:
                raise LiveputError(
                    f"decision: {self.num_on_demand} on-demand instances but provisioning asks "
                    f"for {self.provisioning.on_demand}"
                )
        if self.downtime_s < 0 or self.rollback_s < 0 or self.checkpoint_s < 0:
            raise LiveputError("decision: downtime, rollback and checkpoint seconds must be >= 0")
        if not 0.0 <= self.throughput_factor <= 1.0:
            raise LiveputError(
                f"decision: throughput factor {self.throughput_factor} not in [0, 1]"
            )
        if self.num_instances_used is not None and (
            self.configuration is None
            or not 0 <= self.num_instances_used <= self.configuration.num_instances
        ):
            raise LiveputError("decision: instances used must be within 0..D*P of a configuration")
        if self.release < 0 or (self.num_on_demand is not None and self.num_on_demand < 0):
            raise LiveputError("decision: released and on-demand instances must be >= 0")


@dataclass(frozen=True)
class PolicyContext:
    """What a policy knows about the job before it starts (fixed for the whole run)."""

    profile: ModelProfile
    """The model being trained."""
    table: ConfigTable
    """Throughput and feasibility of every (D, P) up to ``max_instances``."""
    costs: MigrationCostModel
    """Seconds of migrations, restarts and checkpoints."""
    interval_s: float = 60.0
    """Length of a decision interval, seconds."""
    horizon: int = 12
    """Intervals looked ahead by forecasting policies."""
    objective: str = "throughput"
    """``throughput`` or ``cost`` (for policies that optimize either)."""
    spot_price_usd_per_hour: float = 1.25
    """Price of a spot instance-hour."""
    on_demand_price_usd_per_hour: float = 3.06
    """Price of an on-demand instance-hour."""
    capacity: int = 0
    """Spot instances requested from the cloud (upper bound of the available count)."""
    on_demand_budget: int = 0
    """Instances the ``on-demand`` policy rents on-demand (the budget it is compared at)."""
    predictor: str = "auto"
    """Predictor used by forecasting policies."""
    preemption_notice_s: float = 120.0
    """Warning the cloud gives before it preempts an instance (AWS: 120 s, GCP: 30 s; 0: none):
    policies that listen to it may move state off a leaving instance meanwhile."""
    seed: int = 0
    """Seed of any randomness inside a policy."""
    buddy_copies: bool = False
    """The runtime keeps every stage's state, as of its last periodic checkpoint, in another
    instance's host memory (:mod:`liveput.runtime.memory_copies`): a stage lost without a usable
    notice comes back over a link instead of from the checkpoint storage
    (:mod:`liveput.policies.recovery`)."""
    checkpoint_every_s: float = 0.0
    """Training seconds between the job's periodic checkpoints (and buddy copies): a recovery
    from either redoes half of it on average (0: nothing redone is counted)."""

    def __post_init__(self) -> None:
        if not self.checkpoint_every_s >= 0:
            raise LiveputError(
                f"policy context: checkpoint_every_s must be >= 0, got {self.checkpoint_every_s}"
            )
        if self.interval_s <= 0 or self.horizon < 1:
            raise LiveputError("policy context: interval must be positive and horizon >= 1")
        if self.capacity < 0 or self.on_demand_budget < 0:
            raise LiveputError("policy context: capacity and on-demand budget must be >= 0")
        if min(self.spot_price_usd_per_hour, self.on_demand_price_usd_per_hour) < 0:
            raise LiveputError("policy context: prices must be >= 0")
        if self.preemption_notice_s < 0:
            raise LiveputError("policy context: the preemption notice must be >= 0")

    @property
    def max_instances(self) -> int:
        """Most instances any configuration of the table uses."""
        sizes = self.table.data_parallel * self.table.pipeline_stages
        return int(sizes.max(initial=0))


class Policy(ABC):
    """Decides a configuration every interval (and when instances are lost inside one).

    A policy instance serves one job: it may keep state between calls (its own view of the
    job: e.g. the time of its last checkpoint); it is built with ``POLICIES.get(name)(context)``.
    """

    name: str = ""
    remembered: tuple[str, ...] = ()
    """Attributes holding what the policy has seen of its job (not derived from its context):
    what :meth:`refitted` carries over."""

    def __init__(self, context: PolicyContext) -> None:
        self.context = context

    @abstractmethod
    def decide(self, observation: Observation) -> Decision:
        """Return the decision for the interval that starts at ``observation.time_s``."""

    def refitted(self, context: PolicyContext) -> Policy:
        """This policy planning with ``context`` (its table re-fitted to measured step times):
        one made anew for it, remembering what this one saw of the job (:attr:`remembered`).
        Made anew without it, ``reactive`` forgot the count it was configured for and
        restarted into the same configuration at every re-fit."""
        policy = type(self)(context)
        for name in self.remembered:
            setattr(policy, name, getattr(self, name))
        return policy


POLICIES: Registry[type[Policy]] = Registry("policy")


def make_policy(name: str, context: PolicyContext) -> Policy:
    """A new policy instance by name (an unknown name is a one-line error)."""
    return POLICIES.get(name)(context)
