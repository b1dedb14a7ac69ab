"""Opening a store by URL: ``tcp://HOST:PORT``, ``etcd://HOST:PORT`` or ``memory://[NAME]``."""

from __future__ import annotations

import threading
from collections.abc import Callable

from liveput.errors import LiveputError
from liveput.runtime.store.base import Store, StoreAddressError
from liveput.runtime.store.etcd import EtcdStore
from liveput.runtime.store.memory import MemoryStore
from liveput.runtime.store.signed import SignedStore
from liveput.runtime.store.tcp import TCPStoreBackend

_MEMORY_STORES: dict[str, MemoryStore] = {}
_MEMORY_LOCK = threading.Lock()


def parse_host_port(url: str) -> tuple[str, int]:
    """``HOST:PORT`` from a ``scheme://HOST:PORT`` URL (``[v6]:PORT`` allowed); LiveputError if
    bad."""
    rest = url.partition("://")[2].rstrip("/")
    host_name, sep, port_text = rest.rpartition(":")
    host_name = host_name.strip("[]")
    if not sep or not host_name or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise StoreAddressError(f"store URL {url!r} must look like SCHEME://HOST:PORT")
    return host_name, int(port_text)


def _open_memory(url: str, host: bool, timeout_s: float) -> Store:
    # memory://NAME is shared by everything in this process that opens the same name (so threads
    # of a unit test can play coordinator and agents); plain memory:// is private.
    name = url.partition("://")[2]
    if not name:
        return MemoryStore()
    with _MEMORY_LOCK:
        store = _MEMORY_STORES.get(name)
        if store is None or store.closed:
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


def check_store_url(url: object) -> str:
    """``url`` if it names a store :func:`open_store` opens (its scheme, and for ``tcp://`` and
    ``etcd://`` a HOST:PORT), else a one-line :class:`StoreAddressError`; opens nothing."""
    if not isinstance(url, str):
        raise StoreAddressError(f"store URL must be a string, got {url!r}")
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in _OPENERS:
        raise StoreAddressError(
            f"store URL {url!r}: unknown scheme; use tcp://HOST:PORT, etcd://HOST:PORT or memory://"
        )
    if scheme != "memory":
        parse_host_port(url)
    return url


def open_store(
    url: str, *, host: bool = False, token: str | None = None, timeout_s: float = 30.0
) -> Store:
    """Open the store at ``url``: ``tcp://HOST:PORT``, ``etcd://HOST:PORT`` or ``memory://[NAME]``.

    ``host=True`` with ``tcp://`` starts the TCPStore server in this process (the coordinator;
    port 0 picks a free port, read it back from ``store.port``); other schemes ignore it. With
    ``token`` the store is wrapped in :class:`SignedStore`. ``timeout_s`` bounds connecting (and,
    for etcd, riding out an outage).
    """
    opener = _OPENERS[check_store_url(url).partition("://")[0]]
    if timeout_s <= 0:
        raise LiveputError(f"store timeout_s must be positive, got {timeout_s}")
    store = opener(url, host, timeout_s)
    return store if token is None else SignedStore(store, token)
