"""The store contract: a small key-value interface with compare-and-set, and the checks and
helpers every backend shares."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from liveput.errors import LiveputError

CAS_MAX_ROUNDS = 10_000
"""Most read-then-swap rounds a backend tries before it gives up on a contended key."""


class StoreAddressError(LiveputError):
    """A store URL that no retry can mend (an unknown scheme, a malformed HOST:PORT)."""


class Store(ABC):
    """A key-value store with compare-and-set, shared by the coordinator and the agents.

    Every method may raise :class:`LiveputError` when the backend is unreachable; the message names
    the store's URL.
    """

    url: str = "memory://"
    """Where the store is (``tcp://HOST:PORT``, ``etcd://HOST:PORT``, ``memory://``), for
    messages."""

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
        """Block until ``key`` exists and return its value; :class:`LiveputError` after
        ``timeout_s``."""

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


def check_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise LiveputError(f"store key must be a non-empty str, got {key!r}")
    return key


def check_value(value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise LiveputError(f"store value must be bytes, got {type(value).__name__}")
    return bytes(value)


def format_url(scheme: str, host_name: str, port: int) -> str:
    return (
        f"{scheme}://[{host_name}]:{port}" if ":" in host_name else f"{scheme}://{host_name}:{port}"
    )


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def wait_by_polling(store: Store, key: str, timeout_s: float) -> bytes:
    """``store.get(key)`` with a growing pause (5 ms to 50 ms) until the key exists or time is
    up."""
    check_key(key)
    deadline = time.monotonic() + timeout_s
    pause_s = 0.005
    while True:
        value = store.get(key)
        if value is not None:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise LiveputError(
                f"timed out after {timeout_s:g} s waiting for key {key!r} in {store.url}"
            )
        time.sleep(min(pause_s, left))
        pause_s = min(pause_s * 2, 0.05)


def parse_counter(key: str, raw: bytes | None) -> int:
    if raw is None:
        return 0
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise LiveputError(
            f"store key {key!r} holds {raw[:32]!r}, not an integer counter"
        ) from None
