"""Opening a job's store, the one way every command does it (``liveput train``, ``liveput
coordinator``, ``liveput launch`` and ``resume``).

A job's store is one of: a store named by URL (``tcp://``, ``etcd://``, ``memory://``; waited
for while it is not up, where asked), a ``tcp://`` store hosted by this process (port 0: any
free one), or an etcd server this process runs (:class:`~liveput.runtime.store.etcd_server.
LocalEtcd`: its data on disk, so that a restart resumes the job). Every value in it is signed
with the job token. :class:`JobStore` closes the store and stops an etcd it started; an opening
that fails stops that etcd too.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from liveput.runtime.launch import through_outage
from liveput.runtime.store import Store, open_store
from liveput.runtime.store.etcd_server import EtcdConfig, LocalEtcd


@dataclass(frozen=True)
class StorePlace:
    """Where a job's store is (module docstring)."""

    url: str | None = None
    """The store's URL (with :attr:`etcd`: None, the etcd's own)."""
    host: bool = False
    """This process hosts the ``tcp://`` store at :attr:`url`."""
    etcd: EtcdConfig | None = None
    """Run this etcd server here (stopped when the store closes)."""
    wait_s: float = 0.0
    """Wait this long for a store that does not answer yet (0: try once)."""
    timeout_s: float = 30.0
    """Longest wait of one attempt to connect, seconds."""

    def __post_init__(self) -> None:
        if (self.url is None) == (self.etcd is None):
            raise ValueError("StorePlace: give the store's url or an etcd to run, one of them")
        if self.host and self.etcd is not None:
            raise ValueError("StorePlace: an etcd store is not hosted by this process")
        if self.wait_s < 0 or self.timeout_s <= 0:
            raise ValueError("StorePlace: wait_s >= 0 and timeout_s > 0")


class JobStore:
    """An open job store, its URL (the one agents are given) and the etcd it runs, if any."""

    def __init__(self, store: Store, url: str, etcd: LocalEtcd | None) -> None:
        self.store = store
        self.url = url
        self.etcd = etcd

    def close(self) -> None:
        """Close the store; stop the etcd this process runs (its data stays on disk)."""
        try:
            self.store.close()
        finally:
            if self.etcd is not None:
                self.etcd.stop()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def open_job_store(place: StorePlace, token: str) -> JobStore:
    """Open the job store at ``place``, its values signed with ``token`` (module docstring)."""
    etcd = None
    if place.etcd is not None:
        etcd = LocalEtcd(place.etcd)
        etcd.start()
    try:
        url = etcd.url if etcd is not None else place.url
        assert url is not None  # StorePlace gives one of them
        if place.wait_s > 0:
            store = through_outage(
                lambda: open_store(
                    url, host=place.host, token=token, timeout_s=min(place.timeout_s, place.wait_s)
                ),
                place.wait_s,
            )
        else:
            store = open_store(url, host=place.host, token=token, timeout_s=place.timeout_s)
    except BaseException:
        if etcd is not None:
            etcd.stop()
        raise
    return JobStore(store, getattr(store, "url", None) or url, etcd)
