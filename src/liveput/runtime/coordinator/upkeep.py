"""The coordinator's upkeep: the throughput table re-fitted, the store pruned, stalls explained.

- Once per interval the throughput table the policy plans with is re-fitted to the step times the
  agents measured (:mod:`liveput.runtime.step_times`, :func:`liveput.perf.online.refit`): the
  estimator learns this hardware as the job runs.
- Once per ``prune.interval_s`` the store is pruned (:mod:`liveput.runtime.prune`): keys no
  reader needs any more are deleted a few per tick, so a days-long job's store stays bounded.
- When no step commits for ``stall_warning_s`` it says why (the last plans and their failure
  reports), once per ``stall_warning_s``.
"""

from __future__ import annotations

import logging

from liveput.perf.estimator import Calibration
from liveput.perf.online import refit
from liveput.perf.types import Measurement, ModelProfile
from liveput.runtime import protocol
from liveput.runtime.clock import Clock
from liveput.runtime.coordinator.observe import JobProgress, Observer
from liveput.runtime.decide import CoordinatorConfig
from liveput.runtime.prune import Pruner, PruneView, checkpoint_point, forgotten, instances_named
from liveput.runtime.step_times import read_measurements
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
REFIT_CHANGE = 0.05
"""The online fit runs again once a configuration is new or its step time moved this much."""


def refitted(
    store: Store, profile: ModelProfile, fitted: tuple[Measurement, ...]
) -> tuple[tuple[Measurement, ...], Calibration] | None:
    """The step times measured now and the estimator's constants fitted to them; None when
    nothing is new since ``fitted`` (the same configurations, each within 5 %)."""
    measurements = tuple(read_measurements(store))
    before = {(m.data_parallel, m.pipeline_stages): m.iteration_s for m in fitted}
    if not measurements or (
        len(before) == len(measurements)
        and all(
            abs(m.iteration_s / before.get((m.data_parallel, m.pipeline_stages), 0.0) - 1)
            <= REFIT_CHANGE
            for m in measurements
        )
    ):
        return None
    calibration = refit(profile, measurements)
    LOG.info(
        "performance model re-fitted to %d measured configurations (%s): %s",
        len(measurements),
        ", ".join(
            f"{m.data_parallel}x{m.pipeline_stages} {m.iteration_s:.3f} s" for m in measurements
        ),
        calibration,
    )
    return measurements, calibration


def prune(
    pruner: Pruner,
    store: Store,
    observer: Observer,
    progress: JobProgress,
    config: CoordinatorConfig,
    clock: Clock,
) -> None:
    """Delete a few dead keys; once per ``prune.interval_s``, find the dead keys."""
    pruner.delete_some()
    now = clock.now_s()
    plan = progress.plan
    if plan is None or not pruner.due(now):
        return
    keys = pruner.keys()
    silent_s = {i: now - observer.seen.setdefault(i, now) for i in instances_named(keys)}
    gone = forgotten(silent_s, set(plan.slots), config.prune.forget_after_s)
    retire_before = pruner.retire_before(
        -1 if progress.started is None else progress.started.generation, now
    )
    pruner.plan_pass(
        PruneView(
            plan.generation, progress.committed, retire_before, checkpoint_point(store), gone
        ),
        keys,
        plan.epoch,
        now,
    )
    # The observer's own records of what is pruned go too (they would grow as the keys did).
    observer.forget(gone, retire_before)


class StallWatch:
    """Says why no step commits, once per ``warning_s``."""

    def __init__(self, warning_s: float) -> None:
        self.warning_s = warning_s
        self.warned_s: float | None = None
        """Clock time of the last warning (None: none since a step committed)."""

    def watch(self, now: float, progress: JobProgress, status: str, observer: Observer) -> None:
        stalled_s = now - progress.last_commit_s
        if stalled_s < self.warning_s:
            self.warned_s = None
            return
        if self.warned_s is not None and now - self.warned_s < self.warning_s:
            return
        self.warned_s = now
        lines = []
        newest = -1 if progress.plan is None else progress.plan.generation
        for generation in range(max(0, newest - 2), newest + 1):
            plan = observer.load(generation)
            reasons = {
                i: r.reason for i, r in protocol.failures(observer.store, generation).items()
            }
            if plan is not None:
                lines.append(
                    f"plan {generation} ({plan.kind} {plan.data_parallel}x"
                    f"{plan.pipeline_stages} from step {plan.start_step}): "
                    + (
                        "; ".join(f"instance {i}: {r}" for i, r in sorted(reasons.items()))
                        or "no failure reported"
                    )
                )
        LOG.warning(
            "no step committed for %.0f s (last committed %d; %s). %s",
            stalled_s,
            progress.committed,
            status,
            " | ".join(lines),
        )
