"""``liveput`` and ``liveput-oracle``: proactive, liveput-optimized training (Parcae's approach).

Model:

- *Each interval* the policy forecasts the next H intervals (``liveput``: the context's
  predictor on the history seen so far; ``liveput-oracle``: the true future as a certain
  forecast, with the true preemptions of each interval as its expected preemptions) and asks the
  MPC optimizer (:mod:`liveput.plan.optimizer`) for the configuration that maximizes expected
  samples over the horizon, migrations included. The migration it picks (intra-stage,
  inter-stage, pipeline, checkpoint restore) costs the seconds of the cost model
  (:mod:`liveput.plan.costs`).
- *When instances are lost* inside an interval, the survivors of each stage regroup into the
  complete pipelines they can form (``D - max_j losses_j``, an intra-stage migration) or move to
  whatever configuration trains most in the rest of the interval (spares fill a stage by an
  inter-stage migration, or the pipeline is re-partitioned), chosen by
  :meth:`LiveputOptimizer.recover`. A stage that lost every replica still has its state on the
  leaving instances during the cloud's preemption notice (Parcae's agents listen to it): when one
  stage's state can be sent within the notice, it moves to a spare or a re-partitioned pipeline
  (rebuild + transfer); otherwise a checkpoint written in the notice, the stage's buddy copy in
  another instance's memory, or the periodic checkpoint (:mod:`liveput.policies.recovery`).
- *Objective* ``cost``: the optimizer maximizes samples per dollar and the policy releases its
  idle spares (they are not billed, and come back only as the cloud grants new instances).
"""

from __future__ import annotations

import numpy as np

from liveput.forecast.base import Forecast
from liveput.forecast.shared import SharedPredictor
from liveput.perf.configuration import Configuration, MigrationKind, ObservationEvent
from liveput.plan import LiveputOptimizer, OptimizerConfig
from liveput.policies.base import POLICIES, Decision, Observation, Policy, PolicyContext
from liveput.policies.recovery import plan_recovery


@POLICIES.register("liveput")
class LiveputPolicy(Policy):
    """Forecast, then optimize liveput over the horizon; regroup survivors after a loss."""

    name = "liveput"
    remembered = ("predictor",)  # a forecaster's record of its own errors

    def __init__(self, context: PolicyContext) -> None:
        super().__init__(context)
        self.optimizer = LiveputOptimizer(
            context.profile,
            context.table,
            context.costs,
            OptimizerConfig(
                horizon=context.horizon,
                interval_s=context.interval_s,
                objective=context.objective,
                spot_price_usd_per_hour=context.spot_price_usd_per_hour,
                on_demand_price_usd_per_hour=context.on_demand_price_usd_per_hour,
            ),
        )
        # Shared: the pools advise pool compares replay one trace (forecast.shared).
        self.predictor = SharedPredictor(context.predictor)

    def forecast(self, observation: Observation) -> Forecast:
        """The forecast of the next H intervals (``liveput``: from the history, less the
        instances whose preemption notice says when they go)."""
        return self.predictor.forecast(
            observation.history,
            self.context.horizon,
            max(self.context.capacity, observation.num_available),
        ).less_known_losses(observation.noticed_ends_s, observation.interval_s)

    def decide(self, observation: Observation) -> Decision:
        if observation.event == ObservationEvent.PREEMPTION:
            return self._recover(observation)
        plan = self.optimizer.decide(
            observation.current,
            observation.num_available,
            self.forecast(observation),
            observation.num_on_demand,
        )
        room = observation.num_available + observation.num_on_demand
        chosen, migration, seconds = plan.configuration, plan.migration, plan.migration_s
        if chosen is not None and chosen.num_instances > room:
            # The plan starts with a configuration that only fits later; now, run the best
            # alternative that fits (or nothing), at the cost of reaching it.
            fitting = next(
                (
                    a
                    for a in plan.alternatives
                    if a.configuration is None or a.configuration.num_instances <= room
                ),
                None,
            )
            if fitting is None or fitting.configuration is None:
                chosen, migration = None, MigrationKind.NONE
            else:
                chosen, migration = fitting.configuration, fitting.migration
            seconds = self.optimizer.migration_s(observation.current, chosen, room)
        return Decision(
            chosen,
            migration=migration,
            downtime_s=seconds,
            expected_samples=plan.expected_samples,
            release=self._spares(chosen, observation),
        )

    def _spares(self, chosen: Configuration | None, observation: Observation) -> int:
        """Idle spot instances to give back: under the ``cost`` objective (which prices only
        the instances a configuration uses), every spare while a configuration runs. Released
        instances come back only as the cloud grants new ones, so while nothing runs the job
        keeps what it has: it is what it starts again on."""
        if self.context.objective != "cost" or chosen is None:
            return 0
        used = chosen.num_instances
        return max(observation.num_available - max(used - observation.num_on_demand, 0), 0)

    def _recover(self, observation: Observation) -> Decision:
        recovery = plan_recovery(self.context, observation)
        plan = self.optimizer.recover(
            recovery.start,
            observation.num_available,
            observation.remaining_s,
            observation.num_on_demand,
            salvage_stages=recovery.salvage_stages,
        )
        runs = plan.configuration is not None
        return Decision(
            plan.configuration,
            migration=plan.migration,
            downtime_s=plan.migration_s,
            expected_samples=plan.expected_samples,
            release=self._spares(plan.configuration, observation),
            checkpoint_s=recovery.checkpoint_s if runs else 0.0,
            rollback_s=recovery.rollback_s if runs else 0.0,
        )


@POLICIES.register("liveput-oracle")
class OraclePolicy(LiveputPolicy):
    """``liveput`` with the true future as its forecast (what perfect forecasting would give)."""

    name = "liveput-oracle"

    def forecast(self, observation: Observation) -> Forecast:
        horizon = self.context.horizon
        future = observation.future
        history = observation.history
        capacity = max(self.context.capacity, observation.num_available)
        counts = np.full(
            horizon,
            history.count[-1] + history.allocated[-1] - history.preempted[-1],
            dtype=np.int64,
        )
        preempted = np.zeros(horizon)
        preempted[0] = history.preempted[-1]
        if future is not None and len(future):
            known = min(horizon, len(future))
            counts[:known] = future.count[:known]
            counts[known:] = future.end_count
            preempted[1:known] = future.preempted[: known - 1]
        certain = Forecast.certain(counts, capacity)
        return Forecast(certain.point, certain.pmf, preempted, np.zeros(horizon), "oracle")
