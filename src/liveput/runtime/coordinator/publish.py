"""What the coordinator writes: what an observation leaves, fences, plans, restore records, events,
checkpoint requests (decide's Rule 9) and when each notice was seen (a restarted coordinator
counts its lead on).

For a new plan it fences the running generation at the next step boundary
(:func:`~liveput.runtime.protocol.fence`), plans it with
:func:`~liveput.runtime.planning.plan_generation` from what the instances hold at the fenced step,
records a restore when the plan restores, and publishes the plan and its event.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

from liveput.perf.types import ModelProfile
from liveput.runtime import keys, protocol
from liveput.runtime.checkpoint import latest_checkpoint, reset_latest
from liveput.runtime.clock import Clock
from liveput.runtime.coordinator.observe import JobProgress, Observed, Observer
from liveput.runtime.decide import Action, CoordinatorConfig, CoordinatorView
from liveput.runtime.memory_copies import CopyRecord, choose_restore
from liveput.runtime.planning import PlanContext, plan_generation
from liveput.runtime.store import Store, readers

LOG = logging.getLogger(__name__)


class Publisher:
    """Writes the coordinator's records and plans to the store."""

    def __init__(
        self,
        store: Store,
        profile: ModelProfile,
        config: CoordinatorConfig,
        clock: Clock,
        started_s: float,
        wall_clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.profile = profile
        self.config = config
        self.clock = clock
        self.started_s = started_s
        """Clock time the coordinator started (events count from it)."""
        self.wall_clock = wall_clock
        """Unix seconds, for what a later coordinator reads (when a notice was seen)."""
        self.notices_kept: set[int] = set()
        """Instances whose notice's ``notice-end/<id>`` is in the store."""

    def record(self, observed: Observed) -> None:
        """What an observation leaves: when each notice was seen; each instance lost (gone or
        noticed) counted once as a preemption; at an interval, the spot instances up (the
        history forecasts are about); a plan that ran for the first time marked started."""
        view = observed.view
        timeout_s = self.config.heartbeat_timeout_s
        self._keep_notices(view)
        for instance, member in view.members.items():
            gone = member.left or member.heartbeat_age_s > timeout_s
            if (gone or member.noticed) and self.store.compare_and_set(
                keys.lost(instance), None, b"1"
            ):
                self.store.add(keys.preemptions(), 1)
        if view.interval_due and view.plan is not None:
            # The history is the spot market's (what forecasts are about): on-demand left out.
            counts = json.loads(self.store.get(keys.coordinator_history()) or b"[]")
            counts.append(
                sum(
                    1
                    for m in view.members.values()
                    if not m.left
                    and not m.noticed
                    and not m.on_demand
                    and m.heartbeat_age_s <= timeout_s
                )
            )
            self.store.set(keys.coordinator_history(), json.dumps(counts).encode())
        if observed.newly_started and view.plan is not None:
            protocol.mark_started(self.store, view.plan.generation)
            self.store.set(keys.coordinator_started(), str(view.plan.generation).encode())

    def _keep_notices(self, view: CoordinatorView) -> None:
        """When each notice was first seen and the end it announces, in unix seconds, once per
        notice (kept if an earlier coordinator wrote it): a restarted coordinator counts its
        lead on from there."""
        wall_now = self.wall_clock()
        for instance, member in view.members.items():
            if not member.noticed or instance in self.notices_kept:
                continue
            seen_unix_s = wall_now - member.notice_age_s
            lead_s = member.notice_lead_s
            record = {
                "seen_unix_s": round(seen_unix_s, 3),
                "end_unix_s": None if lead_s is None else round(seen_unix_s + lead_s, 3),
            }
            self.store.compare_and_set(keys.notice_end(instance), None, json.dumps(record).encode())
            self.notices_kept.add(instance)

    def request_checkpoint(self, action: Action, progress: JobProgress) -> int:
        """Rule 9: ask the running generation's instances to checkpoint the step they end at,
        then fence it at the next step boundary; that step."""
        plan = progress.plan
        assert plan is not None
        # The request first: an instance that sees the fence sees the request.
        self.store.set(
            keys.checkpoint_request(plan.generation),
            json.dumps(
                {"epoch": plan.epoch, "before_s": round(action.checkpoint_before_s or 0.0, 3)}
            ).encode(),
        )
        start = protocol.fence(
            self.store, plan.generation, progress.committed + 1, plan.num_working
        )
        progress.fence = (plan.generation, start)
        progress.committed = start - 1
        LOG.info(
            "plan %d: every holder of a layer has a notice, the first ends in %.1f s; "
            "checkpointing step %d",
            plan.generation,
            action.checkpoint_before_s or 0.0,
            start - 1,
        )
        return start - 1

    def finish(self, committed: int) -> None:
        """Mark the job done after step ``committed``."""
        self.store.set(keys.job_done(), str(committed).encode())

    def publish(
        self, action: Action, view: CoordinatorView, progress: JobProgress, observer: Observer
    ) -> protocol.RuntimePlan:
        """Fence the running generation, plan ``action`` and publish it; ``progress`` follows
        (the new plan, the step it starts after)."""
        previous = progress.plan
        start = 0
        if previous is not None:
            start = protocol.fence(
                self.store, previous.generation, progress.committed + 1, previous.num_working
            )
            progress.fence = (previous.generation, start)
            progress.committed = start - 1
        started = progress.started
        hosts = {i: m.host for i, m in view.members.items()}
        context = PlanContext(
            generation=0 if previous is None else previous.generation + 1,
            epoch=0 if previous is None else previous.epoch,
            start_step=start,
            end_step=self.config.num_steps,
            hosts=hosts,
            latest_checkpoint=latest_checkpoint(self.store),
            stages_before=0 if started is None else started.pipeline_stages,
        )
        assert action.target is not None
        # Steps may have committed between the observation and the fence: holdings are read
        # again at the fenced step (a training instance's follow it; an ended one's may not).
        point = (context.epoch, start - 1)
        holdings = {
            i: held.layers
            for i in (*action.workers, *action.senders)
            if (held := observer.holdings.get(i)) is not None
            and held.layers
            and observer.held_point(held, progress) == point
        }
        on_demand = [i for i in action.workers if (m := view.members.get(i)) and m.on_demand]
        plan = plan_generation(
            self.profile,
            self.config.costs,
            action.target,
            context,
            action.workers,
            holdings,
            action.senders,
            started,
            action.restore,
            on_demand,
        )
        if plan.restore_step is not None and previous is not None and not action.restore:
            plan = self._from_memory(plan, context, (*action.workers, *action.senders))
        if action.noticed_workers:
            plan = dataclasses.replace(plan, noticed=list(action.noticed_workers))
        if action.notice_margin_s is not None:
            plan = dataclasses.replace(plan, notice_margin_s=action.notice_margin_s)
        if plan.restore_step is not None and previous is not None and plan.memory_epoch is None:
            self._log_restore(plan, plan.restore_step, action, holdings, start, view)
        if plan.epoch != context.epoch:
            # The planner opens a new epoch only when the plan restores from a checkpoint.
            assert plan.restore_step is not None, (
                f"plan {plan.generation} opens epoch {plan.epoch} without a restore step"
            )
            protocol.record_restore(self.store, plan.epoch, start - 1, plan.restore_step)
            # From memory, the newest complete checkpoint may be older than the step restored:
            # it stays the one a later restore from the object store reads.
            kept = plan.restore_step
            if plan.memory_epoch is not None:
                kept = -1 if context.latest_checkpoint is None else context.latest_checkpoint
            reset_latest(self.store, plan.epoch, kept)
            progress.committed = plan.start_step - 1
        self.store.add(keys.migrations(plan.kind), 1)
        protocol.publish_plan(self.store, plan)
        observer.remember(plan)
        self._announce(plan, action, notice_choice(plan, action, view, observer))
        progress.plan = plan
        return plan

    def _announce(self, plan: protocol.RuntimePlan, action: Action, notice: dict | None) -> None:
        """The plan's event (``events/<g>``, with ``notice``: what a notice made it do) and its
        log line."""
        self.store.set(
            keys.event(plan.generation),
            json.dumps(
                {
                    "time_s": round(self.clock.now_s() - self.started_s, 3),
                    "reason": action.reason,
                    "kind": plan.kind,
                    "configuration": f"{plan.data_parallel}x{plan.pipeline_stages}",
                    "start_step": plan.start_step,
                    "instances": len(plan.slots),
                    "suspects": sorted(action.suspects),
                    "restore_forced": action.restore,
                    "restore_from_memory": plan.memory_epoch is not None,
                    "notice": notice,
                }
            ).encode(),
        )
        # Moving off noticed instances: the margin it was decided at, for the log.
        off = (
            f"; off noticed {list(action.senders)} at a {action.notice_margin_s:.2f}-s margin"
            if action.senders and action.notice_margin_s is not None
            else ""
        )
        LOG.info(
            "plan %d (%s): %s %dx%d from step %d%s%s",
            plan.generation,
            action.reason,
            plan.kind,
            plan.data_parallel,
            plan.pipeline_stages,
            plan.start_step,
            f" without {sorted(action.suspects)}" if action.suspects else "",
            off,
        )

    def _from_memory(
        self, plan: protocol.RuntimePlan, context: PlanContext, up: tuple[int, ...]
    ) -> protocol.RuntimePlan:
        """``plan``, a restore, reading every layer from the memory copies of the instances
        ``up`` where they hold all of them at a point no older than the newest complete
        checkpoint (:mod:`liveput.runtime.memory_copies`); else ``plan`` as it is."""
        records = {
            i: CopyRecord.from_json(raw)
            for i, raw in readers.by_instance(self.store, keys.COPIES).items()
        }
        newest = context.latest_checkpoint
        found = choose_restore(records, up, self.profile.num_layers, context.epoch, newest)
        assert plan.restore_step is not None
        if found is None or found.step < plan.restore_step or found.step >= context.start_step:
            return plan
        LOG.info(
            "plan %d restores step %d from memory copies on instances %s (the object store's "
            "newest checkpoint: %s)",
            plan.generation,
            found.step,
            sorted(found.addresses),
            "none" if newest is None else f"step {newest}",
        )
        rolled_back = found.step + 1 < context.start_step
        return dataclasses.replace(
            plan,
            epoch=context.epoch + (1 if rolled_back else 0),
            start_step=found.step + 1,
            restore_step=found.step,
            memory_epoch=found.epoch,
            memory_sources=found.sources,
            memory_addresses=found.addresses,
        )

    def _log_restore(
        self,
        plan: protocol.RuntimePlan,
        restore_step: int,
        action: Action,
        holdings: dict[int, tuple[int, ...]],
        start: int,
        view: CoordinatorView,
    ) -> None:
        """Say why a plan after the first restores (forced, or layers nobody holds)."""
        held_layers = {layer for layers in holdings.values() for layer in layers}
        LOG.info(
            "plan %d restores from %s: %s",
            plan.generation,
            "the initial weights" if restore_step < 0 else f"step {restore_step}",
            "forced after plans that failed"
            if action.restore
            else f"no current holder of layers "
            f"{sorted(set(range(self.profile.num_layers)) - held_layers)} "
            f"at step {start - 1} "
            f"(reported: { {i: m.held_step for i, m in view.members.items()} })",
        )


def notice_choice(
    plan: protocol.RuntimePlan, action: Action, view: CoordinatorView, observer: Observer
) -> dict | None:
    """What a preemption notice made ``plan`` do, for its event (None: no notice did).

    ``choice``: ``move`` (the noticed instances hand their layers over, Rules 3-4; ``predicted_s``
    the move's estimate, ``measured_s`` added once it ran, from publication to the first step:
    :meth:`Observer.moved`) or ``just-in-time`` (Rule 9: they checkpointed the step they end
    at; ``predicted_s`` the write the lead was aimed at, ``measured_s`` from the request to this
    plan). ``notice_margin_s``: the margin it was decided at."""
    margin_s = None if action.notice_margin_s is None else round(action.notice_margin_s, 3)
    if action.senders and plan.transfers:
        estimate = observer.move_estimate_s
        return {
            "choice": "move",
            "senders": sorted(action.senders),
            "notice_margin_s": margin_s,
            "predicted_s": None if estimate is None else round(estimate(plan), 3),
            "measured_s": None,
        }
    if action.reason == "checkpoint":
        write_s = view.checkpoint_write_s
        return {
            "choice": "just-in-time",
            "notice_margin_s": margin_s,
            "predicted_s": None if write_s is None else round(write_s, 3),
            "measured_s": round(view.checkpoint_request_age_s, 3),
        }
    return None
