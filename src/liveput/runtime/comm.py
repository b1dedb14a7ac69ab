"""Communication of one configuration generation: process groups and point-to-point messages.

Process groups are built directly (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on CUDA) from
a c10d store prefixed by the generation, never through the global default group, so a generation's
groups are simply dropped and rebuilt at the next one. Groups: the world (every instance of the
plan, for layer transfers and pipeline send/recv) and, per stage, its D replicas (gradient
all-reduce). Tensors of unknown shape travel as a small header then the payload.

**Abort.** A generation's groups are aborted from a watcher thread (:meth:`Groups.abort`) when the
generation is fenced or superseded, so that no rank waits out ``timeout_s`` on a frozen or
cut-off peer. ``ProcessGroupNCCL.abort()`` ends the communicators' kernels, but
``ProcessGroupGloo.abort()`` (torch 2.13) does not wake an operation already blocked, and the
shrink APIs are NCCL-only. So every blocking call goes through :meth:`Groups.call` (waits:
:meth:`Groups.wait`), which runs it on a helper thread and raises :class:`CommAborted` in the
caller as soon as the groups are aborted. An abandoned operation ends by itself at its timeout;
until then its groups are parked (:func:`_park`): destroying a gloo group joins its worker
threads, which may still be blocked in it.

**Exit.** An agent process therefore ends with daemon threads blocked in C++ calls (an abandoned
operation, a store call). CPython before 3.14 ends such a thread with ``pthread_exit`` when its
call returns during the interpreter's finalization, and the unwinding through pybind11's
``noexcept`` GIL guard calls ``std::terminate``: the process dies with SIGABRT, "terminate called
without an active exception", after its work is done (pytorch/pytorch#38228). Agent entry points
end with :func:`end_process`, which skips the finalization.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, cast

import torch
import torch.distributed as dist

_DTYPES = (
    torch.float32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int32,
    torch.uint8,
)
_HEADER = 8


NCCL_ERROR_HANDLING = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
"""NCCL watchdog settings an agent sets (unless the user did) before any group is made: a
blocking wait raises a timed-out operation's error in the thread that waits (the training
thread, through :meth:`Groups.call`), and the watchdog, instead of tearing the process down
(torch's default, 3: ``SkipCleanUp``), only aborts the communicators (2: ``CleanUpOnly``). A
timeout then ends one generation, not the instance. Read by ``ProcessGroupNCCL`` only."""


def configure_error_handling() -> None:
    """Apply :data:`NCCL_ERROR_HANDLING` to this process's environment (before groups exist)."""
    for name, value in NCCL_ERROR_HANDLING.items():
        os.environ.setdefault(name, value)


def end_process(code: int) -> NoReturn:
    """End this process with exit code ``code`` once its logs and standard streams are flushed,
    without the interpreter's finalization (see the module's **Exit**): nothing an agent holds
    needs it (checkpoints are written and closed before, sockets close with the process)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to flush
            pass
    os._exit(code)


class CommAborted(RuntimeError):
    """A wait on groups that were aborted from another thread (their generation is over)."""


def _park(groups: Groups, keep_s: float) -> None:
    """Keep ``groups`` alive ``keep_s`` more seconds, in a daemon thread: an operation abandoned
    by an abort ends by itself at its timeout, and destroying the groups before would block the
    dropping thread (a gloo group joins its worker threads). A daemon thread's references are
    never released at interpreter exit, so neither does a process ending meanwhile wait."""
    threading.Thread(
        target=_hold, args=(groups, keep_s), name="liveput-parked-groups", daemon=True
    ).start()


def _hold(groups: Groups, keep_s: float) -> None:
    time.sleep(keep_s)


class _Call:
    """One blocking call handed to the helper thread; ``wake`` is set when it is finished or
    the groups are aborted, whichever comes first."""

    def __init__(self, function: Callable[[], object]) -> None:
        self.function = function
        self.wake = threading.Event()
        self.finished = False
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.function()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller
            self.error = error
        self.finished = True
        self.wake.set()


def _serve(calls: queue.SimpleQueue) -> None:
    while (call := calls.get()) is not None:
        call.run()


BUILD_POLL_S = 0.05
"""How often a rank building its groups looks whether it should give up, seconds."""


def build_unless(build: Callable[[], Groups], over: threading.Event) -> Groups:
    """``build()`` (the groups' rendezvous: every rank of the plan joins, in C++, up to the
    communication timeout), run on a helper thread and given up as soon as ``over`` is set, by
    :class:`CommAborted`. A peer that arrived at the plan and died before it joined would
    otherwise hold this rank for the whole timeout, after newer plans had left the generation
    behind. Groups an abandoned build makes after all are aborted (and parked) as it ends."""
    call = _Call(build)
    abandoned = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        call.run()
        with lock:
            late = abandoned.is_set()
        if late and isinstance(call.result, Groups):
            call.result.abort()

    threading.Thread(target=run, name="liveput-comm-build", daemon=True).start()
    while not call.wake.wait(BUILD_POLL_S):
        if over.is_set():
            with lock:
                if not call.finished:
                    abandoned.set()
                    raise CommAborted("communication aborted while its groups were built")
    if call.error is not None:
        raise call.error
    return cast(Groups, call.result)


def _make_group(
    store: dist.Store,
    prefix: str,
    rank: int,
    size: int,
    wire: torch.device,
    timeout_s: float,
    host: str | None,
) -> dist.ProcessGroup:
    """A group whose messages are tensors on ``wire``: NCCL on a GPU, gloo on the CPU."""
    timeout = datetime.timedelta(seconds=timeout_s)
    scoped = dist.PrefixStore(prefix, store)
    backend: object
    if wire.type == "cuda":
        nccl_options = dist.ProcessGroupNCCL.Options()
        nccl_options._timeout = timeout
        backend = dist.ProcessGroupNCCL(scoped, rank, size, nccl_options)
    elif host is None:
        backend = dist.ProcessGroupGloo(scoped, rank, size, timeout)
    else:
        # Bind gloo to the instance's own address, not whatever the machine's hostname resolves to.
        # torch's stub names the binding's options class Options; the binding itself, _Options.
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        backend = dist.ProcessGroupGloo(scoped, rank, size, options)
    # torch's stubs declare send, recv and allreduce on ProcessGroup only; its backends have them.
    return cast(dist.ProcessGroup, backend)


@dataclass
class Groups:
    """The process groups of one generation, as seen by one rank."""

    world: dist.ProcessGroup
    rank: int
    """This instance's rank in the world (its index among the plan's sorted instances)."""
    stage: dist.ProcessGroup | None
    """The replicas of this instance's stage (None when D = 1 or it is a spare)."""
    device: torch.device
    """Where this rank computes: tensors received are returned there."""
    timeout_s: float = 60.0
    """Timeout of one operation: the longest an abandoned one stays blocked, seconds."""
    pipeline: dist.ProcessGroup | None = None
    """The stages of this instance's pipeline, built only for a global gradient norm (None when
    P = 1, not needed, or a spare)."""
    wire: torch.device | None = None
    """Where messages travel from: ``device`` under NCCL; the CPU under gloo (None: ``device``).
    Ranks sharing one GPU compute there but communicate over gloo, which moves CPU tensors:
    every message is staged through CPU memory."""

    def __post_init__(self) -> None:
        if self.wire is None:
            self.wire = self.device
        self.aborted = threading.Event()
        """Set by :meth:`abort`: every call then raises :class:`CommAborted`."""
        self._lock = threading.Lock()
        self._pending: set[_Call] = set()
        self._calls: queue.SimpleQueue | None = None

    @classmethod
    def build(
        cls,
        store: dist.Store,
        generation: int,
        rank: int,
        world_size: int,
        stage_ranks: list[int] | None,
        device: torch.device,
        timeout_s: float = 60.0,
        host: str | None = None,
        pipeline_ranks: list[int] | None = None,
        shared_gpu: bool = False,
    ) -> Groups:
        """``stage_ranks``: world ranks holding this rank's stage (its replicas, itself included);
        ``host``: the address to bind (None: gloo's default); ``pipeline_ranks``: world ranks of
        this rank's pipeline, when a step needs the stages to reduce together; ``shared_gpu``:
        other ranks may compute on the same GPU (gloo through CPU memory instead of NCCL)."""
        wire = torch.device("cpu") if shared_gpu or device.type != "cuda" else device
        world = _make_group(store, f"g{generation}/world/", rank, world_size, wire, timeout_s, host)
        stage = None
        if stage_ranks is not None and len(stage_ranks) > 1:
            name = "-".join(map(str, stage_ranks))
            stage = _make_group(
                store,
                f"g{generation}/stage/{name}/",
                stage_ranks.index(rank),
                len(stage_ranks),
                wire,
                timeout_s,
                host,
            )
        pipeline = None
        if pipeline_ranks is not None and len(pipeline_ranks) > 1:
            name = "-".join(map(str, pipeline_ranks))
            pipeline = _make_group(
                store,
                f"g{generation}/pipeline/{name}/",
                pipeline_ranks.index(rank),
                len(pipeline_ranks),
                wire,
                timeout_s,
                host,
            )
        return cls(world, rank, stage, device, timeout_s, pipeline, wire)

    # --- abortable calls --------------------------------------------------------------------
    def call(self, function: Callable[[], object]) -> object:
        """``function()``, a blocking C++ call, run on this rank's helper thread; raises
        :class:`CommAborted` as soon as the groups are aborted (the call is then abandoned)."""
        call = _Call(function)
        with self._lock:
            if self.aborted.is_set():
                raise CommAborted("communication aborted")
            if self._calls is None:
                self._calls = queue.SimpleQueue()
                threading.Thread(
                    target=_serve,
                    args=(self._calls,),
                    daemon=True,
                    name=f"liveput-comm-{self.rank}",
                ).start()
            self._pending.add(call)
            self._calls.put(call)
        call.wake.wait()
        with self._lock:
            self._pending.discard(call)
        if not call.finished:
            raise CommAborted("communication aborted")
        if call.error is not None:
            raise call.error
        return call.result

    def wait(self, work: dist.Work) -> None:
        """``work.wait()``; :class:`CommAborted` once the groups are aborted."""
        self.call(work.wait)

    def issue(self, operation: Callable[[], dist.Work]) -> dist.Work:
        """``operation()``, which enqueues a collective or a send; :class:`CommAborted` once the
        groups are aborted. NCCL refuses to enqueue on an aborted communicator (a
        ``DistBackendError`` in the caller) where gloo enqueues and fails in ``wait``: both are
        the abort, and callers handle one exception."""
        if self.aborted.is_set():
            raise CommAborted("communication aborted")
        try:
            return operation()
        except RuntimeError as error:
            if self.aborted.is_set():
                raise CommAborted("communication aborted") from error
            raise

    # --- point to point ---------------------------------------------------------------------
    def isend_tensor(self, tensor: torch.Tensor, peer: int, tag: int) -> list[dist.Work]:
        """Send a tensor of any shape (header, then payload); the works to wait on."""
        tensor = tensor.detach().contiguous().to(self.wire)
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = _DTYPES.index(tensor.dtype)
        header[1] = tensor.dim()
        header[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        wire_header = header.to(self.wire)
        return [
            self.issue(lambda: self.world.send([wire_header], peer, 2 * tag)),
            self.issue(lambda: self.world.send([tensor], peer, 2 * tag + 1)),
        ]

    def recv_tensor(self, peer: int, tag: int) -> torch.Tensor:
        """The tensor ``peer`` sent, on this rank's ``device``."""
        return self._recv_on_wire(peer, tag).to(self.device)

    def _recv_on_wire(self, peer: int, tag: int) -> torch.Tensor:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.wire)
        self.wait(self.issue(lambda: self.world.recv([header], peer, 2 * tag)))
        header = header.cpu()
        shape = [int(x) for x in header[2 : 2 + int(header[1])]]
        tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=self.wire)
        self.wait(self.issue(lambda: self.world.recv([tensor], peer, 2 * tag + 1)))
        return tensor

    def isend_bytes(self, data: bytes, peer: int, tag: int) -> tuple[list[dist.Work], torch.Tensor]:
        """Send bytes; returns the works and the buffer (keep it alive until they complete)."""
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return self.isend_tensor(buffer, peer, tag), buffer

    def recv_bytes(self, peer: int, tag: int) -> bytes:
        return self._recv_on_wire(peer, tag).cpu().numpy().tobytes()

    # --- collectives ------------------------------------------------------------------------
    def allreduce_stage(self, flat: torch.Tensor) -> None:
        """Sum ``flat`` in place over the replicas of this stage."""
        if self.stage is None:
            return
        stage = self.stage
        if flat.device == self.wire:
            self.wait(self.issue(lambda: stage.allreduce([flat])))
            return
        staged = flat.to(self.wire)
        self.wait(self.issue(lambda: stage.allreduce([staged])))
        flat.copy_(staged)

    def allreduce_pipeline(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of ``values`` (a CPU tensor) over the stages of this pipeline."""
        if self.pipeline is None:
            return values
        pipeline = self.pipeline
        buffer = values.to(self.wire)
        self.wait(self.issue(lambda: pipeline.allreduce([buffer])))
        return buffer.cpu()

    def barrier(self) -> None:
        flag = torch.zeros(1, device=self.wire)
        self.wait(self.issue(lambda: self.world.allreduce([flag])))

    def abort(self) -> None:
        """Abort every operation of these groups, also one another thread waits on (which
        then raises :class:`CommAborted`): a peer of this generation failed, or a newer plan
        is out. Any thread may call it, any number of times."""
        with self._lock:
            first = not self.aborted.is_set()
            self.aborted.set()
            pending = list(self._pending)
            calls, self._calls = self._calls, None
        for call in pending:
            call.wake.set()
        if calls is not None:
            calls.put(None)  # the helper ends once the call in its hands (if any) returns
        if first:
            self._abort_groups()
            _park(self, self.timeout_s + 5.0)

    def close(self) -> None:
        """End of the generation for this rank: abort whatever may still be in flight."""
        self.abort()

    def _abort_groups(self) -> None:
        for group in (self.pipeline, self.stage, self.world):
            if group is not None and hasattr(group, "abort"):
                try:
                    group.abort()
                except RuntimeError:
                    pass
