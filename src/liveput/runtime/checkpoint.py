"""Checkpoints, the fallback: asynchronous, every K steps, one file per layer, any fsspec path.

Each layer is saved by one of the D instances holding it (``engine.checkpoint_share``: the layers of
a stage are dealt out over its replicas): the state is copied at the step boundary (cheap) and
written by a background thread, ``<dir>/step-<s>/layer-<l>.pt``. Each instance then adds its layer
count to ``ckpt/<epoch>/<s>``; the one that brings it to L marks the checkpoint complete in
``ckpt/latest``. One file per layer lets any partition restore from it.

A layer file carries a signature (:data:`MAGIC`, then an HMAC-SHA256 of the rest under the job
token, or a SHA-256 without one): a truncated, corrupt or forged file is refused before it is
unpickled, and :meth:`Checkpointer.discard` makes the previous complete checkpoint the latest, so
the next restore uses that one. ``final/`` holds plain ``torch.save`` files, for the user.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch

from liveput.errors import LiveputError
from liveput.objectstore import (
    PACED_CHUNK_BYTES,
    Pacer,
    S3FileSystem,
    url_to_fs,
    writes_whole_objects,
)
from liveput.runtime import keys
from liveput.runtime.layer_state import LayerState
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
MAGIC = b"LPCKPT01"
"""First bytes of a signed layer file; the 32-byte signature follows, then the payload."""
_SIGNATURE_BYTES = 32


def _state_bytes(snapshot: list[tuple[int, dict]]) -> int:
    """Bytes of the tensors in a snapshot's states (about its files' size)."""

    def size(value: object) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, dict):
            return sum(size(item) for item in value.values())
        if isinstance(value, (list, tuple)):
            return sum(size(item) for item in value)
        return 0

    return sum(size(state) for _, state in snapshot)


class CorruptCheckpoint(LiveputError):
    """A layer file whose signature does not match its contents (truncated, corrupt, forged)."""


def layer_file_header(payload: bytes | memoryview, token: bytes | None) -> bytes:
    """What a signed layer file holding ``payload`` starts with (the payload follows)."""
    return MAGIC + _signature(payload, token)


def open_layer_file(data: bytes, token: bytes | None, where: str) -> bytes:
    """The payload of a signed layer file; :class:`CorruptCheckpoint` unless it checks out."""
    head = len(MAGIC) + _SIGNATURE_BYTES
    if len(data) < head or not data.startswith(MAGIC):
        raise CorruptCheckpoint(
            f"{where}: not a liveput layer file (or cut short: {len(data)} bytes)"
        )
    payload = data[head:]
    if not hmac.compare_digest(data[len(MAGIC) : head], _signature(payload, token)):
        raise CorruptCheckpoint(
            f"{where}: signature does not match (corrupt, truncated, or "
            "written with another job token)"
        )
    return payload


def _signature(payload: bytes | memoryview, token: bytes | None) -> bytes:
    if token is None:
        return hashlib.sha256(payload).digest()
    return hmac.new(token, payload, hashlib.sha256).digest()


def _order(raw: bytes | None) -> tuple[int, int]:
    """(epoch, step) of a ``ckpt/latest`` value: a newer restore epoch always wins, since a
    restore rolls training back below checkpoints of the epoch before."""
    if raw is None:
        return (-1, -1)
    data = json.loads(raw)
    return int(data.get("epoch", 0)), int(data["step"])


def latest_checkpoint(store: Store) -> int | None:
    """Step of the newest complete checkpoint of the current restore epoch's line, or None."""
    return latest_record(store)[0]


def latest_record(store: Store) -> tuple[int | None, float | None]:
    """(:func:`latest_checkpoint`, the seconds its last writer took from its snapshot to its
    layers counted), from one read; the seconds are None where not recorded (a restore's reset
    of the latest records none)."""
    raw = store.get(keys.latest_checkpoint())
    if raw is None:
        return None, None
    record = json.loads(raw)
    step = int(record["step"])
    write_s = record.get("write_s")
    return None if step < 0 else step, None if write_s is None else float(write_s)


def reset_latest(store: Store, epoch: int, step: int) -> None:
    """A restore to ``step`` opens restore epoch ``epoch``: checkpoints of older epochs beyond
    ``step`` no longer count (the job will redo those steps), whatever they finish writing."""
    store.set(keys.latest_checkpoint(), json.dumps({"epoch": epoch, "step": step}).encode())


def final_weights_written(store: Store, where: str) -> int:
    """How many checkpoint writes failed (the summary's ``checkpoints_failed``); a one-line
    LiveputError if the final weights could not be written (the run must not end as saved)."""
    from liveput.runtime.store import readers

    failed, last = readers.checkpoint_failures(store)
    if last is not None and last.get("final"):
        raise LiveputError(
            f"{where}: the trained weights could not be saved ({last.get('error')}); "
            f"{failed} checkpoint write(s) failed"
        )
    if failed:
        LOG.warning("%s: %d checkpoint write(s) failed (%s)", where, failed, last)
    return failed


class CheckpointListener(Protocol):
    """Told of every checkpoint this instance completes (the job's evaluation,
    :mod:`liveput.runtime.evaluation`); it must return at once and never raise."""

    def checkpoint_complete(self, epoch: int, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Checkpointer:
    """Saves and loads layer files under ``directory`` (a local path or an fsspec URL)."""

    def __init__(
        self, store: Store, directory: str, keep: int = 2, token: bytes | None = None
    ) -> None:
        self.store = store
        self.token = token
        """Signs the layer files (HMAC-SHA256); None: a plain SHA-256, which catches corruption
        but not forgery."""
        self.keep = max(1, keep)
        self.directory = directory.rstrip("/")
        self.fs, self.root = url_to_fs(self.directory)
        self._write_aside = not writes_whole_objects(self.fs)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: list[Future] = []
        self._pacers: list[Pacer] = []
        """The pacers of the newest spread writes: :meth:`flush` hurries them."""
        self._lock = threading.Lock()
        self.listeners: list[CheckpointListener] = []
        """Told of each checkpoint whose last layer this instance wrote."""
        self.still_read: Callable[[int], bool] = lambda step: False
        """Whether the checkpoint of a step is still to be read by someone other than a restore
        (an evaluation of it not yet recorded, on whichever instance runs it): pruning leaves
        it on disk, and on the complete list, until a later prune finds it read."""

    def _path(self, step: int, layer: int) -> str:
        return f"{self.root}/step-{step}/layer-{layer}.pt"

    def save_async(
        self,
        epoch: int,
        step: int,
        layers: list[LayerState],
        num_layers: int,
        spread_s: float | None = None,
    ) -> float:
        """Snapshot ``layers`` after step ``step`` now; write them in the background, spread
        over ``spread_s`` seconds where given (None: as fast as the link goes). Seconds the
        snapshot took (on training's critical path)."""
        taken_s = time.perf_counter()
        states = {layer.index: layer.state_dict() for layer in layers}
        self.write_async(epoch, step, states, num_layers, spread_s, taken_s)
        return time.perf_counter() - taken_s

    def write_async(
        self,
        epoch: int,
        step: int,
        states: dict[int, dict],
        num_layers: int,
        spread_s: float | None = None,
        taken_s: float | None = None,
    ) -> None:
        """Write ``states`` (layer -> a snapshot of its state after step ``step``, which nothing
        changes any more: shared with the buddy copies) in the background, as
        :meth:`save_async`; ``taken_s``: when the snapshot was taken (``time.perf_counter``;
        None: now), from which the write's time is counted."""
        taken_s = time.perf_counter() if taken_s is None else taken_s
        snapshot = list(states.items())
        pacer = None
        if spread_s is not None and spread_s > 0:
            pacer = Pacer(max(1.0, _state_bytes(snapshot) / spread_s))
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(
                self._pool.submit(self._write, epoch, step, snapshot, num_layers, taken_s, pacer)
            )
            if pacer is not None:
                self._pacers = [*self._pacers[-4:], pacer]

    def writing(self) -> bool:
        """A write is running or waiting to."""
        with self._lock:
            return any(not f.done() for f in self._pending)

    def _write(
        self,
        epoch: int,
        step: int,
        snapshot: list[tuple[int, dict]],
        num_layers: int,
        taken_s: float,
        pacer: Pacer | None = None,
    ) -> None:
        try:
            if _order(self.store.get(keys.latest_checkpoint()))[0] > epoch:
                return  # a restore rolled training back since: these steps will be redone
            self.fs.makedirs(f"{self.root}/step-{step}", exist_ok=True)
            for index, state in snapshot:
                buffer = io.BytesIO()
                torch.save(state, buffer)
                payload = buffer.getbuffer()
                # Written aside then moved: a restore never reads a half-written layer file
                # (an object store shows an object only once whole: written in place).
                final = self._path(step, index)
                partial = f"{final}.partial-{epoch}" if self._write_aside else final
                self._write_file(partial, layer_file_header(payload, self.token), payload, pacer)
                del payload
                if partial != final:
                    self.fs.mv(partial, final)
            if self.store.add(keys.checkpoint_layers(epoch, step), len(snapshot)) == num_layers:
                # Its time unpaced: what a write waited for (Rule 9's lead) takes.
                held_s = 0.0 if pacer is None else pacer.slept_s
                if self._mark_latest(epoch, step, time.perf_counter() - taken_s - held_s):
                    self._prune(step)
                for listener in self.listeners:
                    listener.checkpoint_complete(epoch, step)
        except Exception as error:  # noqa: BLE001 - the previous checkpoint stays the latest
            LOG.exception("checkpoint of step %d failed", step)
            self._failed(step, error, final=False)

    def _write_file(
        self, path: str, header: bytes, payload: memoryview, pacer: Pacer | None
    ) -> None:
        """One layer file. Header and payload are written apart: no copy of a layer's state
        joins them (two copies cost a busy core 10 ms or more per checkpoint). Paced, an
        object store's upload is paced as it is sent; a file is written in paced chunks."""
        if pacer is not None and isinstance(self.fs, S3FileSystem):
            with self.fs.open(path, "wb", pacer=pacer) as handle:
                handle.write(header)
                handle.write(payload)
            return
        with self.fs.open(path, "wb") as handle:
            handle.write(header)
            if pacer is None:
                handle.write(payload)
                return
            for start in range(0, len(payload), PACED_CHUNK_BYTES):
                chunk = payload[start : start + PACED_CHUNK_BYTES]
                pacer.admit(len(chunk))
                handle.write(chunk)

    def _failed(self, step: int | None, error: BaseException, final: bool) -> None:
        """Say in the store that a write failed: the job's status, summary and exit code show
        it (a run that believed itself protected would be the costliest failure)."""
        lines = str(error).splitlines()
        reason = getattr(error, "strerror", None) or (lines[0] if lines else "")
        detail = {
            "step": step,
            "final": final,
            "error": f"{self.directory}: {reason or type(error).__name__}",
        }
        try:
            self.store.add(keys.checkpoint_failures(), 1)
            self.store.set(keys.checkpoint_failure(), json.dumps(detail).encode())
        except Exception:  # noqa: BLE001 - the store is gone too: the log has said it
            LOG.warning("could not record the failed checkpoint in the store")

    def _mark_latest(self, epoch: int, step: int, write_s: float) -> bool:
        """Make (epoch, step) the latest checkpoint unless a newer one is; whether it did.
        ``write_s``: seconds from this writer's snapshot to its layers counted (a checkpoint
        asked for before a wipe-out must fit in its lead: the coordinator aims it with this)."""
        while True:
            raw = self.store.get(keys.latest_checkpoint())
            if _order(raw) >= (epoch, step):
                return False
            record = {"epoch": epoch, "step": step, "write_s": round(write_s, 4)}
            value = json.dumps(record).encode()
            if self.store.compare_and_set(keys.latest_checkpoint(), raw, value):
                LOG.info("checkpoint of step %d complete", step)
                return True

    def _prune(self, step: int) -> None:
        """Keep the newest ``keep`` complete checkpoints on disk (``final/`` is never touched).

        Complete steps are listed in ``ckpt/complete``; after a restore the job may complete a
        step again, which counts once, as the newest. Only a checkpoint that became the latest
        prunes, and the latest is never pruned: a restore may be reading it; neither is one
        :attr:`still_read` (an evaluation may be reading it)."""
        while True:
            raw = self.store.get(keys.complete_checkpoints())
            steps = [s for s in (json.loads(raw) if raw else []) if s != step] + [step]
            kept, dropped = steps[-self.keep :], steps[: -self.keep]
            waiting = [s for s in dropped if self.still_read(s)]
            kept, dropped = [*waiting, *kept], [s for s in dropped if s not in waiting]
            if self.store.compare_and_set(
                keys.complete_checkpoints(), raw, json.dumps(kept).encode()
            ):
                break
        latest = latest_checkpoint(self.store)
        for old in dropped:
            if old in kept or old == latest:
                continue
            try:
                self.fs.rm(f"{self.root}/step-{old}", recursive=True)
            except FileNotFoundError:
                pass

    def load_layer(self, step: int, layer: int) -> dict:
        """Layer ``layer`` of the checkpoint of step ``step``; :class:`CorruptCheckpoint` if its
        signature does not match, ``OSError`` if it cannot be read."""
        relative = f"step-{step}/layer-{layer}.pt"
        with self.fs.open(f"{self.root}/{relative}", "rb") as handle:
            data = handle.read()
        payload = open_layer_file(data, self.token, f"checkpoint {self.directory}/{relative}")
        try:
            return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        except Exception as error:  # noqa: BLE001 - signed but unreadable is corrupt as well
            raise CorruptCheckpoint(f"checkpoint {self.directory}/{relative}: {error}") from None

    def load_layer_file(self, relative: str) -> dict:
        """A plain layer file under the checkpoint directory (``final/layer-0.pt``)."""
        with self.fs.open(f"{self.root}/{relative}", "rb") as handle:
            data = handle.read()
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")

    def discard(self, step: int) -> int | None:
        """Stop using the checkpoint of step ``step`` (a layer file of it is corrupt): the
        newest complete one before it becomes the latest; that step (None: none is left, the
        next restore starts from the initial weights)."""
        while True:
            raw = self.store.get(keys.complete_checkpoints())
            steps = json.loads(raw) if raw else []
            kept = [s for s in steps if s != step]
            if self.store.compare_and_set(
                keys.complete_checkpoints(), raw, json.dumps(kept).encode()
            ):
                break
        fallback = max((s for s in kept if s < step), default=-1)
        while True:
            raw = self.store.get(keys.latest_checkpoint())
            if raw is None or int(json.loads(raw)["step"]) != step:
                break  # another instance discarded it already, or a newer one completed
            epoch = _order(raw)[0]
            value = json.dumps({"epoch": epoch, "step": fallback}).encode()
            if self.store.compare_and_set(keys.latest_checkpoint(), raw, value):
                LOG.warning(
                    "checkpoint of step %d is corrupt; the latest is now %s",
                    step,
                    f"step {fallback}" if fallback >= 0 else "the initial weights",
                )
                break
        return None if fallback < 0 else fallback

    def save_now(self, name: str, layers: list[LayerState]) -> bool:
        """Write ``layers`` synchronously under ``<dir>/<name>/`` (final weights); whether it
        could (a failure is recorded in the store, as a checkpoint's is)."""
        try:
            self.fs.makedirs(f"{self.root}/{name}", exist_ok=True)
            for layer in layers:
                buffer = io.BytesIO()
                torch.save(layer.state_dict(), buffer)
                with self.fs.open(f"{self.root}/{name}/layer-{layer.index}.pt", "wb") as handle:
                    handle.write(buffer.getvalue())
        except Exception as error:  # noqa: BLE001 - recorded: the run ends non-zero
            LOG.exception("writing the %s weights failed", name)
            self._failed(None, error, final=True)
            return False
        return True

    def save_if_asked(
        self,
        generation: int,
        epoch: int,
        step: int,
        share: list[LayerState],
        num_layers: int,
        periodic: bool,
    ) -> bool:
        """When the coordinator asked generation ``generation``'s instances to checkpoint the step
        they end at (``ckpt-now/<g>``: every holder of a layer has a notice), write ``share`` of
        step ``step`` now, unless ``periodic`` (the periodic checkpoint of that step has it), and
        wait for the write: the instance may be gone soon after. Whether it was asked."""
        try:
            asked = self.store.get(keys.checkpoint_request(generation)) is not None
        except LiveputError:
            return False  # the store is down: the restore falls back to the periodic checkpoint
        if not asked:
            return False
        if share and not periodic:
            self.save_async(epoch, step, share, num_layers)
        self.flush()
        LOG.info("checkpoint of step %d asked before the notices' end: written", step)
        return True

    def flush(self) -> None:
        """Wait for every write pending, unpaced from now on: whoever flushes waits for them
        (a checkpoint asked for before instances go came behind a periodic one's spread
        write, and the instances went before it was written: 40 steps redone)."""
        with self._lock:
            pending = list(self._pending)
            for pacer in self._pacers:
                pacer.hurry()
        for future in pending:
            future.result()
        for listener in self.listeners:
            listener.flush()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
        for listener in self.listeners:
            listener.close()
