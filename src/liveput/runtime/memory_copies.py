"""Buddy copies: every stage's state, as of a recent step, in another instance's host memory.

A stage lost without a notice came back only from the object store, with every step since that
checkpoint redone (Gemini, SOSP'23, recovers 13x faster from in-memory checkpoints). So at each
periodic checkpoint step every working instance keeps a copy of its own layers' state in its host
memory and fetches its *sender*'s (the instance whose *buddy* it is) into it, in the background,
spread like the checkpoint's write; it says in the store which layers it holds copies of, as of
which (epoch, step) (``copies/<instance>``). A plan that would restore from the object store
restores from these copies instead where the instances still up hold every layer at a point no
older than the newest complete checkpoint: each layer is read from memory, over the link.

Buddies: in pipeline p, stage s's buddy is stage s+1 (mod P), so a stage's copy is on another
instance of its pipeline; with P = 1, replica d's is replica d+1 (mod D). An instance is the
buddy of exactly one other (the map is a permutation without a fixed point when the plan has two
or more working instances).

Copies are served by each agent's :class:`CopyServer` (TCP, on the address it trains on): a
request names (epoch, step, layer) and carries an HMAC under the job token; the reply is the
layer's state as :func:`liveput.runtime.layer_state.encode_state` signs it, read back with
``torch.load(weights_only=True)`` only after its signature checks.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import socket
import socketserver
import struct
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from liveput.errors import LiveputError
from liveput.objectstore import Pacer
from liveput.runtime.protocol import RuntimePlan

LOG = logging.getLogger(__name__)
COPY_WAIT_S = 30.0
"""How long a request for a copy not yet kept waits for it (the sender encodes it in the
background, after the step)."""
_LENGTH = struct.Struct(">Q")
_CHUNK_BYTES = 128 * 2**10


def buddy_of(plan: RuntimePlan, instance: int) -> int | None:
    """The instance that keeps copies of ``instance``'s layers under ``plan`` (None: it works
    in no slot, or it is the plan's only working instance)."""
    slot = plan.slots.get(instance)
    if slot is None or plan.num_working < 2:
        return None
    pipeline, stage = slot
    if plan.pipeline_stages > 1:
        return plan.instance_at(pipeline, (stage + 1) % plan.pipeline_stages)
    return plan.instance_at((pipeline + 1) % plan.data_parallel, stage)


def sender_to(plan: RuntimePlan, instance: int) -> int | None:
    """The instance whose layers ``instance`` keeps copies of (the inverse of
    :func:`buddy_of`; None: none)."""
    return next(
        (other for other in plan.slots if other != instance and buddy_of(plan, other) == instance),
        None,
    )


KEPT_POINTS = 2
"""Points an instance keeps copies of: the newest, and the one before while the newest is being
filled (its sender's layers arrive behind training; a loss meanwhile reads the one before)."""


@dataclass(frozen=True)
class CopyPoint:
    """The layers an instance keeps copies of as of one step."""

    epoch: int
    """Restore epoch of the step."""
    step: int
    """The last step applied to the copied layers."""
    layers: tuple[int, ...]
    """The layers."""


@dataclass(frozen=True)
class CopyRecord:
    """What an instance says in the store about its copies (``copies/<instance>``)."""

    address: str
    """``host:port`` of its copy server."""
    points: tuple[CopyPoint, ...] = ()
    """The points it keeps copies of, oldest first."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> CopyRecord:
        data = json.loads(raw)
        points = tuple(
            CopyPoint(int(p["epoch"]), int(p["step"]), tuple(int(x) for x in p["layers"]))
            for p in data.get("points", ())
        )
        return cls(str(data["address"]), points)


@dataclass(frozen=True)
class MemoryRestore:
    """Where a restore reads each layer from memory."""

    epoch: int
    """Restore epoch of the copies read."""
    step: int
    """Their step: the plan restores to it."""
    sources: dict[int, int]
    """Layer -> the instance whose copy it reads."""
    addresses: dict[int, str]
    """Instance -> its copy server's ``host:port``."""


def choose_restore(
    records: dict[int, CopyRecord],
    up: Iterable[int],
    num_layers: int,
    epoch: int,
    newest_checkpoint: int | None,
) -> MemoryRestore | None:
    """The newest point (of restore epoch ``epoch``) at which the copies of the instances
    ``up`` hold every layer, if it is no older than ``newest_checkpoint`` (None: none); each
    layer from the first instance (by id) holding it. None: no such point."""
    up = set(up)
    holders: dict[int, dict[int, int]] = {}  # step -> layer -> instance
    for instance in sorted(i for i in records if i in up):
        for point in records[instance].points:
            if point.epoch == epoch:
                for layer in point.layers:
                    holders.setdefault(point.step, {}).setdefault(layer, instance)
    for step in sorted(holders, reverse=True):
        if newest_checkpoint is not None and step < newest_checkpoint:
            return None
        sources = holders[step]
        if set(sources) == set(range(num_layers)):
            used = set(sources.values())
            return MemoryRestore(
                epoch, step, dict(sorted(sources.items())), {i: records[i].address for i in used}
            )
    return None


class MemoryCopies:
    """The signed layer states this instance keeps in host memory, as of its
    :data:`KEPT_POINTS` newest points (epoch, step): its own layers' and its sender's."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._points: dict[tuple[int, int], dict[int, bytes]] = {}

    def replace(self, epoch: int, step: int, layers: dict[int, bytes]) -> None:
        """A new point, with these layers; the oldest beyond :data:`KEPT_POINTS` is dropped."""
        with self._changed:
            self._points[(epoch, step)] = dict(layers)
            for point in sorted(self._points)[:-KEPT_POINTS]:
                del self._points[point]
            self._changed.notify_all()

    def add(self, epoch: int, step: int, layers: dict[int, bytes]) -> None:
        """Add layers to a point kept (one not kept: nothing added)."""
        with self._changed:
            if (epoch, step) in self._points:
                self._points[(epoch, step)].update(layers)
                self._changed.notify_all()

    def held(self) -> tuple[CopyPoint, ...]:
        """The points kept, oldest first, with their layers."""
        with self._changed:
            return tuple(
                CopyPoint(e, s, tuple(sorted(self._points[(e, s)])))
                for e, s in sorted(self._points)
            )

    def get(self, epoch: int, step: int, layer: int, wait_s: float = 0.0) -> bytes | None:
        """Layer ``layer``'s copy as of (epoch, step), waiting up to ``wait_s`` for that point
        while only older ones are kept (its copy is being made, behind training)."""
        with self._changed:
            self._changed.wait_for(
                lambda: bool(self._points) and max(self._points) >= (epoch, step), timeout=wait_s
            )
            return self._points.get((epoch, step), {}).get(layer)


def _request_mac(token: bytes | None, request: dict) -> str:
    body = json.dumps({k: v for k, v in request.items() if k != "mac"}, sort_keys=True).encode()
    return "" if token is None else hmac.new(token, body, hashlib.sha256).hexdigest()


class CopyServer:
    """Serves this instance's :class:`MemoryCopies` to the instances that ask (module
    docstring), each reply at the rate the request asks for, if any."""

    def __init__(self, copies: MemoryCopies, host: str, token: bytes | None) -> None:
        self.copies = copies
        self.token = token
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                server._serve(self.rfile, self.wfile)

        self._server = socketserver.ThreadingTCPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.address = f"{host}:{self._server.server_address[1]}"
        threading.Thread(
            target=self._server.serve_forever, daemon=True, name="liveput-copies"
        ).start()

    def _serve(self, rfile: io.BufferedIOBase, wfile: io.BufferedIOBase) -> None:
        try:
            request = json.loads(rfile.readline(4096))
            if not hmac.compare_digest(
                str(request.get("mac", "")), _request_mac(self.token, request)
            ):
                LOG.warning("copy request not signed with the job token: refused")
                return
            rate_bytes_per_s = float(request.get("rate_bytes_per_s") or 0)
            data = self.copies.get(
                int(request["epoch"]), int(request["step"]), int(request["layer"]), COPY_WAIT_S
            )
        except (ValueError, KeyError, TypeError, AttributeError, OSError):
            return  # not a request (a port scan, a half line): nothing to answer
        try:
            self._send(wfile, data, rate_bytes_per_s)
        except OSError as error:  # the requester left (a lost instance): its copy goes nowhere
            LOG.info("copy of layer %s not sent: %s", request.get("layer"), error)

    @staticmethod
    def _send(wfile: io.BufferedIOBase, data: bytes | None, rate_bytes_per_s: float) -> None:
        if data is None:
            wfile.write(_LENGTH.pack(0))
            return
        wfile.write(_LENGTH.pack(len(data)))
        pacer = Pacer(rate_bytes_per_s) if rate_bytes_per_s > 0 else None
        view = memoryview(data)
        for start in range(0, len(view), _CHUNK_BYTES):
            chunk = view[start : start + _CHUNK_BYTES]
            if pacer is not None:
                pacer.admit(len(chunk))
            wfile.write(chunk)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def fetch_copy(
    address: str,
    epoch: int,
    step: int,
    layer: int,
    token: bytes | None,
    timeout_s: float = COPY_WAIT_S + 30.0,
    rate_bytes_per_s: float | None = None,
) -> bytes:
    """Layer ``layer``'s copy as of (epoch, step) from the copy server at ``address`` (the
    signed bytes; :func:`liveput.runtime.layer_state.decode_state` checks and reads them)."""
    host, _, port = address.rpartition(":")
    request: dict = {"epoch": epoch, "step": step, "layer": layer}
    if rate_bytes_per_s:
        request["rate_bytes_per_s"] = rate_bytes_per_s
    request["mac"] = _request_mac(token, request)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
            connection.sendall(json.dumps(request).encode() + b"\n")
            stream = connection.makefile("rb")
            head = stream.read(_LENGTH.size)
            if len(head) < _LENGTH.size:
                raise LiveputError(f"copy server {address} refused the request for layer {layer}")
            (length,) = _LENGTH.unpack(head)
            if length == 0:
                raise LiveputError(
                    f"copy server {address} holds no copy of layer {layer} at step {step} "
                    f"(epoch {epoch})"
                )
            data = stream.read(length)
    except OSError as error:
        raise LiveputError(f"copy server {address}: {error}") from None
    if len(data) != length:
        raise LiveputError(f"copy server {address}: layer {layer}'s copy cut short")
    return data
