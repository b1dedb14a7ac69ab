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

import threading
import time
from abc import ABC, abstractmethod

from liveput.errors import LiveputError

__all__ = [
    "Store",
    "MemoryStore",
    "open_store",
]


class Store(ABC):
    """A key-value store with compare-and-set, shared by the coordinator and the agents.

    Every method may raise :class:`LiveputError` when the backend is unreachable; the message names
    the store's URL.
    """

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


def _parse_counter(key: str, raw: bytes | None) -> int:
    if raw is None:
        return 0
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise LiveputError(f"store key {key!r} holds {raw[:32]!r}, not an integer counter") from None


class MemoryStore(Store):
    """A thread-safe in-memory store: the fake for unit tests (not shared across processes)."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise LiveputError("store memory:// is closed")

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
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

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
                    raise LiveputError(f"timed out after {timeout_s:g} s waiting for key {key!r} in memory://")
                self._cond.wait(left)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def open_store(url: str, *, host: bool = False, token: str | None = None, timeout_s: float = 30.0) -> Store:
    """Open the store at ``url``: ``tcp://HOST:PORT``, ``etcd://HOST:PORT`` or ``memory://``.

    ``host=True`` with ``tcp://`` starts the TCPStore server in this process (the coordinator).
    With ``token``, the store is wrapped in :class:`SignedStore`. ``timeout_s`` bounds connecting
    and every blocking call.
    """
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise LiveputError(f"store URL {url!r} has no scheme; use tcp://HOST:PORT, etcd://HOST:PORT or memory://")
    if scheme == "memory":
        store: Store = MemoryStore()
    else:
        raise LiveputError(f"store URL {url!r}: unknown scheme {scheme!r}; use tcp://, etcd:// or memory://")
    return store
