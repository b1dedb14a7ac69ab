"""The store's schema: every key a job writes, one function per key family, and one table.

A key is a ``/``-separated path whose first part names its family; what follows names its
scope: an instance id (``hb/<id>``), a generation (``plan/<g>``), a step of a generation
(``commit/<g>/<s>``), a checkpoint or ledger step of a restore epoch (``ckpt/<epoch>/<s>``), or
nothing for the job's one key of that name (``job/done``). :data:`FAMILIES` is the table: each
family's prefix, scope and when pruning deletes it; :mod:`liveput.runtime.prune` derives what it
lists and deletes from it. The values' formats and who writes them:

- ``members/<id>``: an agent's registration (JSON: host, market); ``hb/<id>``: its heartbeat
  counter; ``notice/<id>``: its preemption notice; ``state/<id>``: its current state name;
  ``lost/<id>``: the coordinator counted it lost; ``gone/<id>``: the cloud ended its instance
  (written by the executor that rents it, which sees the cloud's word before any heartbeat
  times out); ``holds/<id>``: what it holds
  (:class:`~liveput.runtime.protocol.Holding`), reported by its engine when a generation's state
  is in place and when a generation ends for it. ``notice-end/<id>``: when the coordinator first
  saw its notice and the end that notice announces (JSON: ``seen_unix_s``, ``end_unix_s`` or
  null), so a restarted coordinator does not count the notice's lead afresh. ``copies/<id>``:
  the layers it keeps memory copies of, as of which step, and its copy server's address
  (:class:`~liveput.runtime.memory_copies.CopyRecord`).
- ``plan/current``: the generation number of the plan in force; ``plan/<g>``: plan g (JSON).
- ``commit/<g>/<s>``: the commit counter of step s in generation g; ``done/<g>/<s>``: its outcome
  (the commit protocol: :mod:`liveput.runtime.protocol`).
- ``arrived/<g>``: how many instances of plan g have reached its start; ``arrived/<g>/<id>``: that
  this one has; ``arrived/<g>/all``: set by the last of them. ``started/<g>``: plan g started
  (every instance arrived and a step of it committed).
- ``fail/<g>/<id>``: instance id's generation g failed (a failure report); ``failed/<g>``: some
  instance's did (peers abort their communication of generation g when they see it).
- ``ledger/<epoch>/<s>``: the record of a committed step; ``restore/<epoch>``: a checkpoint
  restore that opened restore epoch ``epoch``; ``ledger-summary``: the records folded so far
  (:mod:`liveput.runtime.ledger`).
- ``ckpt/<epoch>/<s>``: layers of checkpoint s saved so far; ``ckpt/latest``: the newest
  complete (JSON: ``epoch``, ``step``, and ``write_s``, the seconds its last writer took from
  the snapshot to its layers counted; absent after a restore reset it); ``ckpt/complete``: the
  complete ones still on disk. ``ckpt-now/<g>``: the coordinator asks generation g's instances
  to checkpoint the step they end at (written before it fences g; JSON: ``epoch``,
  ``before_s``, the seconds left to the notices' end).
- ``job/spec``, ``job/profile``, ``job/file``: what the job is (the launch spec, the profile, the
  job file); ``job/error``: why the job cannot go on; ``job/done``: the job finished (its last
  step); ``job/stop``: ``liveput stop`` asked it to stop. ``ids/next``: instance ids handed out.
- ``coord/...``: the coordinator's own records (``started``: the newest generation that started;
  ``history``: one instance count per decision interval; ``floor``: the steps whose commit keys
  were pruned). ``events/<g>``: why plan g was made; ``stats/...``: counters (preemptions,
  migrations per kind).
- ``rdzv/<g>``: where generation g's process-group store listens; ``perf/steps/<g>``: generation
  g's measured step time.
- ``status/now``, ``status/series``, ``status/events``: what ``liveput status`` and the dashboard
  show (:mod:`liveput.operate.recorder`).
- ``eval/<s>``: the job's evaluation of the model after step s (JSON: step, restore epoch,
  metrics or the error, the instance that ran it), written by that instance
  (:mod:`liveput.runtime.evaluation`); ``eval/latest``: the newest one's ``{"epoch", "step"}``.
- ``notices/<cloud id>``: a preemption notice the emulated cloud publishes for one of its
  instances (named by the cloud's own id, not the job's).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Scope(enum.Enum):
    """What the path after a family's prefix names."""

    JOB = "job"
    """Nothing, or a fixed name: one key per job (``job/done``, ``stats/preemptions``)."""
    INSTANCE = "instance"
    """An instance id: ``<prefix><id>``."""
    GENERATION = "generation"
    """A generation, then maybe an instance id or ``all``: ``<prefix><g>[/...]``."""
    STEP = "step"
    """A generation and a step: ``<prefix><g>/<s>``."""
    EPOCH = "epoch"
    """A restore epoch, then maybe a step: ``<prefix><epoch>[/<s>]``."""
    CLOUD_INSTANCE = "cloud instance"
    """An instance id of the cloud (a string such as ``i-0003``)."""
    TRAINING_STEP = "training step"
    """A 0-based training step, whatever generation or restore epoch ran it: ``<prefix><s>``."""


class Pruned(enum.Enum):
    """When pruning deletes a family's keys (:mod:`liveput.runtime.prune` says why each is safe)."""

    NEVER = "never"
    """Kept for the job's life: they grow with replans and wall time, not with steps
    (evaluations: one per ``Job.evaluate_every_steps``, which the user chose to keep)."""
    FORGOTTEN = "forgotten"
    """When their instance is forgotten (silent for long and not in the newest plan)."""
    RETIRED = "retired"
    """When their generation is retired."""
    RETIRED_OR_OLD_STEP = "retired or old step"
    """When their generation is retired, or, in the running generation, a step older than the
    one before the last committed."""
    SUCCESSOR_RETIRED = "successor retired"
    """When the generation after theirs is retired too (``plan/current`` never)."""
    OLDER_CHECKPOINT = "older checkpoint"
    """When older than the oldest checkpoint a restore may use (``ckpt/latest`` and
    ``ckpt/complete`` never)."""
    FOLDED = "folded"
    """When the ledger is folded into its summary (the fold names them)."""


@dataclass(frozen=True)
class Family:
    """One family of keys: a row of :data:`FAMILIES`."""

    prefix: str
    """What every key of the family starts with (ends with ``/``)."""
    scope: Scope
    """What the rest of the key names."""
    pruned: Pruned
    """When pruning deletes its keys."""

    def instance_of(self, key: str) -> int | None:
        """The instance id ``key`` names, for a key ``<prefix><id>`` of this family; else None."""
        rest = key[len(self.prefix) :] if key.startswith(self.prefix) else ""
        return int(rest) if rest.isdigit() else None


MEMBER = Family("members/", Scope.INSTANCE, Pruned.FORGOTTEN)
HEARTBEAT = Family("hb/", Scope.INSTANCE, Pruned.FORGOTTEN)
STATE = Family("state/", Scope.INSTANCE, Pruned.FORGOTTEN)
HOLDING = Family("holds/", Scope.INSTANCE, Pruned.FORGOTTEN)
NOTICE = Family("notice/", Scope.INSTANCE, Pruned.FORGOTTEN)
LOST = Family("lost/", Scope.INSTANCE, Pruned.FORGOTTEN)
GONE = Family("gone/", Scope.INSTANCE, Pruned.FORGOTTEN)
NOTICE_END = Family("notice-end/", Scope.INSTANCE, Pruned.FORGOTTEN)
COPIES = Family("copies/", Scope.INSTANCE, Pruned.FORGOTTEN)
COMMIT = Family("commit/", Scope.STEP, Pruned.RETIRED_OR_OLD_STEP)
DONE = Family("done/", Scope.STEP, Pruned.RETIRED_OR_OLD_STEP)
ARRIVED = Family("arrived/", Scope.GENERATION, Pruned.RETIRED)
STARTED = Family("started/", Scope.GENERATION, Pruned.RETIRED)
FAILURE = Family("fail/", Scope.GENERATION, Pruned.RETIRED)
FAILED = Family("failed/", Scope.GENERATION, Pruned.RETIRED)
PLAN = Family("plan/", Scope.GENERATION, Pruned.SUCCESSOR_RETIRED)
CHECKPOINT = Family("ckpt/", Scope.EPOCH, Pruned.OLDER_CHECKPOINT)
CHECKPOINT_REQUEST = Family("ckpt-now/", Scope.GENERATION, Pruned.RETIRED)
LEDGER = Family("ledger/", Scope.EPOCH, Pruned.FOLDED)
RESTORE = Family("restore/", Scope.EPOCH, Pruned.FOLDED)
LEDGER_SUMMARY = Family("ledger-summary", Scope.JOB, Pruned.NEVER)
JOB = Family("job/", Scope.JOB, Pruned.NEVER)
IDS = Family("ids/", Scope.JOB, Pruned.NEVER)
COORDINATOR = Family("coord/", Scope.JOB, Pruned.NEVER)
EVENT = Family("events/", Scope.GENERATION, Pruned.NEVER)
STATS = Family("stats/", Scope.JOB, Pruned.NEVER)
RENDEZVOUS = Family("rdzv/", Scope.GENERATION, Pruned.NEVER)
STEP_TIMES = Family("perf/steps/", Scope.GENERATION, Pruned.NEVER)
STATUS = Family("status/", Scope.JOB, Pruned.NEVER)
CLOUD_NOTICE = Family("notices/", Scope.CLOUD_INSTANCE, Pruned.NEVER)
EVALUATION = Family("eval/", Scope.TRAINING_STEP, Pruned.NEVER)

FAMILIES: tuple[Family, ...] = (
    MEMBER,
    HEARTBEAT,
    STATE,
    HOLDING,
    NOTICE,
    LOST,
    GONE,
    NOTICE_END,
    COPIES,
    COMMIT,
    DONE,
    ARRIVED,
    STARTED,
    FAILURE,
    FAILED,
    PLAN,
    CHECKPOINT,
    CHECKPOINT_REQUEST,
    LEDGER,
    RESTORE,
    LEDGER_SUMMARY,
    JOB,
    IDS,
    COORDINATOR,
    EVENT,
    STATS,
    RENDEZVOUS,
    STEP_TIMES,
    STATUS,
    CLOUD_NOTICE,
    EVALUATION,
)
"""Every family of keys, per-instance families first, a forgotten instance's registration
(``members/``) first of all."""


def family_of(key: str) -> Family | None:
    """The family ``key`` belongs to, or None for a key outside the schema."""
    for family in FAMILIES:
        if key.startswith(family.prefix):
            return family
    return None


def pruned_when(*rules: Pruned) -> tuple[Family, ...]:
    """The families pruned by any of ``rules``, in table order."""
    return tuple(family for family in FAMILIES if family.pruned in rules)


# -- an instance's keys ----------------------------------------------------------------------------


def copies(instance: int) -> str:
    """An instance's memory copies (``memory_copies.CopyRecord``)."""
    return f"{COPIES.prefix}{instance}"


def member(instance: int) -> str:
    return f"{MEMBER.prefix}{instance}"


def heartbeat(instance: int) -> str:
    return f"{HEARTBEAT.prefix}{instance}"


def state(instance: int) -> str:
    return f"{STATE.prefix}{instance}"


def holding(instance: int) -> str:
    return f"{HOLDING.prefix}{instance}"


def notice(instance: int) -> str:
    return f"{NOTICE.prefix}{instance}"


def gone(instance: int) -> str:
    return f"{GONE.prefix}{instance}"


def lost(instance: int) -> str:
    return f"{LOST.prefix}{instance}"


def notice_end(instance: int) -> str:
    return f"{NOTICE_END.prefix}{instance}"


# -- a generation's keys ---------------------------------------------------------------------------


def current_plan() -> str:
    """The generation number of the plan in force."""
    return f"{PLAN.prefix}current"


def plan(generation: int) -> str:
    return f"{PLAN.prefix}{generation}"


def commit(generation: int, step: int) -> str:
    return f"{COMMIT.prefix}{generation}/{step}"


def done(generation: int, step: int) -> str:
    return f"{DONE.prefix}{generation}/{step}"


def arrived_count(generation: int) -> str:
    """How many instances have arrived at the generation's start (a counter)."""
    return f"{ARRIVED.prefix}{generation}"


def arrivals(generation: int) -> str:
    """The prefix of :func:`arrived` keys of the generation (``all`` among them)."""
    return f"{ARRIVED.prefix}{generation}/"


def arrived(generation: int, instance: int) -> str:
    return f"{arrivals(generation)}{instance}"


def all_arrived(generation: int) -> str:
    return f"{arrivals(generation)}all"


def started(generation: int) -> str:
    return f"{STARTED.prefix}{generation}"


def failures(generation: int) -> str:
    """The prefix of :func:`failure` keys of the generation."""
    return f"{FAILURE.prefix}{generation}/"


def failure(generation: int, instance: int) -> str:
    return f"{failures(generation)}{instance}"


def failed(generation: int) -> str:
    """Set by the generation's first failure (one key for peers to poll)."""
    return f"{FAILED.prefix}{generation}"


def event(generation: int) -> str:
    """Why plan ``generation`` was made."""
    return f"{EVENT.prefix}{generation}"


def rendezvous(generation: int) -> str:
    return f"{RENDEZVOUS.prefix}{generation}"


def step_times(generation: int) -> str:
    return f"{STEP_TIMES.prefix}{generation}"


# -- checkpoints and the ledger --------------------------------------------------------------------


def checkpoint_layers(epoch: int, step: int) -> str:
    """How many layers of checkpoint ``step`` (restore epoch ``epoch``) are saved (a counter)."""
    return f"{CHECKPOINT.prefix}{epoch}/{step}"


def checkpoint_request(generation: int) -> str:
    """Generation ``generation``'s instances are to checkpoint the step they end at."""
    return f"{CHECKPOINT_REQUEST.prefix}{generation}"


def latest_checkpoint() -> str:
    return f"{CHECKPOINT.prefix}latest"


def complete_checkpoints() -> str:
    return f"{CHECKPOINT.prefix}complete"


def ledger_record(epoch: int, step: int) -> str:
    return f"{LEDGER.prefix}{epoch}/{step}"


def restore(epoch: int) -> str:
    return f"{RESTORE.prefix}{epoch}"


def ledger_summary() -> str:
    """Outside ``ledger/``: listings there are per-step records."""
    return LEDGER_SUMMARY.prefix


# -- the job's own keys ----------------------------------------------------------------------------


def job_spec() -> str:
    return f"{JOB.prefix}spec"


def job_profile() -> str:
    return f"{JOB.prefix}profile"


def job_file() -> str:
    return f"{JOB.prefix}file"


def job_error() -> str:
    return f"{JOB.prefix}error"


def job_done() -> str:
    return f"{JOB.prefix}done"


def job_stop() -> str:
    return f"{JOB.prefix}stop"


def next_instance_id() -> str:
    return f"{IDS.prefix}next"


def coordinator_started() -> str:
    return f"{COORDINATOR.prefix}started"


def coordinator_deadline() -> str:
    """A deadline job's clock and bill (JSON: ``started_unix_s``, the wall time its deadline
    counts from; ``usd_before``, dollars paid under coordinators before this one), kept so that a
    restarted coordinator plans for the deadline the job was given, not a new one."""
    return f"{COORDINATOR.prefix}deadline"


def coordinator_history() -> str:
    return f"{COORDINATOR.prefix}history"


def prune_floor() -> str:
    """``{"generation": g, "step": f}``: steps before f of generation g committed (their keys
    may be gone)."""
    return f"{COORDINATOR.prefix}floor"


def preemptions() -> str:
    return f"{STATS.prefix}preemptions"


def checkpoint_failures() -> str:
    """How many checkpoint writes failed, on any instance, the final one included (a counter)."""
    return f"{STATS.prefix}checkpoint-failures"


def checkpoint_failure() -> str:
    """The newest failed checkpoint write: ``{"step", "final", "error"}`` (JSON)."""
    return f"{STATS.prefix}checkpoint-failure"


def migrations_prefix() -> str:
    """The prefix of :func:`migrations` counters."""
    return f"{STATS.prefix}migrations/"


def migrations(kind: str) -> str:
    """How many migrations of ``kind`` the job made (a counter)."""
    return f"{migrations_prefix()}{kind}"


def evaluation(step: int) -> str:
    """The evaluation after 0-based step ``step`` (the newest restore epoch's)."""
    return f"{EVALUATION.prefix}{step}"


def latest_evaluation() -> str:
    return f"{EVALUATION.prefix}latest"


def status_now() -> str:
    return f"{STATUS.prefix}now"


def status_series() -> str:
    return f"{STATUS.prefix}series"


def status_events() -> str:
    return f"{STATUS.prefix}events"


def cloud_notice(cloud_instance: str) -> str:
    return f"{CLOUD_NOTICE.prefix}{cloud_instance}"
