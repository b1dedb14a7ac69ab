"""Communication of one configuration generation: process groups and point-to-point messages.

Process groups are built directly (``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on CUDA) from
a c10d store prefixed by the generation, never through the global default group, so a generation's
groups are simply dropped and rebuilt at the next one. Groups: the world (every instance of the
plan, for layer transfers and pipeline send/recv) and, per stage, its D replicas (gradient
all-reduce). Tensors of unknown shape travel as a small header then the payload.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

_DTYPES = (torch.float32, torch.int64, torch.float16, torch.bfloat16, torch.float64, torch.int32,
           torch.uint8)
_HEADER = 8


def _make_group(store: dist.Store, prefix: str, rank: int, size: int,
                device: torch.device, timeout_s: float, host: str | None) -> dist.ProcessGroup:
    timeout = datetime.timedelta(seconds=timeout_s)
    scoped = dist.PrefixStore(prefix, store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(scoped, rank, size, options)
    if host is None:
        return dist.ProcessGroupGloo(scoped, rank, size, timeout)
    # Bind gloo to the instance's own address, not whatever the machine's hostname resolves to.
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(scoped, rank, size, options)


@dataclass
class Groups:
    """The process groups of one generation, as seen by one rank."""

    world: dist.ProcessGroup
    rank: int
    """This instance's rank in the world (its index among the plan's sorted instances)."""
    stage: dist.ProcessGroup | None
    """The replicas of this instance's stage (None when D = 1 or it is a spare)."""
    device: torch.device
    pipeline: dist.ProcessGroup | None = None
    """The stages of this instance's pipeline, built only for a global gradient norm (None when
    P = 1, not needed, or a spare)."""

    @classmethod
    def build(cls, store: dist.Store, generation: int, rank: int, world_size: int,
              stage_ranks: list[int] | None, device: torch.device,
              timeout_s: float = 60.0, host: str | None = None,
              pipeline_ranks: list[int] | None = None) -> Groups:
        """``stage_ranks``: world ranks holding this rank's stage (its replicas, itself included);
        ``host``: the address to bind (None: gloo's default); ``pipeline_ranks``: world ranks of
        this rank's pipeline, when a step needs the stages to reduce together."""
        world = _make_group(store, f"g{generation}/world/", rank, world_size, device, timeout_s,
                            host)
        stage = None
        if stage_ranks is not None and len(stage_ranks) > 1:
            name = "-".join(map(str, stage_ranks))
            stage = _make_group(store, f"g{generation}/stage/{name}/", stage_ranks.index(rank),
                                len(stage_ranks), device, timeout_s, host)
        pipeline = None
        if pipeline_ranks is not None and len(pipeline_ranks) > 1:
            name = "-".join(map(str, pipeline_ranks))
            pipeline = _make_group(store, f"g{generation}/pipeline/{name}/",
                                   pipeline_ranks.index(rank), len(pipeline_ranks), device,
                                   timeout_s, host)
        return cls(world, rank, stage, device, pipeline)

    # --- point to point ---------------------------------------------------------------------
    def isend_tensor(self, tensor: torch.Tensor, peer: int, tag: int) -> list[dist.Work]:
        """Send a tensor of any shape (header, then payload); the works to wait on."""
        tensor = tensor.detach().contiguous().to(self.device)
        header = torch.zeros(_HEADER, dtype=torch.int64)
        header[0] = _DTYPES.index(tensor.dtype)
        header[1] = tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        return [self.world.send([header.to(self.device)], peer, 2 * tag),
                self.world.send([tensor], peer, 2 * tag + 1)]

    def recv_tensor(self, peer: int, tag: int) -> torch.Tensor:
        header = torch.zeros(_HEADER, dtype=torch.int64, device=self.device)
        self.world.recv([header], peer, 2 * tag).wait()
        header = header.cpu()
        shape = [int(x) for x in header[2:2 + int(header[1])]]
        tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=self.device)
        self.world.recv([tensor], peer, 2 * tag + 1).wait()
        return tensor

    def isend_bytes(self, data: bytes, peer: int, tag: int) -> tuple[list[dist.Work], torch.Tensor]:
        """Send bytes; returns the works and the buffer (keep it alive until they complete)."""
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return self.isend_tensor(buffer, peer, tag), buffer

    def recv_bytes(self, peer: int, tag: int) -> bytes:
        return self.recv_tensor(peer, tag).cpu().numpy().tobytes()

    # --- collectives ------------------------------------------------------------------------
    def allreduce_stage(self, flat: torch.Tensor) -> None:
        """Sum ``flat`` in place over the replicas of this stage."""
        if self.stage is not None:
            self.stage.allreduce([flat]).wait()

    def allreduce_pipeline(self, values: torch.Tensor) -> torch.Tensor:
        """The sum of ``values`` (a CPU tensor) over the stages of this pipeline."""
        if self.pipeline is None:
            return values
        buffer = values.to(self.device)
        self.pipeline.allreduce([buffer]).wait()
        return buffer.cpu()

    def barrier(self) -> None:
        flag = torch.zeros(1, device=self.device)
        self.world.allreduce([flag]).wait()

    def abort(self) -> None:
        """Abort every operation of these groups, also one blocked in another thread (which
        then fails): a peer of this generation failed, or a newer plan is out."""
        self.close()

    def close(self) -> None:
        for group in (self.pipeline, self.stage, self.world):
            if group is not None and hasattr(group, "abort"):
                try:
                    group.abort()
                except RuntimeError:
                    pass
