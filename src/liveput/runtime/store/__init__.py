"""The coordination store: a small key-value contract with compare-and-set.

The runtime keeps its shared state (membership, the current plan, the committed step, heartbeats)
behind :class:`Store` (:mod:`.base`). Keys are ``str`` (``/``-separated paths, spelled by
:mod:`liveput.runtime.keys`), values are ``bytes``. Backends, one module each:

- :class:`MemoryStore` (:mod:`.memory`) -- a thread-safe in-process fake, for unit tests only.
- :class:`TCPStoreBackend` (:mod:`.tcp`) -- PyTorch's ``torch.distributed.TCPStore``; the
  coordinator hosts it.
- :class:`EtcdStore` (:mod:`.etcd`) -- etcd v3 through its JSON gateway (:mod:`.etcd_gateway`);
  the local etcd server a coordinator runs is :mod:`.etcd_server`.
- :class:`SignedStore` (:mod:`.signed`) -- wraps any store; every value carries an HMAC-SHA256
  under the job token.

:func:`open_store` (:mod:`.opening`) picks a backend from a URL (``tcp://``, ``etcd://``,
``memory://``). The readers several parts of the job share (every heartbeat, every instance's
state) are in :mod:`.readers`.
"""

from __future__ import annotations

from liveput.runtime.store.base import Store
from liveput.runtime.store.etcd import EtcdStore
from liveput.runtime.store.memory import MemoryStore
from liveput.runtime.store.opening import open_store, parse_host_port
from liveput.runtime.store.signed import SignedStore
from liveput.runtime.store.tcp import TCPStoreBackend

__all__ = [
    "Store",
    "MemoryStore",
    "TCPStoreBackend",
    "EtcdStore",
    "SignedStore",
    "open_store",
    "parse_host_port",
]
