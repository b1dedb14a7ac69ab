"""The rate of ``n`` instances: liveput's steady samples/s in a run of ``n`` with no preemption.

The configuration bound and the simulator (:mod:`bench.peers_sim`) take each instance count's
rate from such a run: the 30-s count runs for most counts, the regime's 60-s no-preemption run
for its own count. Taken from each run's first step to its last, a rate holds the run's first
steps (the first optimizer build and allocations, the pipeline filling, the first checkpoint:
2.3 s for its three steps against 1.05 s for a later one's in a pipeline run of ``bench
peers-check``), which weigh twice as much in a 30-s run as in the 60-s one: the counts were not
measured alike. On that run's first 22 s of steps (a count run's) the rate from the first step
is 59.7 samples/s, past the warm-up 62.1. That is not all of the gap between the count runs
(46.7-51.6) and the 60-s run (61.6) of the same 1x4 in the pipeline regime's full run of
2026-12-07: the coordinator's median step there was 0.275-0.308 s in the count runs and 0.214 s
in the 60-s run, slower steps throughout, which no choice of where a rate starts removes.

The rule, the same for every count: the rate from the end of step ``k`` to the run's last step,
``k`` the larger of :data:`WARM_UP_STEPS` and :data:`WARM_UP_SHARE` of the steps after the
first (a 30-s run of about 90 steps leaves out its first 18, a 60-s run about 40: past the
first checkpoint, 10 steps in, either way). A share of the steps and not a fixed number of
seconds: it needs no step time to be chosen, and it leaves four fifths of any run to measure.
A run with fewer than
:data:`MIN_MEASURED_STEPS` steps past those keeps its first steps in (rate from its first step,
as :meth:`~bench.peers_run.SystemRun.rate`) and says so (``warm_up_left_in``): a steady rate of
a handful of steps would be noise, and a silent fallback would pass start-up off as steady.

"Steps" are the points of the run's timeline where its samples grew
(:meth:`~bench.peers_run.SystemRun.steps`): one step each for a peer's progress lines, one step
or a few for liveput's progress, polled every 0.2 s next to its 0.2-0.3-s steps here.

The systems' own no-preemption throughput (the table's ``no-preempt/s``, each system's
checkpoint interval) stays :meth:`~bench.peers_run.SystemRun.rate`, the samples it trained over
its run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.peers_run import SystemRun

WARM_UP_STEPS = 3
"""Fewest steps after the first left out of a steady rate."""
WARM_UP_SHARE = 0.2
"""Share of the steps after the first left out of a steady rate, where more than
:data:`WARM_UP_STEPS`."""
MIN_MEASURED_STEPS = 10
"""Fewest steps past the warm-up a steady rate is taken over; fewer: from the first step."""


@dataclass(frozen=True)
class SteadyRate:
    """How one run's rate of its instance count was taken."""

    samples_per_s: float
    """The rate the bound and the simulator use (0.0: fewer than two steps)."""
    steps: int
    """Steps in the run (timeline points where its samples grew)."""
    skipped_steps: int
    """Steps after the first left out as warm-up (0 where ``warm_up_left_in``)."""
    from_s: float | None
    """Seconds since the cloud's start of the step the rate is taken from (None: no step)."""
    to_s: float | None
    """Seconds since the cloud's start of the run's last step (None: no step)."""
    warm_up_left_in: bool
    """Too few steps past the warm-up: the rate runs from the first step, start-up in."""
    from_first_step_samples_per_s: float
    """The rate from the first step to the last (:meth:`SystemRun.rate`), beside it to compare."""
    timeline: tuple[tuple[float, int], ...] = ()
    """The run's (seconds since the cloud's start, samples): kept in ``--json``, so that a rule
    for the rates can be checked on a run's steps without running it again."""

    def to_json(self) -> dict:
        """Plain JSON, rates and times rounded as the document's other figures."""
        return {
            "samples_per_s": round(self.samples_per_s, 2),
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "from_s": None if self.from_s is None else round(self.from_s, 2),
            "to_s": None if self.to_s is None else round(self.to_s, 2),
            "warm_up_left_in": self.warm_up_left_in,
            "samples_per_s_from_first_step": round(self.from_first_step_samples_per_s, 2),
            "timeline": [[round(t, 2), int(s)] for t, s in self.timeline],
        }


def warm_up_steps(steps: int) -> int:
    """Steps after the first that a run of ``steps`` steps leaves out of its steady rate."""
    return max(WARM_UP_STEPS, math.ceil(WARM_UP_SHARE * max(steps - 1, 0)))


def steady_rate(run: SystemRun) -> SteadyRate:
    """``run``'s samples/s past its warm-up (the module's rule), or from its first step where too
    few steps follow the warm-up (``warm_up_left_in``)."""
    steps = run.steps()
    timeline = tuple(run.timeline)
    if not steps:
        return SteadyRate(0.0, 0, 0, None, None, True, 0.0, timeline)
    skipped = warm_up_steps(len(steps))
    left_in = len(steps) - 1 - skipped < MIN_MEASURED_STEPS
    if left_in:
        skipped = 0
    (start_s, start_samples), (end_s, end_samples) = steps[skipped], steps[-1]
    rate = (end_samples - start_samples) / (end_s - start_s) if end_s > start_s else 0.0
    return SteadyRate(rate, len(steps), skipped, start_s, end_s, left_in, run.rate(), timeline)


def describe(rates: dict[int, float], measured: dict[int, SteadyRate]) -> str:
    """One line of the rates by instance count, naming the counts whose warm-up stayed in (too
    few steps) and those interpolated (no run of theirs): a reader of the line must not take
    either for a steady rate."""
    parts = []
    for count, rate in rates.items():
        how = measured.get(count)
        if how is None:
            note = " (interpolated)"
        elif how.warm_up_left_in:
            note = f" (start-up left in: {how.steps} steps)"
        else:
            note = ""
        parts.append(f"{count}: {rate:.1f}{note}")
    return (
        "samples/s by instance count (past each run's warm-up: the larger of "
        f"{WARM_UP_STEPS} steps and {WARM_UP_SHARE:.0%} of its steps): " + ", ".join(parts)
    )
