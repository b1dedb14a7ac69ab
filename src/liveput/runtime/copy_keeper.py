"""One agent's side of the buddy copies (:mod:`liveput.runtime.memory_copies`): at each periodic
checkpoint step it keeps its own layers' state and fetches its sender's, in a background thread,
and says in the store what it keeps.

The snapshot (a clone of the layers' state) is taken at the step boundary, as the checkpoint's;
encoding, signing and fetching run behind training. The sender's layers are fetched at the rate
that spreads them over the checkpoint's spread, so that they do not take the link whole either.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from liveput.errors import LiveputError
from liveput.runtime import keys
from liveput.runtime.layer_state import encode_state
from liveput.runtime.memory_copies import (
    CopyRecord,
    CopyServer,
    MemoryCopies,
    fetch_copy,
    sender_to,
)
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.store import Store

LOG = logging.getLogger(__name__)


class CopyKeeper:
    """Keeps this instance's memory copies fresh and serves them."""

    def __init__(self, store: Store, instance: int, host: str, token: bytes | None) -> None:
        self.store = store
        self.instance = instance
        self.token = token
        self.copies = MemoryCopies()
        self.server = CopyServer(self.copies, host, token)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="copies")
        self._publish()  # its address, before any copy

    @property
    def address(self) -> str:
        return self.server.address

    def refresh(
        self,
        plan: RuntimePlan,
        epoch: int,
        step: int,
        states: dict[int, dict],
        spread_s: float | None,
    ) -> None:
        """Keep ``states`` (this instance's layers as of (epoch, step): a snapshot nothing
        changes any more, shared with the checkpoint's write); encode them and fetch the
        sender's in the background."""
        sender = sender_to(plan, self.instance)
        wanted: list[int] = []
        if sender is not None and (slot := plan.slots.get(sender)) is not None:
            wanted = list(plan.layers_of(slot[1]))
        self._pool.submit(self._keep, epoch, step, states, sender, wanted, spread_s)

    def _keep(
        self,
        epoch: int,
        step: int,
        states: dict[int, dict],
        sender: int | None,
        wanted: list[int],
        spread_s: float | None,
    ) -> None:
        try:
            own = {index: encode_state(state, self.token) for index, state in states.items()}
            self.copies.replace(epoch, step, own)
            self._publish()
            if sender is None or not wanted:
                return
            raw = self.store.get(keys.copies(sender))
            if raw is None:
                return
            address = CopyRecord.from_json(raw).address
            size = sum(len(data) for data in own.values())  # about a stage's, to pace by
            rate = size / spread_s if spread_s else None
            for layer in wanted:
                data = fetch_copy(address, epoch, step, layer, self.token, rate_bytes_per_s=rate)
                self.copies.add(epoch, step, {layer: data})
            self._publish()
        except LiveputError as error:
            LOG.warning("instance %d: memory copies of step %d: %s", self.instance, step, error)
        except Exception:  # noqa: BLE001 - a copy lost is a restore from the object store
            LOG.exception("instance %d: memory copies of step %d failed", self.instance, step)

    def _publish(self) -> None:
        record = CopyRecord(self.address, self.copies.held())
        try:
            self.store.set(keys.copies(self.instance), record.to_json())
        except LiveputError:
            pass  # the store is down: the coordinator takes this instance to keep nothing new

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.server.close()
