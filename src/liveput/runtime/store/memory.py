"""The in-memory store: the fake for unit tests."""

from __future__ import annotations

import threading
import time

from liveput.errors import LiveputError
from liveput.runtime.store.base import Store, check_key, check_value, parse_counter


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
        check_key(key)
        with self._cond:
            self._check_open()
            return self._data.get(key)

    def set(self, key: str, value: bytes) -> None:
        check_key(key)
        value = check_value(value)
        with self._cond:
            self._check_open()
            self._data[key] = value
            self._cond.notify_all()

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        check_key(key)
        value = check_value(value)
        with self._cond:
            self._check_open()
            if self._data.get(key) != (None if expected is None else bytes(expected)):
                return False
            self._data[key] = value
            self._cond.notify_all()
            return True

    def delete(self, key: str) -> None:
        check_key(key)
        with self._cond:
            self._check_open()
            self._data.pop(key, None)

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        with self._cond:
            self._check_open()
            return {k: v for k, v in sorted(self._data.items()) if k.startswith(prefix)}

    def add(self, key: str, amount: int) -> int:
        check_key(key)
        with self._cond:
            self._check_open()
            new = parse_counter(key, self._data.get(key)) + int(amount)
            self._data[key] = str(new).encode("ascii")
            self._cond.notify_all()
            return new

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        check_key(key)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check_open()
                if key in self._data:
                    return self._data[key]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LiveputError(
                        f"timed out after {timeout_s:g} s waiting for key {key!r} in {self.url}"
                    )
                self._cond.wait(left)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
