"""The job's evaluation (``Job.evaluate``): run on one instance after every N-th committed step.

No instance of a pipeline holds the whole model, but a checkpoint does: every step the job
evaluates at is also a checkpoint step (the engine's ``_checkpoint``), and the instance whose
write completes that checkpoint (it brought the count of saved layers to L, so every layer
file is on storage) reads the layer files back, joins them into the unsplit model
(``nn.Sequential`` of copies of the job's layers, on the CPU) and calls the job's function
under ``torch.no_grad()``, in a thread of its own: training goes on meanwhile, and this
instance's next checkpoint writes do not wait for it either.

The result goes to ``eval/<s>`` (:mod:`liveput.runtime.keys`), with the restore epoch of the
weights it saw: a step redone after a restore is evaluated again, and the newer epoch's result
wins (the same computation: the same weights, so the same value). ``eval/latest`` names the
newest, which ``liveput status`` shows. A function that raises, or returns something other
than numbers, is recorded as the step's ``error`` (the agent's log has the traceback); training
is not stopped for it. An instance lost while it evaluates leaves that step without a result.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.runtime import keys
from liveput.runtime.checkpoint import Checkpointer
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
UNNAMED = "value"
"""The name of the metric of an evaluation that returns one number."""


def metrics_of(result: object) -> dict[str, float]:
    """What ``Job.evaluate`` returned, as metric name -> float; a one-line LiveputError unless
    it is one number (a Python or NumPy number, a one-element tensor) or a non-empty mapping of
    non-empty names to numbers."""
    items = list(result.items()) if isinstance(result, Mapping) else [(UNNAMED, result)]
    if not items:
        raise LiveputError("Job.evaluate returned an empty mapping: no metric")
    metrics: dict[str, float] = {}
    for name, value in items:
        if not isinstance(name, str) or not name:
            raise LiveputError(
                f"Job.evaluate returned a metric named {name!r}: names are non-empty strings"
            )
        try:
            metrics[name] = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, RuntimeError):
            raise LiveputError(
                f"Job.evaluate returned {name}={type(value).__name__}, not a number"
            ) from None
    return metrics


def assemble_model(job: Job, checkpointer: Checkpointer, step: int) -> nn.Sequential:
    """The unsplit model with the weights of checkpoint ``step``: copies of the job's layers
    (the job's own are not touched), on the CPU, each in the mode the job gave it."""
    layers = []
    for index in range(job.num_layers):
        module = job.own_layer(index, torch.device("cpu"), initialize=False)
        module.load_state_dict(checkpointer.load_layer(step, index)["module"])
        layers.append(module)
    return nn.Sequential(*layers)


def record_evaluation(store: Store, record: dict) -> bool:
    """Write ``record`` (``step``, ``epoch``, ...) to ``eval/<step>`` unless a newer restore
    epoch's result is there, then move ``eval/latest`` to it if it is the newest; whether it
    was written."""
    step, epoch = int(record["step"]), int(record["epoch"])
    key, value = keys.evaluation(step), json.dumps(record).encode()
    while True:
        raw = store.get(key)
        if raw is not None and int(json.loads(raw)["epoch"]) > epoch:
            return False  # the step was redone after a restore and evaluated since
        if store.compare_and_set(key, raw, value):
            break
    newest = json.dumps({"epoch": epoch, "step": step}).encode()
    while True:
        raw = store.get(keys.latest_evaluation())
        if raw is not None:
            latest = json.loads(raw)
            if (int(latest["epoch"]), int(latest["step"])) >= (epoch, step):
                return True
        if store.compare_and_set(keys.latest_evaluation(), raw, newest):
            return True


class Evaluation:
    """Evaluates the job's model after each step it is due at whose checkpoint this instance
    completes (a :class:`~liveput.runtime.checkpoint.CheckpointListener`)."""

    def __init__(self, job: Job, store: Store, instance: int, checkpointer: Checkpointer) -> None:
        if job.evaluate is None:
            raise LiveputError(f"job {job.name} has no evaluate function")
        self.job = job
        self.store = store
        self.instance = instance
        self.checkpointer = checkpointer
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluation")
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        checkpointer.listeners.append(self)
        checkpointer.still_read = self.unrecorded

    def unrecorded(self, step: int) -> bool:
        """Whether step ``step`` is evaluated and its result not yet recorded (by any instance):
        its checkpoint must stay on disk until it is."""
        return self.job.evaluation_due(step) and self.store.get(keys.evaluation(step)) is None

    def checkpoint_complete(self, epoch: int, step: int) -> None:
        if not self.job.evaluation_due(step):
            return
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(self.run, epoch, step))

    def run(self, epoch: int, step: int) -> dict:
        """Evaluate the model of checkpoint ``step`` (restore epoch ``epoch``) and record the
        result in the store; the record."""
        assert self.job.evaluate is not None  # checked when built
        started = time.perf_counter()
        record: dict = {"step": step, "epoch": epoch, "instance": self.instance}
        try:
            model = assemble_model(self.job, self.checkpointer, step)
            with torch.no_grad():
                record["metrics"] = metrics_of(self.job.evaluate(model))
        except Exception as error:  # noqa: BLE001 - the user's function: recorded, training goes on
            LOG.exception("instance %d: the evaluation after step %d failed", self.instance, step)
            lines = str(error).splitlines()
            record["error"] = f"{type(error).__name__}: {lines[0] if lines else ''}".strip()
        record["eval_s"] = round(time.perf_counter() - started, 3)
        record["unix_s"] = round(time.time(), 3)
        try:
            record_evaluation(self.store, record)
        except LiveputError as error:  # the store is down: the result is lost, training is not
            LOG.warning(
                "instance %d: evaluation of step %d not recorded: %s", self.instance, step, error
            )
        return record

    def flush(self) -> None:
        """Wait for the evaluations submitted so far."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.result()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
