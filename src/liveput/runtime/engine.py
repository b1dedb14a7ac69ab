"""The training engine of one instance: executes a generation's plan, then trains its steps.

A generation: build its process groups; move state as planned (send and receive layers peer to
peer, or restore every layer from a checkpoint); keep the layers of the new slot; then train steps
from ``start_step`` under the commit protocol (``protocol``) until the generation is fenced, the
job ends, or a peer fails. Layers are only ever changed by a committed step or by the plan, so
after any of these endings the engine holds exactly the state of the last step it applied.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.runtime import keys, layer_moves, protocol
from liveput.runtime.arrival import await_peers
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.comm import CommAborted, Groups, build_unless
from liveput.runtime.copy_keeper import CopyKeeper
from liveput.runtime.engine_config import EngineConfig
from liveput.runtime.generation import (
    Ending,
    GenerationResult,
    checkpoint_share,
    group_ranks,
    stage_position,
)
from liveput.runtime.layer_state import LayerState
from liveput.runtime.optimizer_step import OptimizerStep
from liveput.runtime.periodic_checkpoints import PeriodicCheckpoints
from liveput.runtime.protocol import LedgerRecord, RuntimePlan
from liveput.runtime.schedule import (
    StagePosition,
    compute_gradients,
    discard_gradients,
    flat_gradients,
    unflatten_gradients,
)
from liveput.runtime.stage_memory import StageCheck
from liveput.runtime.step_times import StepTimer
from liveput.runtime.store import Store
from liveput.runtime.tied_gradients import TiedGradients
from liveput.runtime.watchdog import ENDED_WITH_THE_JOB, FAILED_ELSEWHERE, Watchdog

LOG = logging.getLogger(__name__)

# EngineConfig, Ending, GenerationResult and checkpoint_share are the engine's too (their homes
# are engine_config and generation).
__all__ = ["Engine", "EngineConfig", "Ending", "GenerationResult", "Rendezvous", "checkpoint_share"]
Rendezvous = Callable[[RuntimePlan, int], dist.Store]
"""``rendezvous(plan, rank)`` -> the c10d store the generation's process groups meet on."""


class Engine:
    """Trains the layers one instance holds, generation after generation."""

    def __init__(
        self,
        job: Job,
        instance: int,
        store: Store,
        rendezvous: Rendezvous,
        checkpointer: Checkpointer | None,
        config: EngineConfig | None = None,
        token: bytes | None = None,
        keeper: CopyKeeper | None = None,
    ) -> None:
        self.job = job
        self.instance = instance
        self.store = store
        self.rendezvous = rendezvous
        self.checkpointer = checkpointer
        self.config = config or EngineConfig()
        self.token = token
        self.device = torch.device(self.config.device)
        self.layers: dict[int, LayerState] = {}
        self.last_applied = protocol.FRESH_START
        self._peer: int | None = None
        """The instance this one receives layers from, while it does (named if the wait fails)."""
        self._step: int | None = None
        """The step in flight, while one is (named if the generation's communication ends)."""
        self.epoch = 0
        """Restore epoch of the layers' values (with ``last_applied``: the point they are at)."""
        self.update = OptimizerStep(job.training)
        """Unscaling, global norm, clipping, schedule, and the loss scaler's state."""
        self.stage_check = StageCheck(job, store, instance, self.config.instance_memory_gb)
        """Refuses a stage over the job's memory budget."""
        self.warm = False
        """A layer and its optimizer were built once in this process (:meth:`warm_up`)."""
        self.keeper = keeper
        """Keeps and serves this instance's memory copies (None: none kept)."""

    def warm_up(self) -> float:
        """Build one layer and its optimizer once, before a plan needs them (an idle instance
        when a move is coming, :mod:`liveput.runtime.layer_moves`); seconds it took."""
        seconds = layer_moves.warm_up(self.job, self.device)
        self.warm = True
        return seconds

    def _report(self, generation: int, ending: str = "") -> None:
        """Tell the coordinator what this instance holds (it plans from this, nothing else)."""
        holding = protocol.Holding(
            generation, self.epoch, self.last_applied, tuple(sorted(self.layers)), ending
        )
        try:
            protocol.report_holding(self.store, self.instance, holding)
        except LiveputError:
            pass  # the store is down; the coordinator then takes this instance to hold nothing

    # --- state movement ---------------------------------------------------------------------
    def _restore(self, plan: RuntimePlan, needed: range) -> None:
        assert plan.restore_step is not None
        if plan.memory_epoch is not None:
            own = self.keeper.copies if self.keeper is not None else None
            self.layers = layer_moves.copied_layers(
                self.job, self.device, plan, needed, own, self.token
            )
        else:
            self.layers = layer_moves.restored_layers(
                self.job, self.device, self.checkpointer, plan.restore_step, needed
            )
        self.warm = self.warm or bool(needed)

    def _transfer(self, plan: RuntimePlan, groups: Groups | None, needed: range) -> None:
        if (self.epoch, self.last_applied) != (plan.epoch, plan.start_step - 1):
            # Layers of another point of training (this instance sat out plans that ran):
            # never train on them nor send them.
            self.layers = {}
        received: dict[int, LayerState] = {}
        if plan.transfers:
            if groups is None:
                raise LiveputError(
                    f"plan {plan.generation} moves layers between instances but "
                    "builds no process groups"
                )
            sends, buffers = layer_moves.send_layers(
                plan, groups, self.instance, self.layers, self.token
            )
            received = layer_moves.receive_layers(
                plan, groups, self.instance, self.job, self.device, self.token, self._waiting_on
            )
            self.warm = self.warm or bool(received)
            for work in sends:
                groups.wait(work)
            del buffers  # the sends' bytes, alive until the sends completed
        missing = [i for i in needed if i not in self.layers and i not in received]
        if missing:
            raise LiveputError(
                f"plan {plan.generation} leaves instance {self.instance} without layers {missing}"
            )
        # Layers this slot does not need are kept until the generation's first step: if the
        # plan fails before, they are still current and may be sent by the next plan.
        self.layers.update(received)
        self.epoch = plan.epoch
        self.last_applied = plan.start_step - 1

    def _waiting_on(self, source: int | None) -> None:
        self._peer = source

    # --- one generation ---------------------------------------------------------------------
    def run_generation(
        self,
        plan: RuntimePlan,
        keep_going: Callable[[], bool] = lambda: True,
        on_training: Callable[[], None] = lambda: None,
    ) -> GenerationResult:
        """Execute ``plan`` for this instance; ``on_training`` is called once its state is in
        place, before the first step."""
        started = time.perf_counter()
        slot = plan.slots.get(self.instance)
        rank = plan.world.index(self.instance)
        ranks = group_ranks(plan, slot, self.job.training.global_norm_needed)
        needed = plan.layers_of(slot[1]) if slot is not None else range(0)
        groups = None
        watchdog = None
        self._peer = None
        self._step = None
        try:
            if len(plan.world) == 1:
                protocol.arrive(self.store, plan, self.instance)  # the plan has met
            else:
                watchdog = Watchdog(self.store, plan.generation, self.instance, lambda: self._step)
                watchdog.start()
                groups = self._meet(plan, rank, *ranks, watchdog.over)
                watchdog.attach(groups)
            self.stage_check.check(plan)  # before any layer is allocated
            if plan.restore_step is not None:
                self._restore(plan, needed)
                self.last_applied = plan.restore_step
                self.epoch = plan.epoch
            else:
                self._transfer(plan, groups, needed)
            self.update.adopt(list(self.layers.values()))
            if slot is None:
                self.layers = {}
                self._report(plan.generation, Ending.SPARE.value)
                return GenerationResult(
                    Ending.SPARE, self.last_applied, time.perf_counter() - started
                )
            self.last_applied = plan.start_step - 1
            self._report(plan.generation)
            position = stage_position(plan, slot)
            on_training()
            result = self._train(plan, groups, position, keep_going, started, needed)
            self._save_if_asked(plan, result.ending, slot, needed)
            self._report(plan.generation, result.ending.value)
            return result
        except protocol.JobFailure as failure:
            # The job itself is wrong: every instance and the coordinator stop with this line.
            LOG.error("instance %d: %s", self.instance, failure)
            discard_gradients(list(self.layers.values()))
            self._retry(functools.partial(protocol.fail_job, self.store, failure))
            raise
        except CommAborted:
            assert watchdog is not None
            result = self._aborted(plan, watchdog.reason, started)
            self._save_if_asked(plan, result.ending, slot, needed)
            return result
        except (RuntimeError, dist.DistBackendError, LiveputError) as error:
            # A peer that left its communication at a fence for a checkpoint may reset this
            # rank's connection before this rank's watchdog aborts it: its share is due all the
            # same, or the restore after the wipe-out goes back to an older checkpoint.
            result = self._failed(plan, error, started)
            self._save_if_asked(plan, result.ending, slot, needed)
            return result
        finally:
            if watchdog is not None:
                watchdog.done.set()
                watchdog.join()
            if groups is not None:
                groups.close()

    def _meet(
        self,
        plan: RuntimePlan,
        rank: int,
        stage_ranks: list[int] | None,
        pipeline_ranks: list[int] | None,
        over: threading.Event,
    ) -> Groups:
        """Wait for the plan's other instances, then build the generation's process groups, unless
        the generation is ``over`` first (:func:`build_unless`)."""
        await_peers(self.store, plan, self.instance, self.config.comm_timeout_s)
        store = self.rendezvous(plan, rank)
        return build_unless(
            lambda: Groups.build(
                store,
                plan.generation,
                rank,
                len(plan.world),
                stage_ranks,
                self.device,
                self.config.comm_timeout_s,
                plan.hosts.get(self.instance),
                pipeline_ranks,
                shared_gpu=self.config.shared_gpu,
            ),
            over,
        )

    def _aborted(self, plan: RuntimePlan, reason: str, started: float) -> GenerationResult:
        """The watchdog ended the generation's communication (for ``reason``): it is over for
        every rank (the step in flight can no longer commit), and the store already says why."""
        if reason == ENDED_WITH_THE_JOB:
            discard_gradients(list(self.layers.values()))
            raise (
                protocol.job_error(self.store) or protocol.JobFailure("the job failed")
            ) from None
        LOG.warning(
            "instance %d: generation %d %s; left its communication at step %s",
            self.instance,
            plan.generation,
            reason,
            "-" if self._step is None else self._step,
        )
        discard_gradients(list(self.layers.values()))
        ending = Ending.FAILED if reason == FAILED_ELSEWHERE else Ending.FENCED
        self._report(plan.generation, ending.value)
        return GenerationResult(ending, self.last_applied, time.perf_counter() - started)

    def _failed(self, plan: RuntimePlan, error: Exception, started: float) -> GenerationResult:
        """A peer died or never came (rendezvous timed out): the generation is over for us."""
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        LOG.warning("instance %d: generation %d failed: %s", self.instance, plan.generation, reason)
        discard_gradients(list(self.layers.values()))
        peers = () if self._peer is None else (self._peer,)
        try:
            protocol.report_failure(
                self.store,
                plan.generation,
                self.instance,
                protocol.FailureReport(reason[:300], peers),
            )
        except LiveputError:
            pass  # the store is down too; heartbeats will tell the coordinator
        self._report(plan.generation, Ending.FAILED.value)
        return GenerationResult(Ending.FAILED, self.last_applied, time.perf_counter() - started)

    def _train(
        self,
        plan: RuntimePlan,
        groups: Groups | None,
        position: StagePosition,
        keep_going: Callable[[], bool],
        started: float,
        needed: range,
    ) -> GenerationResult:
        layers = [self.layers[i] for i in needed]
        result = GenerationResult(Ending.FINISHED, self.last_applied)
        step = plan.start_step
        timer = StepTimer(self.store, plan) if position.pipeline == 0 and position.is_last else None
        ties = TiedGradients.of_stage(self.job, plan, position)
        checkpoints = PeriodicCheckpoints(
            self.job, self.checkpointer, self.config, self.instance, self.keeper
        )
        while step < plan.end_step:
            if protocol.step_outcome(self.store, plan.generation, step) == protocol.ABORTED:
                result.ending = Ending.FENCED
                break
            if not keep_going():
                result.ending = Ending.STOPPED
                break
            self._step = step
            if step == plan.start_step:
                result.setup_s = time.perf_counter() - started
            begin = time.perf_counter()
            writing = checkpoints.writing()
            if timer is not None:
                timer.step_started(begin)
            loss = compute_gradients(
                self.job, layers, position, groups, step, self.update.loss_scale
            )
            computed = time.perf_counter()
            if groups is not None and groups.stage is not None:
                flat, parameters = flat_gradients(layers, loss)
                groups.allreduce_stage(flat)
                loss = unflatten_gradients(flat, parameters)
            ties.sum(layers, groups)
            nonfinite = position.is_last and not math.isfinite(loss)
            if nonfinite and self.job.training.on_nonfinite_loss == "stop":
                # Never voted for, so never committed: no instance applies this step.
                raise protocol.JobFailure(
                    f"the loss is {loss} at step {step}; the step was not committed"
                )
            decision = self.update.decide(
                layers, self.job.num_layers, groups, nonfinite, ties.duplicates(layers)
            )
            if nonfinite:
                LOG.warning(
                    "instance %d: the loss is %s at step %d; its update is skipped",
                    self.instance,
                    loss,
                    step,
                )
            reduced = time.perf_counter()
            if len(self.layers) > len(needed):
                # The generation is about to commit its first step: the layers kept in case it
                # failed before are no longer current.
                self.layers = {i: self.layers[i] for i in needed}
                self._report(plan.generation)
            if not self._commit(plan, step):
                discard_gradients(layers)
                result.ending = Ending.FENCED
                break
            committed = time.perf_counter()
            self.update.apply(layers, step, decision)
            self.last_applied = step
            LOG.debug(
                "instance %d step %d: compute %.3f s, reduce %.3f s, commit %.3f s, apply %.3f s",
                self.instance,
                step,
                computed - begin,
                reduced - computed,
                committed - reduced,
                time.perf_counter() - committed,
            )
            if position.is_last:
                result.losses[step] = loss
                self._record(plan, step, loss)
            checkpoints.after_step(
                plan, step, layers, position, time.perf_counter() - begin, writing
            )
            step += 1
        result.last_applied = self.last_applied
        if timer is not None:
            timer.flush()
        if result.ending is Ending.FINISHED and position.pipeline == 0 and self.checkpointer:
            self.checkpointer.save_now("final", layers)
        return result

    def _commit(self, plan: RuntimePlan, step: int) -> bool:
        """Vote for ``step`` and wait for its outcome: whether it committed."""
        try:
            protocol.vote_commit(self.store, plan.generation, step, plan.num_working)
        except LiveputError:
            # The store failed mid-vote: whether our add counted is unknown. Ask the
            # coordinator to fence the step; the fence's atomic add then decides for all.
            self._retry(
                lambda: protocol.report_failure(
                    self.store,
                    plan.generation,
                    self.instance,
                    protocol.FailureReport("the store failed during the commit vote"),
                )
            )
        return self._wait_outcome(plan.generation, step) == protocol.COMMITTED

    def _record(self, plan: RuntimePlan, step: int, loss: float) -> None:
        """Write the ledger's record of a committed ``step`` (a last stage's: it has the loss)."""
        record = LedgerRecord(
            step=step,
            generation=plan.generation,
            first_sample=step * self.job.global_batch_size,
            num_samples=self.job.global_batch_size,
            loss=loss,
            data_parallel=plan.data_parallel,
            pipeline_stages=plan.pipeline_stages,
            committed_unix_s=time.time(),
        )
        self._retry(functools.partial(protocol.record_step, self.store, plan.epoch, record))

    def _save_if_asked(
        self, plan: RuntimePlan, ending: Ending, slot: tuple[int, int] | None, needed: range
    ) -> None:
        """Its share of the step it ended at, when fenced for that checkpoint (decide's Rule 9)."""
        # A peer that left its collective at the fence may fail this rank's: its state is the
        # last step applied all the same. With nothing of this generation applied, its layers
        # may not all be in place.
        ended = ending in (Ending.FENCED, Ending.FAILED)
        if not ended or slot is None or self.last_applied < plan.start_step:
            return
        if self.checkpointer is not None:
            every = self.config.checkpoint_every
            self.checkpointer.save_if_asked(
                plan.generation,
                self.epoch,
                self.last_applied,
                checkpoint_share([self.layers[i] for i in needed], stage_position(plan, slot)),
                self.job.num_layers,
                periodic=bool(every) and (self.last_applied + 1) % every == 0,
            )

    def _retry(self, action: Callable[[], object], timeout_s: float = 120.0) -> None:
        """Run a store write that must happen, through a store outage of up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                action()
                return
            except LiveputError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _wait_outcome(self, generation: int, step: int) -> bytes:
        key = keys.done(generation, step)
        while True:
            try:
                return self.store.wait_for(key, self.config.outcome_poll_s)
            except LiveputError:
                pass
            try:
                failure = protocol.job_error(self.store)
            except LiveputError:
                continue
            if failure is not None:
                raise failure
