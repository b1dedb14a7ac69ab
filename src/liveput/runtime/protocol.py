"""What the coordinator and the agents agree on through the store: the plan, the commit.

The keys, their values and who writes them are the store's schema, :mod:`liveput.runtime.keys`.

**Commit protocol** (a step's optimizer update is applied exactly once, or by nobody). After its
gradients are reduced, each of the W working ranks of generation g does ``add(commit/g/s, 1)``.
The step is committed iff the counter reaches W; the rank that makes it W writes
``done/g/s = committed``, and every rank applies its optimizer step only after reading that. To
end a generation (a failure, a notice, a planned change), the coordinator *fences* a step:
``add(commit/g/s, -FENCE)``; if the value before was W the step had committed and it fences the
next one, otherwise the step can never commit and it writes ``done/g/s = aborted``. The add is
atomic, so exactly one of "committed" and "aborted" holds. Ranks check ``done`` of a step before
computing it and stop at the first aborted one; so when a generation ends, every surviving rank
has applied exactly the steps before the fenced one, which is where the next generation starts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from liveput.errors import LiveputError
from liveput.runtime import keys
from liveput.runtime.store import Store, readers

FENCE = 1 << 30
COMMITTED = b"committed"
ABORTED = b"aborted"
FRESH_START = -1
"""``restore_step`` of a plan that starts from the job's initial weights."""


class JobFailure(LiveputError):
    """The job itself is wrong (a layer raised, the loss is not finite): no plan can fix it."""


def fail_job(store: Store, failure: JobFailure) -> None:
    """Record why the job stops (the first failure stays)."""
    store.compare_and_set(keys.job_error(), None, str(failure).encode())


def job_error(store: Store) -> JobFailure | None:
    raw = store.get(keys.job_error())
    return None if raw is None else JobFailure(raw.decode())


@dataclass(frozen=True)
class Transfer:
    """Layer ``layer`` sent from instance ``source`` to ``destination``."""

    layer: int
    source: int
    destination: int


@dataclass(frozen=True)
class RuntimePlan:
    """A migration plan as the runtime executes it (published by the coordinator)."""

    generation: int
    """g: increases by one per plan."""
    epoch: int
    """Restore epoch: the number of checkpoint restores so far."""
    start_step: int
    """The first step this generation computes (the step boundary where it takes effect)."""
    end_step: int
    """The job's last step + 1."""
    data_parallel: int
    """D."""
    pipeline_stages: int
    """P."""
    boundaries: list[int]
    """Layer index where each stage starts, plus the number of layers."""
    slots: dict[int, tuple[int, int] | None]
    """Instance id -> (pipeline, stage), or None for a spare. Every instance here joins the
    generation's process groups (spares only to send layers)."""
    hosts: dict[int, str]
    """Instance id -> address other instances reach it at."""
    transfers: list[Transfer] = field(default_factory=list)
    """Layers sent peer to peer before training starts."""
    kind: str = "none"
    """Migration kind: none, intra-stage, inter-stage, pipeline, checkpoint-restore."""
    restore_step: int | None = None
    """When set, every working instance loads all its layers from the checkpoint of this step
    (``FRESH_START``: the initial weights) and ``start_step == restore_step + 1``."""
    noticed: list[int] = field(default_factory=list)
    """Working instances that had a preemption notice when the plan was made (no other was up):
    their going is no news to replan for, and the first instance without a notice replaces them."""
    notice_margin_s: float | None = None
    """The notice margin the coordinator planned with, wall seconds: a noticed agent left out
    of a plan leaves once its lead is this close to spent (None: its job spec's)."""
    memory_epoch: int | None = None
    """Set when the restore reads every layer from instances' memory copies
    (:mod:`liveput.runtime.memory_copies`): the restore epoch of those copies (their step is
    ``restore_step``); None: a restore reads the object store."""
    memory_sources: dict[int, int] = field(default_factory=dict)
    """Layer -> the instance whose memory copy a memory restore reads."""
    memory_addresses: dict[int, str] = field(default_factory=dict)
    """Instance -> its copy server's ``host:port``."""

    @property
    def world(self) -> list[int]:
        """Instances in rank order."""
        return sorted(self.slots)

    @property
    def num_working(self) -> int:
        return sum(slot is not None for slot in self.slots.values())

    def rank_of(self, instance: int) -> int:
        return self.world.index(instance)

    def instance_at(self, pipeline: int, stage: int) -> int:
        for instance, slot in self.slots.items():
            if slot == (pipeline, stage):
                return instance
        raise LiveputError(f"plan {self.generation} has no instance at slot ({pipeline}, {stage})")

    def layers_of(self, stage: int) -> range:
        return range(self.boundaries[stage], self.boundaries[stage + 1])

    def to_json(self) -> bytes:
        data = asdict(self)
        data["slots"] = {str(k): list(v) if v is not None else None for k, v in self.slots.items()}
        data["hosts"] = {str(k): v for k, v in self.hosts.items()}
        data["memory_sources"] = {str(k): v for k, v in self.memory_sources.items()}
        data["memory_addresses"] = {str(k): v for k, v in self.memory_addresses.items()}
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> RuntimePlan:
        data = json.loads(raw)
        data["slots"] = {
            int(k): tuple(v) if v is not None else None for k, v in data["slots"].items()
        }
        data["hosts"] = {int(k): v for k, v in data["hosts"].items()}
        data["transfers"] = [Transfer(**t) for t in data["transfers"]]
        for name in ("memory_sources", "memory_addresses"):
            data[name] = {int(k): v for k, v in data.get(name, {}).items()}
        return cls(**data)


def receives_state(plan: RuntimePlan) -> bool:
    """``plan``'s instances receive layers before its first step: from peers, or from a
    checkpoint (the initial weights are made where they are needed, with nothing to move)."""
    return bool(plan.transfers) or plan.restore_step not in (None, FRESH_START)


def moving(plan: RuntimePlan, committed: int) -> bool:
    """``plan``'s move is in flight: it receives state (:func:`receives_state`) and no step of
    it has committed yet (``committed``: the last one)."""
    return receives_state(plan) and committed < plan.start_step


def publish_plan(store: Store, plan: RuntimePlan) -> None:
    store.set(keys.plan(plan.generation), plan.to_json())
    store.set(keys.current_plan(), str(plan.generation).encode())


def current_plan(store: Store) -> RuntimePlan | None:
    generation = readers.current_generation(store)
    return None if generation is None else load_plan(store, generation)


def load_plan(store: Store, generation: int) -> RuntimePlan | None:
    raw = store.get(keys.plan(generation))
    return RuntimePlan.from_json(raw) if raw is not None else None


def step_outcome(store: Store, generation: int, step: int) -> bytes | None:
    return store.get(keys.done(generation, step))


def vote_commit(store: Store, generation: int, step: int, num_working: int) -> None:
    """This rank's gradients for the step are complete."""
    if store.add(keys.commit(generation, step), 1) == num_working:
        store.compare_and_set(keys.done(generation, step), None, COMMITTED)


def fence(store: Store, generation: int, step: int, num_working: int) -> int:
    """End generation ``generation`` at the first step >= ``step`` that has not committed; returns
    that step (the next generation's start)."""
    while True:
        before = store.add(keys.commit(generation, step), -FENCE) + FENCE
        if before >= num_working:
            store.compare_and_set(keys.done(generation, step), None, COMMITTED)
            step += 1
            continue
        store.compare_and_set(keys.done(generation, step), None, ABORTED)
        return step


def arrive(store: Store, plan: RuntimePlan, instance: int | None = None) -> bool:
    """Count this instance in at plan ``plan``'s start; True if it was the last one of its world
    (it then marks ``arrived/<g>/all``). Each instance arrives once per generation."""
    if instance is not None:
        store.set(keys.arrived(plan.generation, instance), b"1")
    if store.add(keys.arrived_count(plan.generation), 1) < len(plan.world):
        return False
    store.set(keys.all_arrived(plan.generation), b"1")
    return True


def arrivals(store: Store, generation: int) -> set[int]:
    """Instances that have arrived at plan ``generation``'s start."""
    return {
        int(key.rsplit("/", 1)[1])
        for key in store.get_prefix(keys.arrivals(generation))
        if key != keys.all_arrived(generation)
    }


def mark_started(store: Store, generation: int) -> None:
    store.compare_and_set(keys.started(generation), None, b"1")


def has_started(store: Store, generation: int) -> bool:
    return store.get(keys.started(generation)) is not None


@dataclass(frozen=True)
class Holding:
    """The layers an instance holds, and the point of training they are at."""

    generation: int
    """The generation whose start (``ending == ""``) or end wrote this report."""
    epoch: int
    """Restore epoch of the layers' values."""
    step: int
    """The last step applied to them (``FRESH_START``: initial weights)."""
    layers: tuple[int, ...]
    """Layer indices held."""
    ending: str = ""
    """How the generation ended for the instance (an ``engine.Ending`` value); empty while it
    trains, when the layers follow every step the generation commits."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Holding:
        data = json.loads(raw)
        data["layers"] = tuple(data["layers"])
        return cls(**data)


def report_holding(store: Store, instance: int, holding: Holding) -> None:
    store.set(keys.holding(instance), holding.to_json())


def holdings(store: Store) -> dict[int, Holding]:
    return {
        instance: Holding.from_json(raw)
        for instance, raw in readers.by_instance(store, keys.HOLDING).items()
    }


@dataclass(frozen=True)
class FailureReport:
    """Why an instance's generation failed."""

    reason: str
    """First line of the error."""
    peers: tuple[int, ...] = ()
    """Instances the failure points at (a peer that closed its connection, a transfer source
    that lacked a layer, instances that never arrived)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FailureReport:
        try:
            data = json.loads(raw)
        except ValueError:
            return cls(raw.decode(errors="replace"))
        return cls(str(data.get("reason", "")), tuple(int(p) for p in data.get("peers", ())))


def report_failure(store: Store, generation: int, instance: int, report: FailureReport) -> None:
    store.set(keys.failure(generation, instance), report.to_json())
    store.set(keys.failed(generation), b"1")


def failures(store: Store, generation: int) -> dict[int, FailureReport]:
    return {
        int(key.rsplit("/", 1)[1]): FailureReport.from_json(raw)
        for key, raw in store.get_prefix(keys.failures(generation)).items()
    }


def superseded(store: Store, generation: int) -> bool:
    """Whether a plan newer than ``generation`` is in force."""
    current = readers.current_generation(store)
    return current is not None and current > generation


def last_committed(store: Store, generation: int, from_step: int) -> int:
    """The highest step s >= from_step - 1 such that all steps from_step..s committed."""
    step = from_step
    while step_outcome(store, generation, step) == COMMITTED:
        step += 1
    return step - 1


@dataclass(frozen=True)
class LedgerRecord:
    """A committed step, as written to the ledger."""

    step: int
    generation: int
    first_sample: int
    num_samples: int
    loss: float
    data_parallel: int
    pipeline_stages: int
    committed_unix_s: float
    """Wall-clock time of the commit (for logs; instances' clocks may differ slightly)."""


def record_step(store: Store, epoch: int, record: LedgerRecord) -> None:
    store.compare_and_set(
        keys.ledger_record(epoch, record.step), None, json.dumps(asdict(record)).encode()
    )


def record_restore(store: Store, epoch: int, committed: int, restored_to: int) -> None:
    """Restore epoch ``epoch`` starts: steps after ``restored_to`` up to ``committed`` are
    undone."""
    store.set(
        keys.restore(epoch),
        json.dumps({"committed": committed, "restored_to": restored_to}).encode(),
    )
