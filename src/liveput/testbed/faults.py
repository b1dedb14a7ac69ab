"""Faults: what a campaign draws (pure, seeded) and how each is done to a running job.

:func:`draw_campaign` deals ``n`` faults, each kind many times, into runs (a run's store is TCP or
etcd; the kinds that hurt the coordinator or etcd go to etcd runs). :class:`Injector` carries one
fault out on a :class:`~liveput.testbed.cluster.ChaosCluster` and says when it began; downtime is
from then to the next committed step.
"""

from __future__ import annotations

import logging
import random
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from liveput.runtime import keys
from liveput.runtime.checkpoint import latest_checkpoint
from liveput.runtime.notices import Notice
from liveput.testbed.cluster import ChaosCluster

if TYPE_CHECKING:
    from liveput.runtime.protocol import RuntimePlan

LOG = logging.getLogger(__name__)

__all__ = ["FAULT_KINDS", "ETCD_KINDS", "RunPlan", "draw_campaign", "Injector"]

FAULT_KINDS: dict[str, str] = {
    "kill": "SIGKILL of a working agent, no notice",
    "kill-noticed": "SIGTERM (its notice), then SIGKILL 1-3 s later",
    "kill-stage-pair": "SIGKILL of two agents of the same stage at once",
    "kill-all": "SIGKILL of every instance (a checkpoint restore), then new ones",
    "kill-in-transfer": "SIGKILL of an agent of a plan that moves layers, as it is published",
    "kill-in-checkpoint": "SIGKILL of a pipeline-0 agent at a checkpoint step's commit",
    "stop-short": "SIGSTOP of a working agent for 0.5-2 s",
    "stop-long": "SIGSTOP of a working agent for 5-8 s (past the heartbeat timeout)",
    "partition": "a working agent's host link down for 3-8 s, then up",
    "coordinator-restart": "SIGKILL of the coordinator, a new one 0.5-3 s later",
    "etcd-restart": "etcd stopped (SIGTERM or SIGKILL) and started again 0.5-2 s later",
    "store-outage": "etcd down for 10-60 s",
    "disk-full": "the checkpoint tmpfs full for two checkpoint intervals",
    "corrupt-checkpoint": "a layer file of the newest checkpoint truncated or bit-flipped, then "
    "every instance SIGKILLed (the restore must refuse it by its "
    "signature and use the one before)",
    "late-joiner": "a new instance starts during the migration away from a noticed one",
    "notice-for-gone": "a preemption notice for an instance already SIGKILLed",
}
"""Every kind the campaign draws, and what it does."""
ETCD_KINDS = frozenset({"coordinator-restart", "etcd-restart", "store-outage"})
"""Kinds that need etcd: the coordinator hosts no store then, and etcd can be restarted."""
WEIGHTS = {"store-outage": 0.4, "kill-all": 0.6, "corrupt-checkpoint": 0.6}
"""Relative frequency of the slow kinds (others 1): each still drawn many times."""


@dataclass(frozen=True)
class RunPlan:
    """One run of a campaign: its store and its faults, in order."""

    store: str
    """``tcp`` or ``etcd``."""
    faults: tuple[str, ...]
    """Fault kinds, in the order they are done."""
    seed: int
    """Seeds this run's choices (victims, durations)."""


def draw_campaign(
    num_faults: int, seed: int, faults_per_run: int = 8, kinds: tuple[str, ...] = tuple(FAULT_KINDS)
) -> list[RunPlan]:
    """``num_faults`` faults of ``kinds`` dealt into runs of about ``faults_per_run``, half TCP,
    half etcd."""
    if num_faults < 1 or faults_per_run < 1:
        raise ValueError("draw_campaign: num_faults and faults_per_run must be >= 1")
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown or not kinds:
        raise ValueError(f"draw_campaign: unknown fault kinds {sorted(unknown)}")
    rng = random.Random(seed)
    kinds = tuple(sorted(kinds))
    # Proportional to the weights, rounded, then topped up by weighted draws to num_faults.
    total = sum(WEIGHTS.get(k, 1.0) for k in kinds)
    deck = [k for k in kinds for _ in range(int(num_faults * WEIGHTS.get(k, 1.0) / total))]
    while len(deck) < num_faults:
        deck.append(rng.choices(kinds, [WEIGHTS.get(k, 1.0) for k in kinds])[0])
    rng.shuffle(deck)
    num_runs = max(2, -(-num_faults // faults_per_run))
    runs: list[list[str]] = [[] for _ in range(num_runs)]
    stores = ["etcd" if i % 2 else "tcp" for i in range(num_runs)]
    etcd_runs = [i for i in range(num_runs) if stores[i] == "etcd"]
    for index, kind in enumerate(k for k in deck if k in ETCD_KINDS):
        runs[etcd_runs[index % len(etcd_runs)]].append(kind)
    for kind in (k for k in deck if k not in ETCD_KINDS):
        min(runs, key=len).append(kind)
    for faults in runs:
        rng.shuffle(faults)
    return [
        RunPlan(stores[i], tuple(runs[i]), rng.randrange(2**31)) for i in range(num_runs) if runs[i]
    ]


class Injector:
    """Does faults to ``cluster``; ``checkpoint_fs``: the (tmpfs) filesystem of its checkpoints."""

    def __init__(self, cluster: ChaosCluster, rng: random.Random, checkpoint_fs: Path) -> None:
        self.cluster = cluster
        self.rng = rng
        self.checkpoint_fs = checkpoint_fs

    def do(self, kind: str) -> float | None:
        """Do one fault of ``kind``; the unix time it began, or None if it could not be done
        (the job ended first, or nothing was there to hurt)."""
        return getattr(self, "_" + kind.replace("-", "_"))()

    # --- choosing victims -------------------------------------------------------------------
    def _working(self) -> list[int]:
        plan = self.cluster.plan()
        if plan is None:
            return []
        alive = set(self.cluster.alive())
        return sorted(
            i
            for i, s in plan.slots.items()
            if s is not None and i in alive and not self.cluster.agents[i].stopped
        )

    def _victim(self) -> int | None:
        working = self._working()
        return self.rng.choice(working) if working else None

    def _sigkill(self, *instances: int) -> None:
        for instance in instances:
            self.cluster.signal(instance, signal.SIGKILL)

    def _replace(self, count: int = 1) -> None:
        for _ in range(count):
            self.cluster.start_agent()

    # --- the kinds --------------------------------------------------------------------------
    def _kill(self) -> float | None:
        victim = self._victim()
        if victim is None:
            return None
        began = time.time()
        self._sigkill(victim)
        self._replace()
        return began

    def _kill_noticed(self) -> float | None:
        victim = self._victim()
        if victim is None:
            return None
        began = time.time()
        self.cluster.signal(victim, signal.SIGTERM)
        time.sleep(self.rng.uniform(1.0, 3.0))
        self._sigkill(victim)
        self._replace()
        return began

    def _kill_stage_pair(self) -> float | None:
        plan = self.cluster.plan()
        working = self._working()
        if plan is None or len(working) < 3:
            return None
        by_stage: dict[int, list[int]] = {}
        for instance in working:
            slot = plan.slots[instance]
            assert slot is not None, f"working instance {instance} has no slot in the plan"
            by_stage.setdefault(slot[1], []).append(instance)
        pairs = [holders for holders in by_stage.values() if len(holders) >= 2]
        if not pairs:
            return None
        victims = self.rng.sample(self.rng.choice(pairs), 2)
        began = time.time()
        self._sigkill(*victims)
        self._replace(2)
        return began

    def _kill_all(self) -> float | None:
        alive = self.cluster.alive()
        if not alive:
            return None
        began = time.time()
        self._sigkill(*alive)
        self._replace(self.cluster.config.workers)
        return began

    def _notice_and_wait_plan(
        self, timeout_s: float = 15.0
    ) -> tuple[float, int, RuntimePlan | None] | None:
        """Notice a working agent; (notice time, the plan that follows) or None."""
        plan = self.cluster.plan()
        victim = self._victim()
        if plan is None or victim is None:
            return None
        began = time.time()
        self.cluster.signal(victim, signal.SIGTERM)
        newer: dict[str, RuntimePlan] = {}

        def published() -> bool:
            current = self.cluster.plan()
            if current is not None and current.generation > plan.generation:
                newer["plan"] = current
                return True
            return False

        if not self.cluster.wait_until(published, timeout_s, poll_s=0.01):
            return began, victim, None
        return began, victim, newer["plan"]

    def _kill_in_transfer(self) -> float | None:
        noticed = self._notice_and_wait_plan()
        if noticed is None:
            return None
        began, victim, plan = noticed
        if plan is not None:
            moving = sorted(
                {t.source for t in plan.transfers} | {t.destination for t in plan.transfers}
            )
            candidates = [i for i in (moving or plan.world) if i in self.cluster.alive()]
            if candidates:
                target = self.rng.choice(candidates)
                began = time.time()
                self._sigkill(target)
                self._replace()
        # The noticed agent leaves by itself once its layers are elsewhere; the cloud kills it.
        self.cluster.wait_until(lambda: victim not in self.cluster.alive(), 5.0)
        if victim in self.cluster.alive():
            self._sigkill(victim)
        self._replace()
        return began

    def _kill_in_checkpoint(self) -> float | None:
        every = self.cluster.config.checkpoint_every
        start = self.cluster.committed()
        target = (start // every + 1) * every - 1  # the next step that checkpoints
        if not self.cluster.wait_until(
            lambda: self.cluster.committed() >= target, 30.0, poll_s=0.005
        ):
            return None
        plan = self.cluster.plan()
        if plan is None:
            return None
        savers = [
            i
            for i, s in plan.slots.items()
            if s is not None
            and s[0] == 0
            and i in self.cluster.alive()
            and not self.cluster.agents[i].stopped
        ]
        if not savers:
            return None
        began = time.time()
        self._sigkill(self.rng.choice(savers))
        self._replace()
        return began

    def _stop(self, low_s: float, high_s: float) -> float | None:
        victim = self._victim()
        if victim is None:
            return None
        began = time.time()
        self.cluster.signal(victim, signal.SIGSTOP)
        time.sleep(self.rng.uniform(low_s, high_s))
        self.cluster.signal(victim, signal.SIGCONT)
        return began

    def _stop_short(self) -> float | None:
        return self._stop(0.5, 2.0)

    def _stop_long(self) -> float | None:
        return self._stop(5.0, 8.0)

    def _partition(self) -> float | None:
        victim = self._victim()
        if victim is None:
            return None
        host = self.cluster.agents[victim].host
        began = time.time()
        self.cluster.hosts.set_link(host, up=False)
        try:
            time.sleep(self.rng.uniform(3.0, 8.0))
        finally:
            self.cluster.hosts.set_link(host, up=True)
        return began

    def _coordinator_restart(self) -> float | None:
        began = time.time()
        self.cluster.kill_coordinator()
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.cluster.start_coordinator()
        return began

    def _etcd_restart(self) -> float | None:
        assert self.cluster.etcd is not None
        began = time.time()
        self.cluster.etcd.restart(kill=self.rng.random() < 0.5, down_s=self.rng.uniform(0.5, 2.0))
        return began

    def _store_outage(self) -> float | None:
        assert self.cluster.etcd is not None
        began = time.time()
        self.cluster.etcd.stop()
        try:
            time.sleep(self.rng.uniform(10.0, 60.0))
        finally:
            self.cluster.etcd.start()
        return began

    def _disk_full(self) -> float | None:
        filler = self.checkpoint_fs / "filler"
        began = time.time()
        free = shutil.disk_usage(self.checkpoint_fs).free
        with open(filler, "wb") as handle:
            try:
                handle.write(b"\0" * free)
            except OSError:
                pass  # full: what it is for
        start = self.cluster.committed()
        self.cluster.wait_until(
            lambda: self.cluster.committed() >= start + 2 * self.cluster.config.checkpoint_every,
            20.0,
        )
        filler.unlink()
        return began

    def _corrupt_checkpoint(self) -> float | None:
        try:
            step = latest_checkpoint(self.cluster.started_store())
        except Exception:  # noqa: BLE001 - the store is restarting: nothing to aim at
            return None
        files = (
            []
            if step is None
            else sorted((self.cluster.checkpoint_dir / f"step-{step}").glob("layer-*.pt"))
        )
        if not files:
            return None
        victim = self.rng.choice(files)
        data = bytearray(victim.read_bytes())
        if self.rng.random() < 0.5:
            data = data[: self.rng.randrange(len(data))]  # truncated
        else:
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)  # one bit flipped
        victim.write_bytes(bytes(data))
        return self._kill_all()

    def _late_joiner(self) -> float | None:
        noticed = self._notice_and_wait_plan()
        if noticed is None:
            return None
        began, victim, _ = noticed
        self._replace()  # joins while the job migrates away from the noticed one
        self.cluster.wait_until(lambda: victim not in self.cluster.alive(), 5.0)
        if victim in self.cluster.alive():
            self._sigkill(victim)
        return began

    def _notice_for_gone(self) -> float | None:
        victim = self._victim()
        if victim is None:
            return None
        began = time.time()
        self._sigkill(victim)
        time.sleep(self.rng.uniform(0.2, 1.0))
        # What its notice watcher would have reported, had it lived to see the notice.
        notice = Notice("emulator", "terminate", 0.0, f"i-{victim:04d}")
        try:
            self.cluster.started_store().set(keys.notice(victim), notice.to_json().encode())
        except Exception:  # noqa: BLE001 - a store outage: the notice is lost, as a real one
            LOG.warning("notice for gone instance %d not written", victim)
        self._replace()
        return began
