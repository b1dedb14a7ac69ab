"""A fault campaign: many short real training runs, each hurt by several drawn faults, each checked.

After every run: the ledger must show every step applied exactly once (lost: steps never applied;
doubled: applied twice in the final lineage), and the final parameters must equal a fault-free
run's (:mod:`liveput.testbed.reference`). Downtime of a fault: from the moment it began to the
next committed step. A run that fails keeps its logs (``kept_logs``) to find out why.

Runs are done in ``lanes`` at once. A lane owns everything a fault can touch (its namespace hosts,
its checkpoint tmpfs, its etcd server), so a fault in one lane never reaches another; most of a
run's time is waiting (a store outage, a frozen agent, a heartbeat timeout), so two lanes on two
cores finish sooner than one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from liveput.models.jobs import resolve_job
from liveput.runtime.ledger import verify_ledger
from liveput.testbed.cluster import ChaosCluster, ClusterConfig
from liveput.testbed.errors import TestbedError
from liveput.testbed.etcd import EtcdServer
from liveput.testbed.faults import FAULT_KINDS, Injector, RunPlan, draw_campaign
from liveput.testbed.netns import NetnsHosts
from liveput.testbed.reference import final_parameters, parameter_mismatches, reference_parameters

if TYPE_CHECKING:
    import torch

    from liveput.models.job import Job
    from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
__all__ = ["CampaignConfig", "RunOutcome", "CampaignResult", "next_round_kinds", "run_campaign"]


@dataclass(frozen=True)
class CampaignConfig:
    """What the campaign does."""

    faults: int = 200
    """At least this many faults done (runs are added until they are, dealing first the kinds
    the runs before skipped: :func:`next_round_kinds`)."""
    seed: int = 1
    """Seeds the whole campaign: kinds, their order, victims, durations."""
    faults_per_run: int = 12
    """Faults dealt to each run (more: fewer startups per fault)."""
    lanes: int = 2
    """Runs done at once, each in a lane of its own (hosts, checkpoint tmpfs, etcd server)."""
    workers: int = 4
    """Agents of each run."""
    steps_per_fault: int = 18
    """A run trains ``steps_per_fault`` steps per fault, plus ``extra_steps``."""
    extra_steps: int = 20
    """Steps beyond those of its faults (the end of a run is fault-free)."""
    run_timeout_s: float = 300.0
    """A run not done after this long fails."""
    kept_logs: str = "liveput-logs/bench-chaos-failed"
    """Where a failed run's logs are kept (the others are deleted)."""
    subnet: str = ""
    """The namespace hosts' /24 (default: one derived from this process id)."""
    kinds: tuple[str, ...] = tuple(FAULT_KINDS)
    """The fault kinds drawn."""

    def __post_init__(self) -> None:
        if self.faults < 1 or self.faults_per_run < 1 or self.lanes < 1 or self.workers < 2:
            raise ValueError("CampaignConfig: faults, faults_per_run, lanes >= 1 and workers >= 2")
        if self.steps_per_fault < 1 or self.extra_steps < 0 or self.run_timeout_s <= 0:
            raise ValueError(
                "CampaignConfig: steps_per_fault >= 1, extra_steps >= 0, run_timeout_s > 0"
            )


@dataclass
class RunOutcome:
    """One run."""

    index: int
    store: str
    faults: list[tuple[str, float]]
    """(kind, downtime s or nan when no step followed) of each fault done."""
    skipped: list[str]
    """Kinds not done (the job ended first, or there was nothing to hurt)."""
    lost_steps: int
    doubled_steps: int
    params_equal: bool
    wall_s: float
    error: str = ""
    """Why the run failed (empty when it did not)."""


@dataclass
class CampaignResult:
    """Every run; :meth:`summary` is the ``--json`` document."""

    runs: list[RunOutcome] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict:
        done = [f for run in self.runs for f in run.faults]
        by_kind: dict[str, list[float]] = {}
        for kind, downtime in done:
            by_kind.setdefault(kind, []).append(downtime)
        downtime_by_kind: dict[str, dict[str, float | None]] = {}
        for kind, values in sorted(by_kind.items()):
            finite = [v for v in values if v == v]
            downtime_by_kind[kind] = {
                "median": round(float(np.median(finite)), 3) if finite else None,
                "p95": round(float(np.percentile(finite, 95)), 3) if finite else None,
            }
        return {
            "faults": len(done),
            "by_kind": {kind: len(values) for kind, values in sorted(by_kind.items())},
            "lost_steps": sum(r.lost_steps for r in self.runs),
            "doubled_steps": sum(r.doubled_steps for r in self.runs),
            "params_equal": all(r.params_equal for r in self.runs),
            "downtime_s": downtime_by_kind,
            "runs": len(self.runs),
            "skipped": dict(
                sorted(Counter(kind for run in self.runs for kind in run.skipped).items())
            ),
            "failed_runs": [f"run {r.index}: {r.error}" for r in self.runs if r.error],
            "wall_s": round(self.wall_s, 1),
        }


class _Tmpfs:
    """A small tmpfs for the checkpoints, that the disk-full fault fills (needs root)."""

    def __init__(self, size_mib: int = 24) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="liveput-chaos-ckpt-"))
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(self.path)],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if result.returncode != 0:
            self.path.rmdir()
            raise TestbedError(
                f"cannot mount a tmpfs for the checkpoints (root needed): {result.stderr.strip()}"
            )

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], capture_output=True, timeout=20)
        self.path.rmdir()


def _committed_after(cluster: ChaosCluster, time_s: float) -> Callable[[], bool]:
    """Whether the cluster committed a step after unix time ``time_s``."""
    return lambda: any(c > time_s for c in cluster.commit_times())


def _ledger_counts(store: Store, global_batch_size: int, steps: int) -> tuple[int, int, list[str]]:
    """(lost, doubled, problems) of a run's ledger."""
    report = verify_ledger(store, global_batch_size, steps)
    # Steps folded into the ledger's summary were proven applied once when folded.
    applied = set(range(report.summarized_steps)) | {r["step"] for r in report.records}
    lost = len(set(range(steps)) - applied)
    doubled = sum(bool(re.match(r"step \d+ applied twice", p)) for p in report.problems)
    return lost, doubled, report.problems


def _downtime(began: float, commits: list[float]) -> float:
    after = [c for c in commits if c > began]
    return after[0] - began if after else float("nan")


@dataclass
class _Lane:
    """Where one run at a time is done: nothing here is shared with another lane."""

    hosts: NetnsHosts
    etcd: EtcdServer
    tmpfs: Path


def _job(lock: threading.Lock) -> Job:
    """The campaign's job. Under the lock: building a job seeds torch's global generator (a lane
    building one while another lane's reference was being computed changed both)."""
    with lock:
        return resolve_job("tiny-gpt-small")


class _References:
    """The job's fault-free parameters after each step count, computed once per count on a
    thread of their own from when a run of that many steps has started (its agents are
    processes of their own, and the lane's thread mostly waits on them), under the lock of
    :func:`_job`. Computed as a run was checked instead, the first lane to finish spent 4.7 s
    on the 184 steps of the suite's runs while the other lane, done as well, waited for it."""

    def __init__(self, torch_lock: threading.Lock, executor: ThreadPoolExecutor) -> None:
        self._torch_lock = torch_lock
        self._executor = executor
        self._futures: dict[int, Future[list[dict[str, torch.Tensor]]]] = {}
        self._lock = threading.Lock()  # not the torch lock: a lane asks while one computes

    def after(self, job: Job, steps: int) -> Future[list[dict[str, torch.Tensor]]]:
        """The parameters after ``steps`` steps, to come (started at the first call)."""
        with self._lock:
            if steps not in self._futures:
                self._futures[steps] = self._executor.submit(self._compute, job, steps)
            return self._futures[steps]

    def _compute(self, job: Job, steps: int) -> list[dict[str, torch.Tensor]]:
        with self._torch_lock:
            return reference_parameters(job, steps)


def _run(
    index: int,
    plan: RunPlan,
    config: CampaignConfig,
    lane: _Lane,
    references: _References,
    lock: threading.Lock,
) -> RunOutcome:
    steps = config.steps_per_fault * len(plan.faults) + config.extra_steps
    job = _job(lock)
    started = time.monotonic()
    rng = random.Random(plan.seed)
    with tempfile.TemporaryDirectory(prefix="liveput-chaos-") as directory:
        checkpoints = lane.tmpfs / f"run-{index}"
        cluster = ChaosCluster(
            ClusterConfig(
                steps=steps, workers=config.workers, capacity=config.workers + 2, store=plan.store
            ),
            lane.hosts,
            Path(directory),
            checkpoints,
            lane.etcd,
        )
        done: list[tuple[str, float]] = []
        downtimes: list[float] = []
        skipped: list[str] = []
        error = ""
        lost = doubled = 0
        equal = False
        try:
            cluster.start()
            if not cluster.wait_until(lambda: cluster.committed() >= 0, 120.0):
                raise TestbedError("no step committed in 120 s")
            # Once the job trains: runs that start together have built their jobs by then.
            reference = references.after(job, steps)
            injector = Injector(cluster, rng, lane.tmpfs)
            for kind in plan.faults:
                time.sleep(rng.uniform(0.2, 0.8))
                began = None if cluster.done() else injector.do(kind)
                if began is None:
                    skipped.append(kind)
                    continue
                done.append((kind, began))
                LOG.info("run %d: %s at step %d", index, kind, cluster.committed())
                # Let the job take the blow before the next one (a commit after it).
                cluster.wait_until(_committed_after(cluster, began), 60.0, poll_s=0.2)
                # Timed now: the job prunes the ledger records of steps older than its newest
                # checkpoint, so read at the end they would show later commits as the first.
                downtimes.append(_downtime(began, _commit_times(cluster)))
            code = cluster.wait_done(config.run_timeout_s - (time.monotonic() - started))
            if code != 0:
                raise TestbedError(f"the coordinator exited with code {code}")
            lost, doubled, problems = _ledger_counts(
                cluster.started_store(), job.global_batch_size, steps
            )
            mismatches = parameter_mismatches(
                final_parameters(checkpoints, job.num_layers), reference.result()
            )
            equal = not mismatches
            if problems or mismatches:
                error = f"ledger: {problems[:3]}; parameters differ: {mismatches[:3]}"
        except (TestbedError, OSError, RuntimeError) as failure:
            error = str(failure)[:300]
            try:
                lost, doubled, _ = _ledger_counts(
                    cluster.started_store(), job.global_batch_size, steps
                )
            except Exception:  # noqa: BLE001 - the store may be what failed
                lost = steps
        finally:
            commits = _commit_times(cluster)
            cluster.close()
            if error:
                kept = Path(config.kept_logs) / f"seed{config.seed}-run{index}"
                shutil.rmtree(kept, ignore_errors=True)
                shutil.copytree(cluster.logs, kept)
                (kept / "faults.txt").write_text(
                    "".join(f"{kind} at unix {began:.3f}\n" for kind, began in done)
                    + f"error: {error}\n"
                )
                error += f" (logs kept in {kept})"
            shutil.rmtree(checkpoints, ignore_errors=True)
    # A fault the run ended during (no wait finished) is timed from what the store held last.
    downtimes += [_downtime(began, commits) for _, began in done[len(downtimes) :]]
    downtimes = [d if d == d else _downtime(b, commits) for d, (_, b) in zip(downtimes, done)]
    return RunOutcome(
        index,
        plan.store,
        [(kind, d) for (kind, _), d in zip(done, downtimes)],
        skipped,
        lost,
        doubled,
        equal,
        time.monotonic() - started,
        error,
    )


def _commit_times(cluster: ChaosCluster) -> list[float]:
    try:
        return cluster.commit_times()
    except Exception:  # noqa: BLE001 - the store may be down: a fault
        return []


def _lane_subnet(config: CampaignConfig, lane: int) -> str:
    if config.subnet:
        first, second, third = config.subnet.split(".")
        return f"{first}.{second}.{(int(third) + lane) % 250}"
    pid = os.getpid()
    return f"10.{80 + pid % 100}.{(pid // 100 + lane) % 250}"


def next_round_kinds(outcomes: list[RunOutcome], kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds the campaign's next round deals: those its last round's ``outcomes`` skipped,
    else all of ``kinds``. A run that ends before its last faults skips them, and the faults
    dealt last in a run are the ones a fast machine skips every time (on a quiet machine the
    suite's seeded campaign never restarted its coordinator or etcd: both came last in the etcd
    run); dealt again, every kind a round drew is done."""
    skipped = sorted({kind for outcome in outcomes for kind in outcome.skipped})
    return tuple(skipped) or kinds


def run_campaign(
    config: CampaignConfig, on_run: Callable[[RunOutcome], None] | None = None
) -> CampaignResult:
    """Run runs until ``config.faults`` faults are done; ``on_run(outcome)`` after each (from
    the lane that ran it, one call at a time)."""
    started = time.monotonic()
    result = CampaignResult()
    lock = threading.Lock()
    todo: queue.Queue = queue.Queue()
    with contextlib.ExitStack() as stack:
        executor = stack.enter_context(
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="campaign-reference")
        )
        references = _References(lock, executor)
        lanes = []
        for number in range(config.lanes):
            tmpfs = _Tmpfs()
            stack.callback(tmpfs.close)
            hosts = stack.enter_context(
                NetnsHosts(config.workers + 4, subnet=_lane_subnet(config, number), gateway=True)
            )
            etcd_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="liveput-chaos-etcd-")
            )
            etcd = EtcdServer(Path(etcd_dir) / "data", host=hosts.gateway_address)
            etcd.start()
            stack.callback(etcd.stop)
            lanes.append(_Lane(hosts, etcd, tmpfs.path))

        def work(lane: _Lane) -> None:
            # A lane's thread lives as long as the campaign: an etcd it restarted dies with it.
            while (item := todo.get()) is not None:
                index, plan = item
                try:
                    try:
                        outcome = _run(index, plan, config, lane, references, lock)
                    except Exception as failure:  # noqa: BLE001 - a lane must not stop the rest
                        LOG.exception("run %d failed outside its checks", index)
                        outcome = RunOutcome(
                            index,
                            plan.store,
                            [],
                            list(plan.faults),
                            0,
                            0,
                            False,
                            0.0,
                            f"{type(failure).__name__}: {failure}",
                        )
                    with lock:
                        result.runs.append(outcome)
                        if on_run is not None:
                            on_run(outcome)
                finally:
                    todo.task_done()
            todo.task_done()

        threads = [
            threading.Thread(target=work, args=(lane,), name=f"lane-{n}", daemon=True)
            for n, lane in enumerate(lanes)
        ]
        for thread in threads:
            thread.start()
        try:
            round_seed, dealt, kinds = config.seed, 0, config.kinds
            while (done := sum(len(r.faults) for r in result.runs)) < config.faults:
                first = len(result.runs)
                for plan in draw_campaign(
                    config.faults - done, round_seed, config.faults_per_run, kinds
                ):
                    todo.put((dealt, plan))
                    dealt += 1
                todo.join()
                kinds = next_round_kinds(result.runs[first:], config.kinds)
                round_seed += 1_000_003
        finally:
            for _ in threads:
                todo.put(None)
            for thread in threads:
                thread.join()
    result.runs.sort(key=lambda run: run.index)
    result.wall_s = time.monotonic() - started
    return result
