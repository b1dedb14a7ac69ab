"""The signing wrapper: every value of a wrapped store carries an HMAC-SHA256 under the job
token."""

from __future__ import annotations

import hashlib
import hmac
import logging

from liveput.errors import LiveputError
from liveput.runtime.store.base import CAS_MAX_ROUNDS, Store, check_key, check_value, parse_counter

log = logging.getLogger(__name__)

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
            raise LiveputError(
                f"refused: value of store key {key!r} is not signed with the job token"
            )
        value = raw[head:]
        if not hmac.compare_digest(raw[len(_SIGNED_MAGIC) : head], self._mac(key, value)):
            raise LiveputError(
                f"refused: value of store key {key!r} has a bad signature (wrong job token?)"
            )
        return value

    def get(self, key: str) -> bytes | None:
        raw = self._inner.get(check_key(key))
        return None if raw is None else self._verify(key, raw)

    def set(self, key: str, value: bytes) -> None:
        self._inner.set(check_key(key), self._sign(key, check_value(value)))

    def compare_and_set(self, key: str, expected: bytes | None, value: bytes) -> bool:
        check_key(key)
        signed_expected = None if expected is None else self._sign(key, bytes(expected))
        return self._inner.compare_and_set(
            key, signed_expected, self._sign(key, check_value(value))
        )

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
        check_key(key)
        for _ in range(CAS_MAX_ROUNDS):
            raw = self._inner.get(key)
            new = parse_counter(key, None if raw is None else self._verify(key, raw)) + int(amount)
            if self._inner.compare_and_set(key, raw, self._sign(key, str(new).encode("ascii"))):
                return new
        raise LiveputError(f"store: add on {key!r} kept losing races")

    def wait_for(self, key: str, timeout_s: float) -> bytes:
        return self._verify(key, self._inner.wait_for(check_key(key), timeout_s))

    def compact_history(self) -> None:
        self._inner.compact_history()

    @property
    def inner(self) -> Store:
        """The wrapped store (raw values; for measurements and tests)."""
        return self._inner

    def close(self) -> None:
        self._inner.close()
