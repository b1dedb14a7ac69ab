"""The store on etcd v3, through its JSON gateway (:mod:`.etcd_gateway`)."""

from __future__ import annotations

import base64
import logging
import threading
import time
import uuid
from typing import Any

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
from liveput.runtime.store.etcd_gateway import Gateway, GatewayRefused, GatewayUnreachable

log = logging.getLogger(__name__)


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
    """A store on an etcd v3 cluster, through its JSON gateway (:mod:`.etcd_gateway`).

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
        self.url = format_url("etcd", host_name, port)
        self._timeout_s = float(timeout_s)
        self._gateway = Gateway(host_name, port, self._timeout_s)
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
        deadline = time.monotonic() + self._timeout_s
        pause_s = 0.05
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._gateway.post(path, payload), attempts
            except GatewayUnreachable as exc:
                if time.monotonic() + pause_s > deadline:
                    raise LiveputError(f"store {self.url} unreachable: {first_line(exc)}") from None
                log.debug("%s: %s; retrying", self.url, first_line(exc))
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 0.5)
            except GatewayRefused as exc:
                raise LiveputError(f"store {self.url} failed: {first_line(exc)}") from None

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
        success = [
            {"request_put": {"key": _b64(key), "value": _b64(value)}},
            {"request_put": {"key": _b64(marker), "value": "", "lease": self._marker_lease()}},
            *cleanup,
        ]
        try:
            result, attempts = self._post_counting(
                "kv/txn", {"compare": [compare], "success": success, "failure": cleanup}
            )
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
        kvs = self._range(check_key(key).encode())
        return self._value(kvs[0]) if kvs else None

    def set(self, key: str, value: bytes) -> None:
        payload = {"key": _b64(check_key(key).encode()), "value": _b64(check_value(value))}
        self._post("kv/put", payload)

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        raw_key = check_key(key).encode()
        value = check_value(value)
        if expected is None:
            return self._txn({"target": "CREATE", "create_revision": 0}, raw_key, value)
        return self._txn({"target": "VALUE", "value": _b64(bytes(expected))}, raw_key, value)

    def delete(self, key: str) -> None:
        self._post("kv/deleterange", {"key": _b64(check_key(key).encode())})

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        raw_prefix = prefix.encode()
        kvs = self._range(raw_prefix or b"\x00", _prefix_end(raw_prefix))
        keys = ((base64.b64decode(kv["key"]), kv) for kv in kvs)
        return {key.decode(): self._value(kv) for key, kv in keys if not key.startswith(_OPS)}

    def add(self, key: str, amount: int) -> int:
        raw_key = check_key(key).encode()
        for _ in range(CAS_MAX_ROUNDS):
            kvs = self._range(raw_key)
            current = parse_counter(key, self._value(kvs[0]) if kvs else None)
            new = current + int(amount)
            if kvs:
                guard = {"target": "MOD", "mod_revision": int(kvs[0]["mod_revision"])}
            else:
                guard = {"target": "CREATE", "create_revision": 0}
            if self._txn(guard, raw_key, str(new).encode("ascii")):
                return new
        raise LiveputError(f"store {self.url}: add on {key!r} kept losing races")

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        return wait_by_polling(self, key, timeout_s)

    def key_count(self) -> int:
        """Keys etcd holds, transaction markers included (for measurements)."""
        reply = self._post(
            "kv/range", {"key": _b64(b"\x00"), "range_end": _b64(b"\x00"), "count_only": True}
        )
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
            self._gateway.close()
