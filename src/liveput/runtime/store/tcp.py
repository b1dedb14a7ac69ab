"""The store on PyTorch's ``torch.distributed.TCPStore`` (the coordinator hosts its server)."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from liveput.errors import LiveputError
from liveput.runtime.store.base import (
    CAS_MAX_ROUNDS,
    Store,
    check_key,
    check_value,
    first_line,
    format_url,
    parse_counter,
    wait_by_polling,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")  # what a wrapped backend call returns

# Stored form of a value: b"v" + 8-byte nonce + value. The TCPStore's own compare_set answers with
# the value it holds afterwards, which cannot tell "I swapped" from "someone else already wrote what
# I wanted" unless every write is unique, hence the nonce. A stored value is never empty, so the
# empty string can mean "absent" in compare_set, and a marker that no value can equal lets
# compare_set act as a non-blocking read (TCPStore.get blocks until the key exists).
_TCP_TAG = b"v"
_TCP_NONCE_BYTES = 8
_TCP_ABSENT = b"\x00liveput-absent\x00"

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

    def __init__(
        self, host_name: str, port: int, *, host: bool = False, timeout_s: float = 30.0
    ) -> None:
        import torch.distributed as dist

        self._timeout_s = float(timeout_s)
        self.url = format_url("tcp", host_name, port)
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
            self.url = format_url("tcp", host_name, port)
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
            raise LiveputError(f"store {self.url} unreachable: {first_line(exc)}") from None
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
                        f"{exc.strerror or exc}"
                    ) from None
            time.sleep(0.2)  # refused: the server may still be starting

    def _listen(self, host_name: str, port: int) -> tuple[int, int]:
        # The TCPStore server binds every interface by default; handing it our own socket keeps it
        # on the address asked for.
        try:
            family, _, _, _, address = socket.getaddrinfo(host_name, port, type=socket.SOCK_STREAM)[
                0
            ]
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
            raise LiveputError(f"store {self.url} failed: {first_line(exc)}") from None

    def _raw_get(self, key: str) -> bytes | None:
        raw = self._call(lambda s: s.compare_set(key, _TCP_ABSENT, _TCP_ABSENT))
        return None if raw == _TCP_ABSENT else bytes(raw)

    def _swap(self, key: str, expected_raw: bytes | None, new_raw: bytes) -> bytes:
        return bytes(self._call(lambda s: s.compare_set(key, expected_raw or b"", new_raw)))

    def get(self, key: str) -> bytes | None:
        raw = self._raw_get(check_key(key))
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
        raw = _tcp_encode(check_value(value))
        self._register(check_key(key))
        self._call(lambda s: s.set(key, raw))
        self._register(key)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        check_key(key)
        new_raw = _tcp_encode(check_value(value))
        if expected is None:
            self._register(key)
            swapped = self._swap(key, None, new_raw) == new_raw
            self._register(key)
            return swapped
        expected = bytes(expected)
        for _ in range(CAS_MAX_ROUNDS):
            raw = self._raw_get(key)
            if raw is None or _tcp_decode(raw) != expected:
                return False
            if self._swap(key, raw, new_raw) == new_raw:
                return True
            # Lost to a concurrent write; if it wrote the same value, the CAS may still succeed.
        raise LiveputError(f"store {self.url}: compare_and_set on {key!r} kept losing races")

    def delete(self, key: str) -> None:
        check_key(key)
        if key not in self._entries:
            self._read_index()
        # Marker first, key last: a write of the key after its deletion then re-indexes it.
        self._call(lambda s: s.delete_key(f"{_TCP_INDEX}seen/{key}"))
        for entry in sorted(self._entries.pop(key, ())):
            self._delete_index_entry(entry)
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

    def _delete_index_entry(self, entry: int) -> None:
        self._call(lambda s: s.delete_key(f"{_TCP_INDEX}{entry}"))

    def _forget(self, key: str) -> None:
        """``key`` is not there: if its marker is gone too it was deleted: drop it here (a new
        write indexes it again) and its index entries (a writer's ``set`` is one-way, so a
        deleter may read the entry after deleting the key; the entry would stay for good). With
        its marker there, a writer indexed it and is about to write it: keep it listed."""
        if self._raw_get(f"{_TCP_INDEX}seen/{key}") is not None:
            return
        entries = self._entries.pop(key, set())
        for entry in sorted(entries):
            self._delete_index_entry(entry)

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
        check_key(key)
        for _ in range(CAS_MAX_ROUNDS):
            raw = self._raw_get(key)
            new = parse_counter(key, None if raw is None else _tcp_decode(raw)) + int(amount)
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
        return wait_by_polling(self, key, timeout_s)

    def close(self) -> None:
        # Dropping the last reference stops a hosted server and closes the client socket.
        self._store = None
