"""The coordination store: a small key-value contract with compare-and-set.

The runtime keeps its shared state (membership, the current plan, the committed step, heartbeats)
behind :class:`Store`. Keys are ``str`` (``/``-separated paths by convention), values are ``bytes``.
Backends:

- :class:`MemoryStore` -- a thread-safe in-process fake, for unit tests only.
- :class:`TCPStoreBackend` -- PyTorch's ``torch.distributed.TCPStore``; the coordinator hosts it.
- :class:`EtcdStore` -- etcd v3 through its JSON gateway (``etcd3gw``).
- :class:`SignedStore` -- wraps any store; every value carries an HMAC-SHA256 under the job token.

:func:`open_store` picks a backend from a URL (``tcp://``, ``etcd://``, ``memory://``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import operator
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from liveput.errors import LiveputError

log = logging.getLogger(__name__)

_T = TypeVar("_T")  # what a wrapped backend call returns

__all__ = [
    "Store",
    "MemoryStore",
    "TCPStoreBackend",
    "EtcdStore",
    "SignedStore",
    "open_store",
    "parse_host_port",
]


class Store(ABC):
    """A key-value store with compare-and-set, shared by the coordinator and the agents.

    Every method may raise :class:`LiveputError` when the backend is unreachable; the message names
    the store's URL.
    """

    url: str = "memory://"
    """Where the store is (``tcp://HOST:PORT``, ``etcd://HOST:PORT``, ``memory://``), for messages."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None`` if absent."""

    @abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` unconditionally."""

    @abstractmethod
    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        """Atomically set ``key`` to ``value`` if its current value equals ``expected``.

        ``expected=None`` means "create only if absent". Returns ``True`` if the value was swapped.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing an absent key is not an error."""

    @abstractmethod
    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """All keys starting with ``prefix`` and their values."""

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer counter at ``key`` (absent = 0); the new value.

        Counters are stored as ASCII decimal bytes, so ``get`` on a counter returns e.g. ``b"3"``.
        """

    @abstractmethod
    def wait_for(self, key: str, timeout_s: float) -> bytes:
        """Block until ``key`` exists and return its value; :class:`LiveputError` after ``timeout_s``."""

    @abstractmethod
    def close(self) -> None:
        """Release connections (and stop a hosted server). Idempotent."""

    def compact_history(self) -> None:
        """Drop the history of past values the backend keeps (etcd's revisions); a no-op for
        backends that keep none. Called by the coordinator after it prunes dead keys."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise LiveputError(f"store key must be a non-empty str, got {key!r}")
    return key


def _check_value(value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise LiveputError(f"store value must be bytes, got {type(value).__name__}")
    return bytes(value)


def _format_url(scheme: str, host_name: str, port: int) -> str:
    return f"{scheme}://[{host_name}]:{port}" if ":" in host_name else f"{scheme}://{host_name}:{port}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _wait_by_polling(store: Store, key: str, timeout_s: float) -> bytes:
    """``store.get(key)`` with a growing pause (5 ms to 50 ms) until the key exists or time is up."""
    _check_key(key)
    deadline = time.monotonic() + timeout_s
    pause_s = 0.005
    while True:
        value = store.get(key)
        if value is not None:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise LiveputError(f"timed out after {timeout_s:g} s waiting for key {key!r} in {store.url}")
        time.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, 0.05)


def _parse_counter(key: str, raw: bytes | None) -> int:
    if raw is None:
        return 0
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise LiveputError(f"store key {key!r} holds {raw[:32]!r}, not an integer counter") from None


class MemoryStore(Store):
    """A thread-safe in-memory store: the fake for unit tests (not shared across processes)."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise LiveputError(f"store {self.url} is closed")

    def get(self, key: str) -> bytes | None:
        _check_key(key)
        with self._cond:
            self._check_open()
            return self._data.get(key)

    def set(self, key: str, value: bytes) -> None:
        _check_key(key)
        value = _check_value(value)
        with self._cond:
            self._check_open()
            self._data[key] = value
            self._cond.notify_all()

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        _check_key(key)
        value = _check_value(value)
        with self._cond:
            self._check_open()
            if self._data.get(key) != (None if expected is None else bytes(expected)):
                return False
            self._data[key] = value
            self._cond.notify_all()
            return True

    def delete(self, key: str) -> None:
        _check_key(key)
        with self._cond:
            self._check_open()
            self._data.pop(key, None)

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        with self._cond:
            self._check_open()
            return {k: v for k, v in sorted(self._data.items()) if k.startswith(prefix)}

    def add(self, key: str, amount: int) -> int:
        _check_key(key)
        with self._cond:
            self._check_open()
            new = _parse_counter(key, self._data.get(key)) + int(amount)
            self._data[key] = str(new).encode("ascii")
            self._cond.notify_all()
            return new

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        _check_key(key)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check_open()
                if key in self._data:
                    return self._data[key]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LiveputError(f"timed out after {timeout_s:g} s waiting for key {key!r} in {self.url}")
                self._cond.wait(left)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


# -- PyTorch TCPStore --------------------------------------------------------------------------------

# Stored form of a value: b"v" + 8-byte nonce + value. The TCPStore's own compare_set answers with the
# value it holds afterwards, which cannot tell "I swapped" from "someone else already wrote what I
# wanted" unless every write is unique, hence the nonce. A stored value is never empty, so the empty
# string can mean "absent" in compare_set, and a marker that no value can equal lets compare_set act
# as a non-blocking read (TCPStore.get blocks until the key exists).
_TCP_TAG = b"v"
_TCP_NONCE_BYTES = 8
_TCP_ABSENT = b"\x00liveput-absent\x00"
_CAS_MAX_ROUNDS = 10_000


_TCP_INDEX = "__liveput_index__/"
"""Namespace of the TCP backend's listing index (never listed itself)."""
_HOLE_PATIENCE_S = 120.0
"""How long a listing keeps re-reading an index entry that was counted but is not there."""
_SWEEP_MIN_ENTRIES = 1024
"""A client checks which of the keys it has read from the index still exist when it knows
twice as many as at its last check (and at least this many): keys deleted under prefixes it
never lists would otherwise pile up in its memory."""


def _tcp_encode(value: bytes) -> bytes:
    return _TCP_TAG + os.urandom(_TCP_NONCE_BYTES) + value


def _tcp_decode(raw: bytes) -> bytes:
    if raw[:1] == _TCP_TAG and len(raw) >= 1 + _TCP_NONCE_BYTES:
        return raw[1 + _TCP_NONCE_BYTES :]
    return raw  # written by another TCPStore user (e.g. torch.distributed itself)


class TCPStoreBackend(Store):
    """A store on ``torch.distributed.TCPStore``: no server to install; the coordinator hosts it.

    With ``host=True`` this process runs the server, listening on ``host_name:port`` only (port 0
    picks a free one; see :attr:`port`). The server keeps everything in memory, so its data dies
    with the hosting process.

    Prefix listing reads an index of the keys this contract has written, kept in the store itself:
    an append-only list (``count`` and one key per entry) and a marker per indexed key. A writer
    that may create a key indexes it *before* the write (unless its marker is there: a new entry,
    then the marker), so a writer killed right after its write (a SIGKILLed agent whose ledger
    record had just landed) leaves the key listed; it checks the marker again after the write,
    for a key deleted meanwhile. Writers racing on a new key may index it twice (both entries go
    with the key). An entry counted but not written is read again at each listing, and the
    entries after it are listed meanwhile; a listed key not written yet (its marker is there) is
    kept and read again at the next listing. ``TCPStore.list_keys`` is not used: it was seen to
    hang forever, with the server spinning, after clients were SIGKILLed mid-job.

    :meth:`delete` removes the key's marker, then its index entries, then the key, so a pruned
    job keeps a bounded index: a write that lands after the delete finds no marker and is
    indexed again. A client that meets a deleted entry takes it for an unwritten one; such holes
    are given up after ``_HOLE_PATIENCE_S`` (a writer takes microseconds between its two calls).
    """

    def __init__(self, host_name: str, port: int, *, host: bool = False, timeout_s: float = 30.0) -> None:
        import torch.distributed as dist

        self._timeout_s = float(timeout_s)
        self.url = _format_url("tcp", host_name, port)
        self._entries: dict[str, set[int]] = {}
        """Listed key -> the index entries naming it that this client has read."""
        self._index_read = 0
        """Index entries read so far (1 to this), holes included."""
        self._sweep_at = _SWEEP_MIN_ENTRIES
        """Check which known keys still exist once ``_entries`` is this long."""
        self._index_holes: dict[int, float] = {}
        """Entries counted but not written when read (a writer between its two calls, one that
        died there, or an entry deleted before this client read it) -> when first missed."""
        listen_fd = None
        if host:
            listen_fd, port = self._listen(host_name, port)
            self.url = _format_url("tcp", host_name, port)
        else:
            self._reach(host_name, port)
        try:
            self._store: Any = dist.TCPStore(
                host_name,
                port,
                None,
                host,
                timedelta(seconds=self._timeout_s),
                wait_for_workers=False,
                master_listen_fd=listen_fd,
                # The classic server: a hang after clients were SIGKILLed was first blamed on the
                # libuv one; it was list_keys (class docstring), but the classic server is kept.
                use_libuv=False,
            )
        except RuntimeError as exc:
            if listen_fd is not None:
                os.close(listen_fd)
            raise LiveputError(f"store {self.url} unreachable: {_first_line(exc)}") from None
        self.port = int(port)
        log.debug("opened %s (hosting=%s)", self.url, host)

    def _reach(self, host_name: str, port: int) -> None:
        """Wait, at most the timeout, until the server accepts a connection. c10d's client
        retries a failed connect once after a delay as long as the timeout, so an address that
        refuses would take twice the timeout the user gave to be reported."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            left_s = deadline - time.monotonic()
            try:
                with socket.create_connection((host_name, port), timeout=max(0.05, left_s)):
                    return
            except OSError as exc:
                if time.monotonic() + 0.2 >= deadline:
                    raise LiveputError(
                        f"store {self.url} unreachable after {self._timeout_s:g} s: "
                        f"{exc.strerror or exc}") from None
            time.sleep(0.2)  # refused: the server may still be starting

    def _listen(self, host_name: str, port: int) -> tuple[int, int]:
        # The TCPStore server binds every interface by default; handing it our own socket keeps it on
        # the address asked for.
        try:
            family, _, _, _, address = socket.getaddrinfo(host_name, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            raise LiveputError(f"store {self.url}: cannot listen: {exc}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise LiveputError(f"store {self.url}: cannot listen: {exc}") from None
        bound_port = sock.getsockname()[1]
        return sock.detach(), bound_port

    @property
    def torch_store(self) -> Any:
        """The underlying ``torch.distributed.TCPStore`` (e.g. under a ``PrefixStore`` for process
        groups). Its raw values are not this class's encoded ones: keep the key spaces apart. A
        hosted server keeps running until every reference to it is gone, :meth:`close` included."""
        if self._store is None:
            raise LiveputError(f"store {self.url} is closed")
        return self._store

    def _call(self, fn: Callable[[Any], _T]) -> _T:
        store = self._store
        if store is None:
            raise LiveputError(f"store {self.url} is closed")
        try:
            return fn(store)
        except RuntimeError as exc:
            raise LiveputError(f"store {self.url} failed: {_first_line(exc)}") from None

    def _raw_get(self, key: str) -> bytes | None:
        raw = self._call(lambda s: s.compare_set(key, _TCP_ABSENT, _TCP_ABSENT))
        return None if raw == _TCP_ABSENT else bytes(raw)

    def _swap(self, key: str, expected_raw: bytes | None, new_raw: bytes) -> bytes:
        return bytes(self._call(lambda s: s.compare_set(key, expected_raw or b"", new_raw)))

    def get(self, key: str) -> bytes | None:
        raw = self._raw_get(_check_key(key))
        return None if raw is None else _tcp_decode(raw)

    def _register(self, key: str) -> None:
        """Put ``key`` in the listing index unless its marker says it is there (class docstring).

        Called before every write that may create the key (a writer killed just after it leaves
        it listed) and after it (a key deleted meanwhile, by any client, is indexed again)."""
        marker = f"{_TCP_INDEX}seen/{key}"
        if self._raw_get(marker) is None:
            entry = self._call(lambda s: s.add(f"{_TCP_INDEX}count", 1))
            self._call(lambda s: s.set(f"{_TCP_INDEX}{entry}", key.encode()))
            self._call(lambda s: s.set(marker, b"1"))

    def set(self, key: str, value: bytes) -> None:
        raw = _tcp_encode(_check_value(value))
        self._register(_check_key(key))
        self._call(lambda s: s.set(key, raw))
        self._register(key)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        _check_key(key)
        new_raw = _tcp_encode(_check_value(value))
        if expected is None:
            self._register(key)
            swapped = self._swap(key, None, new_raw) == new_raw
            self._register(key)
            return swapped
        expected = bytes(expected)
        for _ in range(_CAS_MAX_ROUNDS):
            raw = self._raw_get(key)
            if raw is None or _tcp_decode(raw) != expected:
                return False
            if self._swap(key, raw, new_raw) == new_raw:
                return True
            # Lost to a concurrent write; if it wrote the same value, the CAS may still succeed.
        raise LiveputError(f"store {self.url}: compare_and_set on {key!r} kept losing races")

    def delete(self, key: str) -> None:
        _check_key(key)
        if key not in self._entries:
            self._read_index()
        # Marker first, key last: a write of the key after its deletion then re-indexes it.
        self._call(lambda s: s.delete_key(f"{_TCP_INDEX}seen/{key}"))
        for entry in sorted(self._entries.pop(key, ())):
            self._call(operator.methodcaller("delete_key", f"{_TCP_INDEX}{entry}"))
        self._call(lambda s: s.delete_key(key))

    def key_count(self) -> int:
        """Keys the server holds, the listing index's own included (for measurements)."""
        return int(self._call(lambda s: s.num_keys()))

    def _read_index(self) -> None:
        """Read the index entries written since the last read, and the holes again."""
        count = int(self._call(lambda s: s.add(f"{_TCP_INDEX}count", 0)))
        # A hole must not hide what comes after it: a writer killed between counting and
        # writing its entry left one for good, and every key registered later (new members'
        # heartbeats) went unlisted, so the job waited for instances that were there.
        now = time.monotonic()
        unread = [*sorted(self._index_holes), *range(self._index_read + 1, count + 1)]
        self._index_read = max(self._index_read, count)
        for entry in unread:
            raw = self._raw_get(f"{_TCP_INDEX}{entry}")
            if raw is None:  # its writer is between counting and writing it (or died there)
                missed_s = self._index_holes.setdefault(entry, now)
                if now - missed_s > _HOLE_PATIENCE_S:
                    del self._index_holes[entry]  # died there, or deleted before we read it
            else:
                self._index_holes.pop(entry, None)
                self._entries.setdefault(raw.decode(), set()).add(entry)
        if len(self._entries) >= self._sweep_at:
            for key in list(self._entries):
                if self._raw_get(key) is None:
                    self._forget(key)
            self._sweep_at = max(_SWEEP_MIN_ENTRIES, 2 * len(self._entries))

    def _forget(self, key: str) -> None:
        """``key`` is not there: if its marker is gone too it was deleted: drop it here (a new
        write indexes it again) and its index entries (a writer's ``set`` is one-way, so a
        deleter may read the entry after deleting the key; the entry would stay for good). With
        its marker there, a writer indexed it and is about to write it: keep it listed."""
        if self._raw_get(f"{_TCP_INDEX}seen/{key}") is not None:
            return
        entries = self._entries.pop(key, set())
        for entry in sorted(entries):
            self._call(operator.methodcaller("delete_key", f"{_TCP_INDEX}{entry}"))

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        self._read_index()
        found: dict[str, bytes] = {}
        for key in sorted(k for k in self._entries if k.startswith(prefix)):
            raw = self._raw_get(key)
            if raw is None:  # deleted since listed
                self._forget(key)
            else:
                found[key] = _tcp_decode(raw)
        return found

    def add(self, key: str, amount: int) -> int:
        _check_key(key)
        for _ in range(_CAS_MAX_ROUNDS):
            raw = self._raw_get(key)
            new = _parse_counter(key, None if raw is None else _tcp_decode(raw)) + int(amount)
            new_raw = _tcp_encode(str(new).encode("ascii"))
            if raw is None:
                self._register(key)
            if self._swap(key, raw, new_raw) == new_raw:
                if raw is None:
                    self._register(key)
                return new
        raise LiveputError(f"store {self.url}: add on {key!r} kept losing races")

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        # TCPStore.wait would hold the client's socket (and every other thread) for the whole wait.
        return _wait_by_polling(self, key, timeout_s)

    def close(self) -> None:
        # Dropping the last reference stops a hosted server and closes the client socket.
        self._store = None


# -- etcd v3 ------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\x00"  # etcd: range_end "\0" means "to the end of the keyspace"
    return stripped[:-1] + bytes([stripped[-1] + 1])


_OPS = b"\x00ops/"
"""Prefix of the transaction markers (no user key starts with a NUL byte)."""
_OP_LEASE_TTL_S = 600
"""Seconds a transaction marker lives (far longer than any retry of its transaction)."""
_OP_LEASE_RENEW_S = 300
"""A client takes a new marker lease when its lease is this old, seconds."""
_SETTLED_PER_TXN = 16
"""Answered transactions' markers a transaction deletes with its own writes, at most."""


class EtcdStore(Store):
    """A store on an etcd v3 cluster, through its JSON gateway (``etcd3gw``).

    Compare-and-set is one etcd transaction; counters are a read then a transaction guarded by the
    key's mod revision, retried on conflict. A request that fails to connect is retried with a short
    pause until ``timeout_s`` has passed, so clients ride out an etcd restart; after that the error
    names the URL.

    A transaction etcd applied whose reply a restart cut off fails its guard when retried (it
    changed the key itself). So that it is not applied twice (a commit vote counted twice leaves a
    step nobody commits), each transaction also writes a marker key ``\0ops/<uuid>`` on success;
    a retried transaction whose guard failed succeeded if its marker exists. A marker is useless
    once its transaction has answered: the client's next transactions delete it (at most
    ``_SETTLED_PER_TXN`` each, in the same request), so a client holds about as many markers
    as it has transactions in flight. A marker whose client died meanwhile goes with its lease,
    ``_OP_LEASE_TTL_S`` later.

    :meth:`compact_history` compacts etcd's revision history up to the current revision:
    every write (a commit vote, a heartbeat) is a revision, and etcd keeps them all until
    compacted. Its database file keeps its size (``etcdctl defrag`` returns the space), but the
    pages freed are reused, so it stops growing.
    """

    def __init__(self, host_name: str, port: int, *, timeout_s: float = 30.0) -> None:
        import etcd3gw
        import requests

        self.url = _format_url("etcd", host_name, port)
        self._timeout_s = float(timeout_s)
        self._exceptions = etcd3gw.exceptions
        self._request_error = requests.exceptions.RequestException
        self._client: Any = etcd3gw.Etcd3Client(host=host_name, port=port, timeout=self._timeout_s)
        self._closed = False
        self._lease: tuple[str, float] | None = None
        """(lease ID, monotonic time granted) of this client's transaction markers."""
        self._settled: list[bytes] = []
        """Markers of transactions that have answered, to delete (shared by threads)."""
        self._settled_lock = threading.Lock()
        self._compacted = 0
        """The revision history was compacted up to this revision."""
        self._post("maintenance/status", {})
        log.debug("opened %s", self.url)

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._post_counting(path, payload)[0]

    def _post_counting(self, path: str, payload: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The reply and the number of attempts it took."""
        if self._closed:
            raise LiveputError(f"store {self.url} is closed")
        # Connection-level failures only: a request etcd answered with an error is not retried.
        transient = (
            self._exceptions.ConnectionFailedError,
            self._exceptions.ConnectionTimeoutError,
            self._request_error,
        )
        deadline = time.monotonic() + self._timeout_s
        pause_s = 0.05
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._client.post(self._client.get_url(path), json=payload), attempts
            except transient as exc:
                if time.monotonic() + pause_s > deadline:
                    raise LiveputError(f"store {self.url} unreachable: {_first_line(exc)}") from None
                log.debug("%s: %s; retrying", self.url, _first_line(exc))
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.5)
            except self._exceptions.Etcd3Exception as exc:
                raise LiveputError(f"store {self.url} failed: {_first_line(exc)}") from None

    def _range(self, key: bytes, range_end: bytes | None = None) -> list[dict[str, Any]]:
        payload = {"key": _b64(key)}
        if range_end is not None:
            payload["range_end"] = _b64(range_end)
        return list(self._post("kv/range", payload).get("kvs", []))

    def _marker_lease(self) -> str:
        lease = self._lease
        now = time.monotonic()
        if lease is None or now - lease[1] > _OP_LEASE_RENEW_S:
            lease = (str(self._post("lease/grant", {"TTL": _OP_LEASE_TTL_S})["ID"]), now)
            self._lease = lease
        return lease[0]

    def _txn(self, compare: dict[str, Any], key: bytes, value: bytes) -> bool:
        compare = {"key": _b64(key), "result": "EQUAL", **compare}
        marker = _OPS + uuid.uuid4().hex.encode()
        with self._settled_lock:
            settled = self._settled[:_SETTLED_PER_TXN]
            del self._settled[:_SETTLED_PER_TXN]
        cleanup = [{"request_delete_range": {"key": _b64(old)}} for old in settled]
        success = [{"request_put": {"key": _b64(key), "value": _b64(value)}},
                   {"request_put": {"key": _b64(marker), "value": "",
                                    "lease": self._marker_lease()}}, *cleanup]
        try:
            result, attempts = self._post_counting(
                "kv/txn", {"compare": [compare], "success": success, "failure": cleanup})
            if result.get("succeeded", False):  # the gateway omits false fields
                return True
            # Retried: the first attempt may have been applied, its reply lost.
            return attempts > 1 and bool(self._range(marker))
        finally:
            with self._settled_lock:
                self._settled.append(marker)

    @staticmethod
    def _value(kv: dict[str, Any]) -> bytes:
        return base64.b64decode(kv.get("value", ""))

    def get(self, key: str) -> bytes | None:
        kvs = self._range(_check_key(key).encode())
        return self._value(kvs[0]) if kvs else None

    def set(self, key: str, value: bytes) -> None:
        payload = {"key": _b64(_check_key(key).encode()), "value": _b64(_check_value(value))}
        self._post("kv/put", payload)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        raw_key = _check_key(key).encode()
        value = _check_value(value)
        if expected is None:
            return self._txn({"target": "CREATE", "create_revision": 0}, raw_key, value)
        return self._txn({"target": "VALUE", "value": _b64(bytes(expected))}, raw_key, value)

    def delete(self, key: str) -> None:
        self._post("kv/deleterange", {"key": _b64(_check_key(key).encode())})

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        raw_prefix = prefix.encode()
        kvs = self._range(raw_prefix or b"\x00", _prefix_end(raw_prefix))
        keys = ((base64.b64decode(kv["key"]), kv) for kv in kvs)
        return {key.decode(): self._value(kv) for key, kv in keys if not key.startswith(_OPS)}

    def add(self, key: str, amount: int) -> int:
        raw_key = _check_key(key).encode()
        for _ in range(_CAS_MAX_ROUNDS):
            kvs = self._range(raw_key)
            current = _parse_counter(key, self._value(kvs[0]) if kvs else None)
            new = current + int(amount)
            if kvs:
                guard = {"target": "MOD", "mod_revision": int(kvs[0]["mod_revision"])}
            else:
                guard = {"target": "CREATE", "create_revision": 0}
            if self._txn(guard, raw_key, str(new).encode("ascii")):
                return new
        raise LiveputError(f"store {self.url}: add on {key!r} kept losing races")

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        return _wait_by_polling(self, key, timeout_s)

    def key_count(self) -> int:
        """Keys etcd holds, transaction markers included (for measurements)."""
        reply = self._post("kv/range", {"key": _b64(b"\x00"), "range_end": _b64(b"\x00"),
                                        "count_only": True})
        return int(reply.get("count", 0))

    def status(self) -> dict[str, Any]:
        """etcd's ``maintenance/status`` (``dbSize``, ``dbSizeInUse``, ...)."""
        return self._post("maintenance/status", {})

    def revision(self) -> int:
        """etcd's current revision (one per write since the cluster started)."""
        header = self._post("kv/range", {"key": _b64(b"\x00"), "limit": 1}).get("header", {})
        return int(header.get("revision", 0))

    def compact_history(self) -> None:
        revision = self.revision()
        if revision <= self._compacted:
            return
        try:
            self._post("kv/compaction", {"revision": revision})
        except LiveputError as error:
            if "unreachable" in str(error):
                raise
            # etcd answered with an error: another client compacted past this revision.
            log.debug("%s: compaction to %d refused: %s", self.url, revision, error)
        self._compacted = revision
        log.debug("%s: revision history compacted up to %d", self.url, revision)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.session.close()


# -- signatures ---------------------------------------------------------------------------------------

_SIGNED_MAGIC = b"LPS1"
_MAC_BYTES = hashlib.sha256().digest_size


class SignedStore(Store):
    """Wraps a store so that every value carries an HMAC-SHA256 under the job token.

    The MAC covers the key and the value, so a signed value cannot be moved to another key. Reading
    a value whose signature does not verify raises :class:`LiveputError` ("refused: ..."): a peer
    without the token can neither forge nor alter state the others will act on. Signatures give
    authenticity, not secrecy or freshness: values are readable by anyone who reaches the store, and
    an old signed value of the same key could be replayed (see docs/runtime-store.md).
    """

    def __init__(self, inner: Store, token: str) -> None:
        if not isinstance(token, str) or not token:
            raise LiveputError("job token must be a non-empty string")
        self._inner = inner
        self.url = inner.url
        self._secret = hashlib.sha256(b"liveput-store-token\x00" + token.encode()).digest()

    def _mac(self, key: str, value: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\x00" + value, hashlib.sha256).digest()

    def _sign(self, key: str, value: bytes) -> bytes:
        return _SIGNED_MAGIC + self._mac(key, value) + value

    def _verify(self, key: str, raw: bytes) -> bytes:
        head = len(_SIGNED_MAGIC) + _MAC_BYTES
        if raw[: len(_SIGNED_MAGIC)] != _SIGNED_MAGIC or len(raw) < head:
            raise LiveputError(f"refused: value of store key {key!r} is not signed with the job token")
        value = raw[head:]
        if not hmac.compare_digest(raw[len(_SIGNED_MAGIC) : head], self._mac(key, value)):
            raise LiveputError(f"refused: value of store key {key!r} has a bad signature (wrong job token?)")
        return value

    def get(self, key: str) -> bytes | None:
        raw = self._inner.get(_check_key(key))
        return None if raw is None else self._verify(key, raw)

    def set(self, key: str, value: bytes) -> None:
        self._inner.set(_check_key(key), self._sign(key, _check_value(value)))

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        _check_key(key)
        signed_expected = None if expected is None else self._sign(key, bytes(expected))
        return self._inner.compare_and_set(key, signed_expected, self._sign(key, _check_value(value)))

    def delete(self, key: str) -> None:
        self._inner.delete(key)

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """The signed values under ``prefix``; entries that do not verify are left out and logged.

        A listing is a view (members, heartbeats, ledger) that anyone reaching the store could
        otherwise poison: one forged entry must not hide the genuine ones.
        """
        verified = {}
        for key, raw in self._inner.get_prefix(prefix).items():
            try:
                verified[key] = self._verify(key, raw)
            except LiveputError as error:
                log.warning("%s: %s; left out of the listing", self.url, error)
        return verified

    def add(self, key: str, amount: int) -> int:
        _check_key(key)
        for _ in range(_CAS_MAX_ROUNDS):
            raw = self._inner.get(key)
            new = _parse_counter(key, None if raw is None else self._verify(key, raw)) + int(amount)
            if self._inner.compare_and_set(key, raw, self._sign(key, str(new).encode("ascii"))):
                return new
        raise LiveputError(f"store: add on {key!r} kept losing races")

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        return self._verify(key, self._inner.wait_for(_check_key(key), timeout_s))

    def compact_history(self) -> None:
        self._inner.compact_history()

    @property
    def inner(self) -> Store:
        """The wrapped store (raw values; for measurements and tests)."""
        return self._inner

    def close(self) -> None:
        self._inner.close()


# -- opening by URL -----------------------------------------------------------------------------------

_MEMORY_STORES: dict[str, MemoryStore] = {}
_MEMORY_LOCK = threading.Lock()


def parse_host_port(url: str) -> tuple[str, int]:
    """``HOST:PORT`` from a ``scheme://HOST:PORT`` URL (``[v6]:PORT`` allowed); LiveputError if bad."""
    rest = url.partition("://")[2].rstrip("/")
    host_name, sep, port_text = rest.rpartition(":")
    host_name = host_name.strip("[]")
    if not sep or not host_name or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise LiveputError(f"store URL {url!r} must look like SCHEME://HOST:PORT")
    return host_name, int(port_text)


def _open_memory(url: str, host: bool, timeout_s: float) -> Store:
    # memory://NAME is shared by everything in this process that opens the same name (so threads
    # of a unit test can play coordinator and agents); plain memory:// is private.
    name = url.partition("://")[2]
    if not name:
        return MemoryStore()
    with _MEMORY_LOCK:
        store = _MEMORY_STORES.get(name)
        if store is None or store._closed:
            store = _MEMORY_STORES[name] = MemoryStore(url)
        return store


def _open_tcp(url: str, host: bool, timeout_s: float) -> Store:
    host_name, port = parse_host_port(url)
    return TCPStoreBackend(host_name, port, host=host, timeout_s=timeout_s)


def _open_etcd(url: str, host: bool, timeout_s: float) -> Store:
    host_name, port = parse_host_port(url)
    return EtcdStore(host_name, port, timeout_s=timeout_s)


_OPENERS: dict[str, Callable[[str, bool, float], Store]] = {
    "memory": _open_memory,
    "tcp": _open_tcp,
    "etcd": _open_etcd,
}


def open_store(url: str, *, host: bool = False, token: str | None = None, timeout_s: float = 30.0) -> Store:
    """Open the store at ``url``: ``tcp://HOST:PORT``, ``etcd://HOST:PORT`` or ``memory://[NAME]``.

    ``host=True`` with ``tcp://`` starts the TCPStore server in this process (the coordinator;
    port 0 picks a free port, read it back from ``store.port``); other schemes ignore it. With
    ``token`` the store is wrapped in :class:`SignedStore`. ``timeout_s`` bounds connecting (and,
    for etcd, riding out an outage).
    """
    if not isinstance(url, str):
        raise LiveputError(f"store URL must be a string, got {url!r}")
    scheme, sep, _ = url.partition("://")
    opener = _OPENERS.get(scheme) if sep else None
    if opener is None:
        raise LiveputError(f"store URL {url!r}: unknown scheme; use tcp://HOST:PORT, etcd://HOST:PORT or memory://")
    if timeout_s <= 0:
        raise LiveputError(f"store timeout_s must be positive, got {timeout_s}")
    store = opener(url, host, timeout_s)
    return store if token is None else SignedStore(store, token)
