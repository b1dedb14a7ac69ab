"""Downtime per event kind: what each system lost to a loss, a total loss and an arrival.

A trace's changes are grouped into events (kills within ``TOGETHER_S`` of each other are one
event); each event is one of three kinds, by the instances the cloud holds after it:

- ``loss``: kills that leave at least one instance. Downtime: from the last step before the
  first kill to the first step past the samples trained by then (work redone counts as down).
- ``total-loss``: kills that leave none. Nothing can train until an instance is back, so the
  downtime runs from the first arrival after the loss to the first step after it: how long the
  system takes to train again (a checkpoint restore, or a restart from one).
- ``arrival``: an instance added while others run. Downtime: the longest pause between steps
  from the last step before the arrival until the next event (or the run's end; a pause still
  running then is cut there): an arrival that costs nothing pauses no longer than a step.

A *step* is a moment the system's trained samples grew: each system's progress timeline is
sampled differently (liveput's at every coordinator tick, the peers' at every step), and the
moments of growth are what they have in common. Times are wall seconds from the cloud's start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOGETHER_S = 0.5
"""Kills closer than this (wall seconds) are one event: the trace removed them at once."""

KINDS = ("loss", "total-loss", "arrival")


@dataclass(frozen=True)
class Event:
    """One change of the cloud's instances."""

    kind: str
    """``loss``, ``total-loss`` or ``arrival``."""
    at_s: float
    """When it happened (the first kill of a group)."""
    back_s: float | None = None
    """A total loss: when the first instance came back (None: none did in the run)."""


def trace_events(
    initial: int, kills_s: Sequence[float], launches_s: Sequence[float]
) -> list[Event]:
    """The events of a schedule: ``initial`` instances, then kills and launches (additions at
    the same moment as a kill count after it)."""
    changes = sorted([(t, 0) for t in kills_s] + [(t, 1) for t in launches_s])
    events: list[Event] = []
    alive = initial
    index = 0
    while index < len(changes):
        at_s, is_launch = changes[index]
        if is_launch:
            if alive > 0:
                events.append(Event("arrival", at_s))
            elif events and events[-1].kind == "total-loss" and events[-1].back_s is None:
                events[-1] = dataclasses.replace(events[-1], back_s=at_s)  # the first one back
            alive += 1
            index += 1
            continue
        while (
            index < len(changes)
            and not changes[index][1]
            and changes[index][0] - at_s <= TOGETHER_S
        ):
            alive -= 1
            index += 1
        events.append(Event("loss" if alive > 0 else "total-loss", at_s))
    return events


def step_times(timeline: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """``(t, samples)`` at each moment the trained samples grew."""
    return [
        (t, s) for (_, before), (t, s) in zip(timeline, timeline[1:], strict=False) if s > before
    ]


def event_downtimes(
    events: Sequence[Event], timeline: Sequence[tuple[float, int]], end_s: float
) -> list[float | None]:
    """Each event's downtime (module docstring) on one system's progress ``timeline``; None for
    an event before the system's first step (start-up) or a total loss no instance came back
    from."""
    steps = step_times(timeline)
    if not steps:
        return [None] * len(events)
    first_step_s = steps[0][0]
    out: list[float | None] = []
    for position, event in enumerate(events):
        following = events[position + 1].at_s if position + 1 < len(events) else end_s
        if event.at_s < first_step_s:
            out.append(None)
        elif event.kind == "loss":
            last_s, trained = _last_step(steps, event.at_s)
            past = next((t for t, s in steps if t > event.at_s and s > trained), end_s)
            out.append(past - last_s)
        elif event.kind == "total-loss":
            if event.back_s is None or event.back_s >= end_s:
                out.append(None)
                continue
            again = next((t for t, _ in steps if t > event.back_s), end_s)
            out.append(again - event.back_s)
        else:
            last_s, _ = _last_step(steps, event.at_s)
            moments = [last_s, *(t for t, _ in steps if event.at_s < t <= following)]
            if moments[-1] < following:  # a pause that runs on is the next event's from then
                moments.append(following)
            out.append(max(b - a for a, b in zip(moments, moments[1:], strict=False)))
    return out


def _last_step(steps: Sequence[tuple[float, int]], at_s: float) -> tuple[float, int]:
    before = [(t, s) for t, s in steps if t <= at_s]
    return before[-1] if before else steps[0]


def by_kind(events: Sequence[Event], downtimes: Sequence[float | None]) -> dict[str, dict]:
    """Per kind: ``events`` counted, ``median_s`` and ``p95_s`` of the measured downtimes and
    each of them (``each_s``); kinds the trace does not have are left out."""
    out = {}
    for kind in KINDS:
        if not any(e.kind == kind for e in events):
            continue
        measured = [
            d for e, d in zip(events, downtimes, strict=True) if e.kind == kind and d is not None
        ]
        out[kind] = {
            "events": len(measured),
            "median_s": round(float(np.median(measured)), 2) if measured else None,
            "p95_s": round(float(np.percentile(measured, 95)), 2) if measured else None,
            "each_s": [round(d, 2) for d in measured],
        }
    return out
