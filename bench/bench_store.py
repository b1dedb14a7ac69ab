"""Store size over a long job: keys held and store memory at 1k, 5k and 10k steps.

A real :class:`~liveput.runtime.coordinator.Coordinator` (with its pruning) runs against a signed
store, on the TCPStore (hosted in a child process, as a coordinator hosts it) and on a real etcd
server (:class:`~liveput.runtime.store.etcd_server.LocalEtcd`). Instead of training, obedient
agents write what the engine and the agent write, through the same protocol functions: heartbeats,
arrivals, holdings reports, commit votes and outcomes, ledger records, checkpoint counters and the
latest checkpoint. An instance is lost (no notice) and a new one joins at 2,500 and 7,500 steps, and
at 5,005 steps all three are replaced, so generations end, a plan restores from the checkpoint
and instances are forgotten as in a long job. Time is a manual
clock: one step is 0.2 s, the coordinator ticks (and agents beat) every 4 steps.

Target: keys held and store memory bounded, independent of the step count (keys at 10k steps
within 1.2x of keys at 1k; without pruning they grow by about three per step), and
``verify_ledger`` still proves exactly-once at the end.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from liveput.models.jobs import resolve_job
from liveput.runtime import keys, protocol
from liveput.runtime.clock import ManualClock
from liveput.runtime.coordinator import Coordinator, CoordinatorConfig
from liveput.runtime.ledger import verify_ledger
from liveput.runtime.planning import profile_job
from liveput.runtime.prune import PruneConfig
from liveput.runtime.store import (
    EtcdStore,
    SignedStore,
    Store,
    TCPStoreBackend,
    open_store,
    readers,
)
from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd

STEPS = 10_000
MEASURE_AT = (1_000, 5_000, 10_000)
SAMPLE_EVERY = 50
STEPS_PER_TICK = 4
"""The coordinator ticks every 4 steps (0.8 s), when the agents also beat."""
STEP_S = 0.2
CHECKPOINT_EVERY = 10
CHURN_AT = {2_500: 1, 5_005: 3, 7_500: 1}
"""Step -> instances lost then (and as many joining)."""
TOKEN = "bench-store"
TARGET_RATIO = 1.2


class ObedientAgents:
    """Instances that do, through the store, what engines and agents do, with no model."""

    def __init__(self, store: Store, num_layers: int, batch: int) -> None:
        self.store = store
        self.num_layers = num_layers
        self.batch = batch
        self.alive: set[int] = set()
        self.next_id = 0
        self.plan: protocol.RuntimePlan | None = None
        self.last = protocol.FRESH_START
        self.epoch = 0
        self.training = False
        self.met = False
        """Every instance of the plan arrived."""

    def join(self) -> None:
        instance = self.next_id
        self.next_id += 1
        self.alive.add(instance)
        self.store.set(keys.member(instance), json.dumps({"host": "127.0.0.1"}).encode())
        self.store.add(keys.heartbeat(instance), 1)
        self.store.set(keys.state(instance), b"waiting")

    def beat(self) -> None:
        for instance in self.alive:
            self.store.add(keys.heartbeat(instance), 1)

    def _report(self, instance: int, ending: str) -> None:
        plan = self.plan
        slot = plan.slots.get(instance)
        layers = () if slot is None else tuple(plan.layers_of(slot[1]))
        protocol.report_holding(
            self.store,
            instance,
            protocol.Holding(plan.generation, self.epoch, self.last, layers, ending),
        )

    def follow(self) -> None:
        """Take up a newer plan (arrive, hold its layers), as agents do."""
        current = readers.current_generation(self.store)
        if current is None or (self.plan is not None and current <= self.plan.generation):
            return
        plan = protocol.load_plan(self.store, current)
        if self.plan is not None and self.training:
            for instance in self.plan.world:
                if instance in self.alive:
                    self._report(instance, "fenced")
        self.plan, self.training, self.met = plan, False, False
        self.epoch, self.last = plan.epoch, plan.start_step - 1
        for instance in plan.world:
            if instance in self.alive:
                self.store.set(keys.state(instance), b"training")
                protocol.arrive(self.store, plan, instance)
                self._report(instance, "" if plan.slots[instance] is not None else "spare")

    def step(self) -> None:
        """One training step of the plan in force, if it met."""
        plan = self.plan
        if plan is None:
            return
        if not self.met:
            self.met = self.store.get(keys.all_arrived(plan.generation)) is not None
            if not self.met:
                return
        self.training = True
        step = self.last + 1
        if step >= plan.end_step:
            return
        if protocol.step_outcome(self.store, plan.generation, step) == protocol.ABORTED:
            return
        working = [i for i, slot in plan.slots.items() if slot is not None]
        for instance in working:
            if instance not in self.alive:
                return  # a peer is gone: no step commits (the coordinator fences)
        for _ in working:
            protocol.vote_commit(self.store, plan.generation, step, plan.num_working)
        if protocol.step_outcome(self.store, plan.generation, step) != protocol.COMMITTED:
            return
        self.last = step
        protocol.record_step(
            self.store,
            plan.epoch,
            protocol.LedgerRecord(
                step,
                plan.generation,
                step * self.batch,
                self.batch,
                1.0,
                plan.data_parallel,
                plan.pipeline_stages,
                time.time(),
            ),
        )
        if (step + 1) % CHECKPOINT_EVERY == 0:
            if (
                self.store.add(keys.checkpoint_layers(plan.epoch, step), self.num_layers)
                == self.num_layers
            ):
                self.store.set(
                    keys.latest_checkpoint(),
                    json.dumps({"epoch": plan.epoch, "step": step}).encode(),
                )
        if step + 1 >= plan.end_step:
            for instance in self.alive:
                self.store.set(keys.state(instance), b"done")


def _measure(store: Store, extra: dict) -> dict:
    inner = store.inner if isinstance(store, SignedStore) else store
    listed = inner.get_prefix("")
    return {
        "listed_keys": len(listed),
        "listed_bytes": sum(len(k) + len(v) for k, v in listed.items()),
        **extra,
    }


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run(store: Store, measure, prune: bool = True) -> tuple[list[dict], dict]:  # noqa: ANN001
    """Drive 10,000 steps; ``measure(store)`` every SAMPLE_EVERY steps, and the ledger report."""
    job = resolve_job("tiny-gpt")
    profile = profile_job(job, repeats=1)
    clock = ManualClock()
    coordinator = Coordinator(
        store,
        profile,
        CoordinatorConfig(
            num_steps=STEPS,
            num_micro_batches=job.num_micro_batches,
            capacity=3,
            initial_workers=3,
            interval_s=60.0,
            policy_interval_s=60.0,
            heartbeat_timeout_s=3.0,
            prune=PruneConfig(enabled=prune),
        ),
        clock=clock,
    )
    agents = ObedientAgents(store, job.num_layers, job.global_batch_size)
    for _ in range(3):
        agents.join()
    rows, tick, measured = [], 0, set()
    started = time.perf_counter()
    while coordinator.tick():
        tick += 1
        for _ in range(STEPS_PER_TICK):
            clock.advance(STEP_S)
            agents.follow()
            agents.step()
        agents.beat()
        done = agents.last + 1
        for point, how_many in CHURN_AT.items():
            if done < point or point in measured:
                continue
            measured.add(point)
            # Lost without a notice: one instance, or all of them (the next plan restores from
            # the checkpoint, a new restore epoch, and redoes the steps after it).
            lost = sorted(agents.alive)[:how_many]
            for instance in lost:
                agents.alive.discard(instance)
                agents.join()
        if done >= SAMPLE_EVERY * (len(rows) + 1):
            rows.append(
                {
                    "steps": done,
                    "generation": agents.plan.generation,
                    "deleted": coordinator.pruner.deleted,
                    "wall_s": round(time.perf_counter() - started, 1),
                    **measure(store),
                }
            )
        if tick > 20 * STEPS:
            raise RuntimeError(f"job stuck at step {agents.last}: {coordinator.status}")
    report = verify_ledger(store, job.global_batch_size, STEPS)
    return rows, {
        "exactly_once": report.exactly_once,
        "summarized_steps": report.summarized_steps,
        "records_left": len(report.records),
        "restores": report.restores,
        "problems": report.problems[:3],
    }


def _peak(rows: list[dict], key: str, end: int) -> float:
    """The largest ``key`` sampled in the 1,000 steps up to ``end`` (pruning runs in passes,
    so the figure saws between them: the peak is what the store must hold)."""
    return max(r[key] for r in rows if end - 1_000 < r["steps"] <= end)


def _report(rows: list[dict], keys: tuple[str, ...]) -> None:
    for point in MEASURE_AT:
        row = min(rows, key=lambda r: abs(r["steps"] - point))
        peaks = {key: _peak(rows, key, point) for key in keys}
        print(
            f"  at {point:>6} steps: peak over the last 1,000 steps {peaks}; "
            f"generation {row['generation']}, keys deleted {row['deleted']}, "
            f"{row['wall_s']} s",
            flush=True,
        )
    for key in keys:
        first, last = _peak(rows, key, MEASURE_AT[0]), _peak(rows, key, MEASURE_AT[-1])
        ratio = last / max(first, 1)
        print(
            f"  {key}: {first} -> {last} ({ratio:.2f}x from 1k to 10k steps; target <= "
            f"{TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'MISSED'})"
        )


def bench_tcp() -> None:
    print("-- TCPStore (server in a child process)", flush=True)
    code = (
        "import sys, time; from liveput.runtime.store import TCPStoreBackend; "
        "s = TCPStoreBackend('127.0.0.1', 0, host=True); print(s.port, flush=True); "
        "sys.stdin.read()"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        raw = TCPStoreBackend("127.0.0.1", port)
        store = SignedStore(raw, TOKEN)

        def measure(s: Store) -> dict:
            return _measure(
                s,
                {
                    "server_keys": raw.key_count(),
                    "server_rss_mib": round(_rss_bytes(server.pid) / 2**20, 1),
                },
            )

        rows, ledger = run(store, measure)
        _report(rows, ("server_keys", "listed_bytes", "server_rss_mib"))
        print(f"  ledger: {ledger}")
        store.close()
    finally:
        server.kill()
        server.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_etcd() -> None:
    print("-- etcd (a local server, data on disk)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as directory:
        etcd = LocalEtcd(
            EtcdConfig(
                Path(directory),
                client_port=_free_port(),
                peer_port=_free_port(),
                die_with_parent=True,
            )
        )
        etcd.start()
        try:
            raw = open_store(etcd.url)
            assert isinstance(raw, EtcdStore)
            store = SignedStore(raw, TOKEN)

            def measure(s: Store) -> dict:
                status = raw.status()
                return _measure(
                    s,
                    {
                        "etcd_keys": raw.key_count(),
                        "etcd_rss_mib": round(etcd.rss_bytes() / 2**20, 1),
                        "db_in_use_kib": int(status.get("dbSizeInUse", 0)) // 1024,
                        "revision": raw.revision(),
                    },
                )

            rows, ledger = run(store, measure)
            _report(rows, ("etcd_keys", "listed_bytes", "etcd_rss_mib", "db_in_use_kib"))
            print(f"  ledger: {ledger}; etcd revision {rows[-1]['revision']} (compacted)")
            _request_cost(store)
            store.close()
        finally:
            etcd.stop()


REQUESTS = 2_000
CLIENT_CPU_TARGET_MS = 0.5
"""A signed etcd request of one key: its CPU in the client, at most (through ``etcd3gw`` and
``requests`` it took 0.96-1.01 ms, a listing of 50 keys 1.5 ms)."""


def _request_cost(store: Store) -> None:
    """The client's CPU and the wall time of each kind of request, ``REQUESTS`` of each."""
    store.set("bench/value", b"x" * 200)
    # (name, one request, whether it reads or writes one key: the target's kind)
    kinds = (
        ("get", lambda i: store.get("bench/value"), True),
        ("set", lambda i: store.set(f"bench/set/{i % 50}", b"x" * 200), True),
        ("compare_and_set", lambda i: store.compare_and_set(f"bench/cas/{i}", None, b"1"), True),
        ("get_prefix (50 keys)", lambda i: store.get_prefix("bench/set/"), False),
    )
    for name, request, one_key in kinds:
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(REQUESTS):
            request(i)
        cpu_ms = (time.process_time() - cpu) / REQUESTS * 1e3
        wall_ms = (time.perf_counter() - wall) / REQUESTS * 1e3
        ratio = cpu_ms / CLIENT_CPU_TARGET_MS
        target = f" ({ratio:.2f}x the {CLIENT_CPU_TARGET_MS} ms target)" if one_key else ""
        print(f"  {name:<21} client CPU {cpu_ms:.3f} ms, wall {wall_ms:.3f} ms a request{target}")


def bench_unpruned() -> None:
    """The same job on the TCP store with pruning off: the growth pruning removes."""
    print("-- TCPStore without pruning (for comparison)", flush=True)
    server = TCPStoreBackend("127.0.0.1", 0, host=True)
    try:
        rows, _ = run(
            SignedStore(server, TOKEN), lambda s: {"server_keys": server.key_count()}, prune=False
        )
        for point in MEASURE_AT:
            print(f"  at {point:>6} steps: {_peak(rows, 'server_keys', point)} keys")
    finally:
        server.close()


def main() -> None:
    bench_tcp()
    bench_unpruned()
    bench_etcd()
