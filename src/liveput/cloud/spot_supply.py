"""How spot instances come and go in the emulated cloud: the two models of its trace
(:class:`~liveput.cloud.emulated_config.SpotModel`), one interface, two implementations.

- :class:`CapacitySupply`: the trace's count at cloud time ``t`` is the spot capacity ``C(t)``;
  spot requests are queued, run within it and are noticed and killed as it shrinks
  (:mod:`liveput.cloud.capacity`). Cloud time runs from the provider's construction.
- :class:`ReplaySupply`: the trace is one job's own spot instances, launched, noticed and
  killed as it says (:mod:`liveput.cloud.replay`); spot requests are refused. Cloud time runs
  from :meth:`SpotSupply.start`.

A supply acts through its provider (:class:`~liveput.cloud.emulated.EmulatedProvider`, seen as a
:class:`SpotCloud`): it launches, notices and preempts the provider's instances, under the
provider's lock. The capacity model's scheduled kills are its own.
"""

from __future__ import annotations

import heapq
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from liveput.cloud.capacity import CapacitySchedule
from liveput.cloud.emulated_config import EmulatedProviderConfig, SpotModel
from liveput.cloud.replay import ReplayAction, ReplaySchedule
from liveput.cloud.retry import ProviderError
from liveput.cloud.types import InstanceRecord, Market
from liveput.traces import IntervalTrace, Trace

log = logging.getLogger(__name__)


class SpotCloud(Protocol):
    """What a supply acts through: the emulated provider's instances and its clock (the
    provider is one; kept here as a protocol so that this module does not import it)."""

    config: EmulatedProviderConfig
    trace: Trace | IntervalTrace
    _rng: random.Random
    _spot_queue: list[str]

    @property
    def end_s(self) -> float: ...

    @property
    def instance_types(self) -> tuple[str, ...]: ...

    @property
    def zones(self) -> tuple[str, ...]: ...

    def now_s(self, clock_s: float | None = None) -> float: ...

    def _running_spot(self) -> list[str]: ...

    def _notice(self, iid: str, now: float, kill_s: float) -> None: ...

    def _preempt(self, iid: str, now: float) -> None: ...

    def _launch(self, iid: str, now: float, *, initial: bool = False) -> None: ...

    def _launch_on_demand(self, now: float) -> None: ...

    def _reap(self) -> None: ...

    def _new_record(
        self, prefix: str, instance_type: str, market: Market, zones: tuple[str, ...], now: float
    ) -> InstanceRecord: ...


class SpotSupply(ABC):
    """What the trace makes of spot instances (module docstring)."""

    starts_with_provider: bool
    """Cloud time runs from the provider's construction (else from :meth:`start`)."""

    @abstractmethod
    def refusal(self, market: Market) -> ProviderError | None:
        """Why a request for ``market`` instances is refused (None: it is granted as quotas
        allow)."""

    def start(self, cloud: SpotCloud) -> None:
        """The provider's clock has just started: launch what the trace starts with."""

    @abstractmethod
    def step(self, cloud: SpotCloud) -> None:
        """Carry out what is due by the provider's cloud time now (on-demand launches too)."""

    def next_action_s(self) -> float | None:
        """Cloud time of the next scheduled action (None: none scheduled)."""
        return None

    def pending(self) -> bool:
        """Kills are scheduled that :meth:`next_action_s` does not say."""
        return False

    kills_agents_at_close: bool = False
    """Closing the provider kills the agents at once (a replay's end), rather than releasing
    them with a grace."""


class CapacitySupply(SpotSupply):
    """The trace as the spot market's capacity (module docstring)."""

    starts_with_provider = True

    def __init__(self, capacity: CapacitySchedule) -> None:
        self.capacity = capacity
        self.kills: list[tuple[float, str]] = []
        """(kill time, victim) of the instances noticed, a heap."""

    def pending(self) -> bool:
        return bool(self.kills)

    def refusal(self, market: Market) -> ProviderError | None:
        return None

    def step(self, cloud: SpotCloud) -> None:
        now = cloud.now_s()
        lead_s = cloud.config.notice_lead_s
        for kill_s in self.capacity.removals_due(now, lead_s):
            running = cloud._running_spot()
            if len(running) > self.capacity.at(kill_s):
                victim = cloud._rng.choice(running)
                cloud._notice(victim, now, kill_s)
                heapq.heappush(self.kills, (kill_s, victim))
        while self.kills and self.kills[0][0] <= now:
            _, iid = heapq.heappop(self.kills)
            cloud._preempt(iid, now)
        cloud._launch_on_demand(now)
        while cloud._spot_queue and len(cloud._running_spot()) < self.capacity.least(
            now, now + lead_s
        ):
            cloud._launch(cloud._spot_queue.pop(0), now)


class ReplaySupply(SpotSupply):
    """The trace as one job's own spot instances (module docstring; the provider's module
    docstring has the rules of notices and void removals)."""

    starts_with_provider = False
    kills_agents_at_close = True

    def __init__(self, schedule: ReplaySchedule) -> None:
        self.schedule = schedule
        self.unnoticed: list[float] = []
        """Removal times still waiting for a victim."""

    def refusal(self, market: Market) -> ProviderError | None:
        if market is not Market.SPOT:
            return None
        return ProviderError(
            "InsufficientInstanceCapacity",
            "a replayed trace grants the spot instances itself",
            retryable=False,
        )

    def start(self, cloud: SpotCloud) -> None:
        replay = self.schedule
        log.info(
            "emulated provider: replaying %s, %d initial instances, %d removals, "
            "%d additions over %.0f s (x%g)",
            cloud.trace.name,
            replay.initial,
            replay.removals,
            replay.additions,
            cloud.end_s,
            cloud.config.time_scale,
        )
        for _ in range(replay.initial):
            self._launch(cloud, 0.0, initial=True)

    def next_action_s(self) -> float | None:
        return self.schedule.next_s()

    def step(self, cloud: SpotCloud) -> None:
        cloud._reap()
        now = cloud.now_s()
        while (due := self.schedule.pop_due(now)) is not None:
            time_s, action, payload = due
            if action is ReplayAction.NOTICE:
                self.unnoticed.append(float(payload))
                self.unnoticed.sort()
            elif action is ReplayAction.PREEMPT:
                cloud._preempt(payload, time_s)
            else:
                self._launch(cloud, time_s, initial=False)
            self._notice_pending(cloud, time_s)
        cloud._launch_on_demand(cloud.now_s())

    def _notice_pending(self, cloud: SpotCloud, now_s: float) -> None:
        """Give every replayed removal that is due a notice a victim, while there are any."""
        while self.unnoticed:
            candidates = cloud._running_spot()
            # Removals whose time has come with nobody to remove (agents that exited by
            # themselves) are void, and so are those whose time passed while they waited: an
            # instance launched since is not theirs to end before it started. Later ones wait
            # for the next launch.
            void = [k for k in self.unnoticed if k < now_s or (not candidates and k <= now_s)]
            if void:
                log.warning(
                    "emulated provider: %d preemption(s) by %.1f s found no instance",
                    len(void),
                    now_s,
                )
                self.unnoticed = [k for k in self.unnoticed if k not in void]
            if not candidates or not self.unnoticed:
                return
            kill_s = self.unnoticed.pop(0)
            victim = cloud._rng.choice(candidates)
            cloud._notice(victim, now_s, kill_s)
            self.schedule.push(kill_s, ReplayAction.PREEMPT, victim)

    @staticmethod
    def _launch(cloud: SpotCloud, time_s: float, *, initial: bool) -> None:
        record = cloud._new_record("i", cloud.instance_types[0], Market.SPOT, cloud.zones, time_s)
        cloud._launch(record.instance_id, time_s, initial=initial)


_SUPPLIES: dict[SpotModel, Callable[[Trace | IntervalTrace, CapacitySchedule, float], SpotSupply]]
_SUPPLIES = {
    SpotModel.CAPACITY: lambda trace, capacity, lead_s: CapacitySupply(capacity),
    SpotModel.REPLAY: lambda trace, capacity, lead_s: ReplaySupply(ReplaySchedule(trace, lead_s)),
}


def spot_supply(
    model: SpotModel, trace: Trace | IntervalTrace, capacity: CapacitySchedule, lead_s: float
) -> SpotSupply:
    """The supply of ``model`` for ``trace`` (``lead_s``: the notice's lead, cloud seconds)."""
    return _SUPPLIES[model](trace, capacity, lead_s)
