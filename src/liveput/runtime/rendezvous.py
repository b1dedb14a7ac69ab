"""Where a generation's process groups meet: a c10d ``TCPStore`` hosted by its rank 0.

Rank 0 of a generation listens on its own address (port 0: a free one) and publishes
``rdzv/<g>`` = ``host:port`` in the job store (signed, like every value); the other ranks read it
and connect. The job store may be etcd, which c10d cannot use, hence this small c10d store per
generation; it dies with the generation (or with its host, which ends the generation anyway).
"""

from __future__ import annotations

import datetime
import socket

import torch.distributed as dist

from liveput.runtime import keys
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.store import Store


class StoreRendezvous:
    """Callable ``(plan, rank) -> dist.Store`` for :class:`liveput.runtime.engine.Engine`."""

    def __init__(self, store: Store, host: str, timeout_s: float = 60.0) -> None:
        self.store = store
        self.host = host
        self.timeout_s = timeout_s
        self._hosted: dict[int, dist.TCPStore] = {}

    def __call__(self, plan: RuntimePlan, rank: int) -> dist.Store:
        timeout = datetime.timedelta(seconds=self.timeout_s)
        key = keys.rendezvous(plan.generation)
        # Only the newest generation's server is kept; older ones are no longer in use.
        self._hosted = {g: s for g, s in self._hosted.items() if g >= plan.generation - 1}
        if rank == 0:
            listener = socket.create_server((self.host, 0))
            port = listener.getsockname()[1]
            # Handing c10d our socket keeps the server on this address only.
            # The classic server, as the job's store.
            server = dist.TCPStore(
                self.host,
                port,
                len(plan.world),
                True,
                timeout,
                wait_for_workers=False,
                master_listen_fd=listener.detach(),
                use_libuv=False,
            )
            self._hosted[plan.generation] = server
            self.store.set(key, f"{self.host}:{server.port}".encode())
            return server
        address = self.store.wait_for(key, self.timeout_s).decode()
        host, port = address.rsplit(":", 1)
        return dist.TCPStore(host, int(port), len(plan.world), False, timeout, use_libuv=False)
