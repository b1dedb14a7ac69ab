"""Checkpoints, the fallback: asynchronous, every K steps, one file per layer, any fsspec path.

Pipeline 0 holds every layer once, so its instances save their layers: the state is copied at the
step boundary (cheap) and written by a background thread, ``<dir>/step-<s>/layer-<l>.pt``. Each
instance then adds its layer count to ``ckpt/<epoch>/<s>``; the one that brings it to L marks the
checkpoint complete in ``ckpt/latest``. One file per layer lets any partition restore from it.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import fsspec
import torch

from liveput.runtime.layer_state import LayerState
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)
LATEST = "ckpt/latest"
COMPLETE = "ckpt/complete"
"""The steps of the complete checkpoints still on disk, oldest first."""


def _order(raw: bytes | None) -> tuple[int, int]:
    """(epoch, step) of a ``ckpt/latest`` value: a newer restore epoch always wins, since a
    restore rolls training back below checkpoints of the epoch before."""
    if raw is None:
        return (-1, -1)
    data = json.loads(raw)
    return int(data.get("epoch", 0)), int(data["step"])


def latest_checkpoint(store: Store) -> int | None:
    """Step of the newest complete checkpoint of the current restore epoch's line, or None."""
    raw = store.get(LATEST)
    if raw is None:
        return None
    step = int(json.loads(raw)["step"])
    return None if step < 0 else step


def reset_latest(store: Store, epoch: int, step: int) -> None:
    """A restore to ``step`` opens restore epoch ``epoch``: checkpoints of older epochs beyond
    ``step`` no longer count (the job will redo those steps), whatever they finish writing."""
    store.set(LATEST, json.dumps({"epoch": epoch, "step": step}).encode())


class Checkpointer:
    """Saves and loads layer files under ``directory`` (a local path or an fsspec URL)."""

    def __init__(self, store: Store, directory: str, keep: int = 2) -> None:
        self.store = store
        self.keep = max(1, keep)
        self.directory = directory.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.directory)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: list[Future] = []
        self._lock = threading.Lock()

    def _path(self, step: int, layer: int) -> str:
        return f"{self.root}/step-{step}/layer-{layer}.pt"

    def save_async(self, epoch: int, step: int, layers: list[LayerState], num_layers: int) -> None:
        """Snapshot ``layers`` after step ``step`` now; write them in the background."""
        snapshot = [(layer.index, layer.state_dict()) for layer in layers]
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._pool.submit(self._write, epoch, step, snapshot, num_layers))

    def _write(self, epoch: int, step: int, snapshot: list[tuple[int, dict]],
               num_layers: int) -> None:
        try:
            if _order(self.store.get(LATEST))[0] > epoch:
                return  # a restore rolled training back since: these steps will be redone
            self.fs.makedirs(f"{self.root}/step-{step}", exist_ok=True)
            for index, state in snapshot:
                buffer = io.BytesIO()
                torch.save(state, buffer)
                # Written aside then moved: a restore never reads a half-written layer file.
                partial = f"{self._path(step, index)}.partial-{epoch}"
                with self.fs.open(partial, "wb") as handle:
                    handle.write(buffer.getvalue())
                self.fs.mv(partial, self._path(step, index))
            if self.store.add(f"ckpt/{epoch}/{step}", len(snapshot)) == num_layers:
                if self._mark_latest(epoch, step):
                    self._prune(step)
        except Exception:  # noqa: BLE001 - a failed checkpoint only leaves the previous one latest
            LOG.exception("checkpoint of step %d failed", step)

    def _mark_latest(self, epoch: int, step: int) -> bool:
        """Make (epoch, step) the latest checkpoint unless a newer one is; whether it did."""
        while True:
            raw = self.store.get(LATEST)
            if _order(raw) >= (epoch, step):
                return False
            value = json.dumps({"epoch": epoch, "step": step}).encode()
            if self.store.compare_and_set(LATEST, raw, value):
                LOG.info("checkpoint of step %d complete", step)
                return True

    def _prune(self, step: int) -> None:
        """Keep the newest ``keep`` complete checkpoints on disk (``final/`` is never touched).

        Complete steps are listed in ``ckpt/complete``; after a restore the job may complete a
        step again, which counts once, as the newest. Only a checkpoint that became the latest
        prunes, and the latest is never pruned: a restore may be reading it."""
        while True:
            raw = self.store.get(COMPLETE)
            steps = [s for s in (json.loads(raw) if raw else []) if s != step] + [step]
            kept, dropped = steps[-self.keep:], steps[:-self.keep]
            if self.store.compare_and_set(COMPLETE, raw, json.dumps(kept).encode()):
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
        return self.load_layer_file(f"step-{step}/layer-{layer}.pt")

    def load_layer_file(self, relative: str) -> dict:
        """A layer file under the checkpoint directory (e.g. ``final/layer-0.pt``)."""
        with self.fs.open(f"{self.root}/{relative}", "rb") as handle:
            data = handle.read()
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")

    def save_now(self, name: str, layers: list[LayerState]) -> None:
        """Write ``layers`` synchronously under ``<dir>/<name>/`` (final weights)."""
        self.fs.makedirs(f"{self.root}/{name}", exist_ok=True)
        for layer in layers:
            buffer = io.BytesIO()
            torch.save(layer.state_dict(), buffer)
            with self.fs.open(f"{self.root}/{name}/layer-{layer.index}.pt", "wb") as handle:
                handle.write(buffer.getvalue())

    def flush(self) -> None:
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.result()

    def close(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
