"""What the coordinator's policy plans for: the objective the loop is handed.

- :class:`ThroughputObjective` (the default): the most samples per second. The policy plans with
  the job's throughput table, which is re-fitted to the step times the agents measure.
- :class:`DeadlineObjective`: the job's work by its deadline at the least cost. A deadline policy
  (:mod:`liveput.policies.deadline`) plans with its own table (in trace seconds, never re-fitted);
  it also sees spot and on-demand apart, the work done and left, the time to the deadline and
  what the market holds, and says what to rent: the market carries that out. It is asked every
  interval, also before the first plan or while no instance is up (when the control loop has no
  configuration to ask for).

An objective shapes what the policy is asked and carries out its provisioning; the policy step
(:mod:`.policy`) and the loop (:mod:`.loop`) never ask which objective they have.
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from liveput.perf.estimator import Calibration, calibration_for, estimate_configs
from liveput.perf.types import ConfigTable, ModelProfile
from liveput.policies import (
    Decision,
    Observation,
    Policy,
    PolicyContext,
    Provisioning,
    make_policy,
)
from liveput.policies.deadline import DeadlineContext, make_deadline_policy
from liveput.runtime import keys
from liveput.runtime.decide import CoordinatorConfig, CoordinatorView
from liveput.runtime.planning import require_a_fit
from liveput.runtime.store import Store


class Planner(Protocol):
    """A policy, throughput or deadline: observation in, decision out."""

    def decide(self, observation: Observation) -> Decision: ...


@dataclass(frozen=True)
class Planning:
    """The throughput table the policy plans with, and the policy."""

    calibration: Calibration
    """The estimator's constants the table was scored with."""
    table: ConfigTable
    """Every configuration's throughput (the fastest fit comes from it)."""
    policy: Planner
    """Decides the configuration (and, for a deadline, what to rent)."""


@dataclass(frozen=True)
class MarketReading:
    """What the market holds, as a deadline policy is told."""

    on_demand_pending: int = 0
    """On-demand instances asked for and still launching."""
    usd_spent: float = 0.0
    """Dollars paid so far, spot and on-demand."""


class MarketView(Protocol):
    """The executor's provider as a deadline job sees it: what it reads, and the one thing the
    coordinator has it do (carry out a provisioning decision; only providers call a cloud)."""

    def on_demand_pending(self) -> int:
        """On-demand instances asked for and still launching."""

    def usd_spent(self) -> float:
        """Dollars paid so far, spot and on-demand."""

    def provision(self, provisioning: Provisioning) -> None:
        """Hold what the policy wants from now on."""


@dataclass(frozen=True)
class EarlierCoordinators:
    """What a deadline job's earlier coordinators spent (a resumed or restarted one's account)."""

    elapsed_wall_s: float = 0.0
    """Wall seconds from the job's first coordinator's start to this one's."""
    usd: float = 0.0
    """Dollars their providers billed, as last recorded in the store."""


class CoordinatorObjective(ABC):
    """What the policy plans for; the defaults are an objective that neither provisions nor
    reads the market."""

    provisions_every_interval = False
    """The policy is asked every interval, also when the control loop asks for no
    configuration (the objective provisions)."""
    reads_market = False
    """The policy is told what the market holds (:meth:`read_market`)."""

    @abstractmethod
    def start(self, profile: ModelProfile, config: CoordinatorConfig) -> Planning:
        """The table and policy the job starts with."""

    def refits(self, config: CoordinatorConfig) -> bool:
        """Whether the table is re-fitted to the step times the agents measure."""
        return False

    def refitted(
        self,
        profile: ModelProfile,
        config: CoordinatorConfig,
        calibration: Calibration,
        previous: Planner | None = None,
    ) -> Planning:
        """The table and policy once the estimator is re-fitted to ``calibration`` (asked only
        when :meth:`refits`); the policy remembers what ``previous`` saw of the job."""
        raise NotImplementedError(f"{type(self).__name__} does not re-fit its table")

    def read_market(self) -> MarketReading | None:
        """What the market holds now (None: no market); reads only."""
        return None

    def keep_spending(self, reading: MarketReading) -> None:
        """Keep in the store what ``reading`` says was spent, for a later coordinator (an
        objective that keeps no account: nothing)."""

    def observation(
        self,
        observation: Observation,
        view: CoordinatorView,
        market: MarketReading | None,
        profile: ModelProfile,
        config: CoordinatorConfig,
    ) -> Observation:
        """What the policy sees (the control loop's ``observation``, with this objective's own
        fields)."""
        return observation

    def provision(self, provisioning: Provisioning) -> None:
        """Carry out the policy's provisioning."""

    def recover(self, store: Store, now_unix_s: float) -> None:
        """Take up what an earlier coordinator of the job kept in ``store`` (or keep it there,
        for a later one); ``now_unix_s`` is wall time, comparable across processes."""

    @property
    def earlier(self) -> EarlierCoordinators:
        """What the job's earlier coordinators spent, as :meth:`recover` found it (zeros: an
        objective that keeps no account)."""
        return EarlierCoordinators()


class ThroughputObjective(CoordinatorObjective):
    """The most samples per second (module docstring)."""

    def start(self, profile: ModelProfile, config: CoordinatorConfig) -> Planning:
        """Refused (a one-line error) when no configuration fits the model in memory."""
        planning = self.refitted(profile, config, calibration_for(profile.model))
        require_a_fit(planning.table, profile, config.capacity)
        return planning

    def refits(self, config: CoordinatorConfig) -> bool:
        return config.online_calibration

    def refitted(
        self,
        profile: ModelProfile,
        config: CoordinatorConfig,
        calibration: Calibration,
        previous: Planner | None = None,
    ) -> Planning:
        """Every configuration scored with ``calibration``; a policy that plans with the table
        (remembering what ``previous`` saw of the job)."""
        table = estimate_configs(profile, config.capacity, calibration)
        context = PolicyContext(
            profile=profile,
            table=table,
            costs=config.costs,
            interval_s=config.policy_interval_s,
            horizon=config.horizon,
            capacity=config.capacity,
            predictor=config.predictor,
        )
        policy = (
            previous.refitted(context)
            if isinstance(previous, Policy)
            else make_policy(config.policy, context)
        )
        return Planning(calibration, table, policy)


class DeadlineObjective(CoordinatorObjective):
    """The job's work by its deadline at the least cost (module docstring); ``config.policy``
    names a deadline policy; ``market`` (None: no provider) carries out its provisioning."""

    provisions_every_interval = True
    reads_market = True

    def __init__(self, context: DeadlineContext, market: MarketView | None = None) -> None:
        self.context = context
        self.market = market
        self.store: Store | None = None
        self.elapsed_before_s = 0.0
        """Wall seconds of the job's deadline spent before this coordinator started."""
        self.kept = {"started_unix_s": 0.0, "usd_before": 0.0}
        """What :meth:`recover` keeps in the store (``coord/deadline``)."""
        self._usd_kept = 0.0

    def recover(self, store: Store, now_unix_s: float) -> None:
        """The deadline counts from the job's first coordinator; dollars paid under earlier ones
        (their provider's bill is gone with them) count on."""
        self.store = store
        raw = store.get(keys.coordinator_deadline())
        if raw is None:
            self.kept = {"started_unix_s": now_unix_s, "usd_before": 0.0}
        else:
            kept = json.loads(raw)
            # The bill of the last coordinator, as it last recorded it, joins the earlier ones.
            self.kept = {
                "started_unix_s": float(kept["started_unix_s"]),
                "usd_before": float(kept.get("usd_before", 0.0)) + float(kept.get("usd", 0.0)),
            }
            self.elapsed_before_s = max(now_unix_s - self.kept["started_unix_s"], 0.0)
        self._keep(0.0)

    @property
    def earlier(self) -> EarlierCoordinators:
        return EarlierCoordinators(self.elapsed_before_s, self.kept["usd_before"])

    def seconds_to_deadline(self, time_s: float, config: CoordinatorConfig) -> float:
        """Policy seconds left at this coordinator's policy time ``time_s``, counting the wall
        seconds earlier coordinators of the job spent (scaled to policy seconds)."""
        spent_before_s = self.elapsed_before_s * config.policy_interval_s / config.interval_s
        return self.context.objective.deadline_s - time_s - spent_before_s

    def _keep(self, usd: float) -> None:
        if self.store is not None:
            value = {**self.kept, "usd": usd}
            self.store.set(keys.coordinator_deadline(), json.dumps(value).encode())
            self._usd_kept = usd

    def start(self, profile: ModelProfile, config: CoordinatorConfig) -> Planning:
        return Planning(
            calibration_for(profile.model),
            self.context.policy.table,
            make_deadline_policy(config.policy, self.context),
        )

    def read_market(self) -> MarketReading | None:
        if self.market is None:
            return None
        usd = self.market.usd_spent()
        return MarketReading(self.market.on_demand_pending(), self.kept["usd_before"] + usd)

    def keep_spending(self, reading: MarketReading) -> None:
        usd = reading.usd_spent - self.kept["usd_before"]
        if usd != self._usd_kept:
            self._keep(usd)

    def observation(
        self,
        observation: Observation,
        view: CoordinatorView,
        market: MarketReading | None,
        profile: ModelProfile,
        config: CoordinatorConfig,
    ) -> Observation:
        """Besides: spot and on-demand apart, the work done and left, the time to the deadline
        (policy seconds since the job's first coordinator started), what the market holds."""
        available = observation.num_available
        on_demand = min(
            available,
            sum(
                1
                for m in view.members.values()
                if m.on_demand
                and not (m.noticed or m.left)
                and m.heartbeat_age_s <= config.heartbeat_timeout_s
            ),
        )
        done = float(max(view.committed + 1, 0) * profile.global_batch_size)
        market = market or MarketReading()
        return dataclasses.replace(
            observation,
            num_available=available - on_demand,
            num_on_demand=on_demand,
            samples_done=done,
            samples_remaining=max(self.context.target_samples - done, 0.0),
            seconds_to_deadline=self.seconds_to_deadline(observation.time_s, config),
            on_demand_pending=market.on_demand_pending,
            usd_spent=market.usd_spent,
        )

    def provision(self, provisioning: Provisioning) -> None:
        if self.market is not None:
            self.market.provision(provisioning)


def objective_for(
    deadline: DeadlineContext | None = None, market: MarketView | None = None
) -> CoordinatorObjective:
    """The objective of a job with ``deadline`` (None: the throughput objective)."""
    return ThroughputObjective() if deadline is None else DeadlineObjective(deadline, market)
