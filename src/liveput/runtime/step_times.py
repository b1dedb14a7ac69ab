"""Step times the runtime measures, per configuration, for the online performance model.

One instance of each generation (pipeline 0, last stage: it commits the loss) times the interval
between the starts of consecutive steps: compute, communication, the commit vote and the update,
all that the job's throughput is made of. It publishes the median every few steps under
``perf/steps/<generation>``; the coordinator reads every generation's record
(:func:`read_measurements`) and re-fits the performance model from them (``perf.online``).
The first interval of a generation is left out (caches and allocator warm up).
"""

from __future__ import annotations

import json
import logging
import statistics
from collections import deque

from liveput.errors import LiveputError
from liveput.perf.types import Measurement
from liveput.runtime import keys
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
REPORT_EVERY = 5
"""Publish the median after every this many new intervals."""
WINDOW = 512
"""The median is of the newest this many intervals: a generation may run for days, and this
runs in the training loop of the instance that commits."""


class StepTimer:
    """Times one generation's steps and publishes their median."""

    def __init__(self, store: Store, plan: RuntimePlan) -> None:
        self.store = store
        self.plan = plan
        self.intervals_s: deque[float] = deque(maxlen=WINDOW)
        """The newest intervals, the generation's first left out."""
        self.measured = 0
        """Intervals measured, the first left out."""
        self._last_start: float | None = None
        self._first_seen = False
        self._unpublished = 0

    def step_started(self, now_s: float) -> None:
        if self._last_start is not None:
            if self._first_seen:
                self.intervals_s.append(now_s - self._last_start)
                self.measured += 1
            self._first_seen = True
            self._unpublished += 1
        self._last_start = now_s
        if self._unpublished >= REPORT_EVERY:
            self.flush()

    def flush(self) -> None:
        """Publish the median of the intervals so far (the first one left out)."""
        if not self.intervals_s or not self._unpublished:
            return
        record = {
            "data_parallel": self.plan.data_parallel,
            "pipeline_stages": self.plan.pipeline_stages,
            "step_s": statistics.median(self.intervals_s),
            "steps": self.measured,
        }
        try:
            self.store.set(keys.step_times(self.plan.generation), json.dumps(record).encode())
            self._unpublished = 0
        except LiveputError as error:  # a measurement is not worth stalling training for
            LOG.debug("step times not published: %s", error)


def generation_step_s(store: Store, generation: int) -> float | None:
    """The median step time generation ``generation`` published, seconds (None: none yet)."""
    raw = store.get(keys.step_times(generation))
    return None if raw is None else float(json.loads(raw)["step_s"])


def configuration_step_s(store: Store, data_parallel: int, pipeline_stages: int) -> float | None:
    """The step time every generation at ``data_parallel`` x ``pipeline_stages`` measured, pooled
    as :func:`read_measurements` pools it (None: none measured)."""
    for measurement in read_measurements(store):
        if (measurement.data_parallel, measurement.pipeline_stages) == (
            data_parallel,
            pipeline_stages,
        ):
            return measurement.iteration_s
    return None


def read_measurements(store: Store) -> list[Measurement]:
    """Every generation's published step times, one measurement per configuration (the
    intervals of its generations pooled by their counts: a step-weighted mean of medians)."""
    pooled: dict[tuple[int, int], tuple[float, int]] = {}
    for raw in store.get_prefix(keys.STEP_TIMES.prefix).values():
        record = json.loads(raw)
        key = (int(record["data_parallel"]), int(record["pipeline_stages"]))
        total_s, steps = pooled.get(key, (0.0, 0))
        pooled[key] = (
            total_s + float(record["step_s"]) * int(record["steps"]),
            steps + int(record["steps"]),
        )
    return [
        Measurement(d, p, total_s / steps, steps)
        for (d, p), (total_s, steps) in sorted(pooled.items())
        if steps
    ]
