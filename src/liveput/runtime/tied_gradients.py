"""The gradient of tied weights (``liveput.models.ties``): each step, once the stage all-reduce
has given each stage its layers' full gradients and before the update, both copies of a tied
matrix get the sum of the two copies' gradients, which is the tied model's gradient of it.

Where both layers of a tie are on this instance (one stage holds both: P = 1) the sum is local.
Where they are in two stages, the instance holding the earlier one in pipeline d and the one
holding the later one in pipeline d exchange their gradients point to point over the world group,
as Megatron-LM does between its first and last stage: each of the D pipelines exchanges its own
(its replicas' gradients are equal after the all-reduce), so no instance waits on another
pipeline. The holder of the earlier layer sends first then receives, the other receives first
then sends, so that backends whose point-to-point operations block until matched (NCCL) cannot
deadlock; ties are exchanged in the job's order, the same on every instance.

Both sides add the same two tensors in the same order (the earlier layer's gradient plus the
later's), so both copies get bitwise equal gradients and, with the same element-wise optimizer,
stay bitwise equal. The global gradient norm counts the matrix once, as the tied model's would:
:meth:`TiedGradients.duplicates` names the later copies, which the norm leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from liveput.errors import LiveputError
from liveput.models.job import Job
from liveput.models.ties import Member, members
from liveput.runtime.comm import Groups
from liveput.runtime.layer_state import LayerState
from liveput.runtime.protocol import RuntimePlan
from liveput.runtime.schedule import StagePosition

_TIE_TAG = 1 << 21
"""First point-to-point tag of the exchanges (above the pipeline's and the layer transfers')."""


@dataclass(frozen=True)
class Exchange:
    """One tie whose other copy is on another instance of this pipeline."""

    mine: Member
    """The copy this instance holds (its layer index, its name in the layer)."""
    peer: int
    """World rank of the instance holding the other copy."""
    earlier: bool
    """Whether this instance holds the tie's earlier layer (it sends first)."""
    tag: int
    """Tag of the message from the earlier layer's holder (the reply's is ``tag + 1``)."""


class TiedGradients:
    """The ties one instance takes part in, for one generation."""

    def __init__(
        self, local: Sequence[tuple[Member, Member]], exchanges: Sequence[Exchange] = ()
    ) -> None:
        self.local = list(local)
        """Ties whose two copies are both on this instance."""
        self.exchanges = list(exchanges)
        """Ties whose other copy is on another instance, in the job's order."""
        self.later = [b for _, b in self.local] + [e.mine for e in self.exchanges if not e.earlier]
        """The later copies held here: the global norm leaves them out."""

    @classmethod
    def of_whole_model(cls, job: Job) -> TiedGradients:
        """Every tie of ``job``, for an instance holding every layer."""
        return cls([members(tie) for tie in job.tied_weights])

    @classmethod
    def of_stage(cls, job: Job, plan: RuntimePlan, position: StagePosition) -> TiedGradients:
        """The ties of the instance at ``position`` of ``plan``."""
        held = plan.layers_of(position.stage)
        local, exchanges = [], []
        for number, tie in enumerate(job.tied_weights):
            earlier, later = members(tie)
            if earlier[0] in held and later[0] in held:
                local.append((earlier, later))
            elif earlier[0] in held or later[0] in held:
                mine, other = (earlier, later) if earlier[0] in held else (later, earlier)
                stage = _stage_of(plan, other[0])
                peer = plan.rank_of(plan.instance_at(position.pipeline, stage))
                exchanges.append(Exchange(mine, peer, mine is earlier, _TIE_TAG + 2 * number))
        return cls(local, exchanges)

    def __bool__(self) -> bool:
        return bool(self.local or self.exchanges)

    def duplicates(self, layers: Sequence[LayerState]) -> frozenset[int]:
        """``id`` of each later copy held here (the global norm counts the matrix once)."""
        by_index = {layer.index: layer for layer in layers}
        return frozenset(id(_parameter(by_index, member)) for member in self.later)

    def sum(self, layers: Sequence[LayerState], groups: Groups | None) -> None:
        """Give both copies of each tie the sum of their gradients (a missing gradient counts
        as zeros); exchanges with the other copies' holders, which call it at the same point."""
        by_index = {layer.index: layer for layer in layers}
        for earlier, later in self.local:
            first, second = _parameter(by_index, earlier), _parameter(by_index, later)
            total = _gradient(first) + _gradient(second)
            first.grad = total
            second.grad = total.clone()  # its own tensor: unscaling and clipping act in place
        if not self.exchanges:
            return
        if groups is None:
            raise LiveputError("tied weights in two stages, but the plan builds no groups")
        sends: list[dist.Work] = []
        keep: list[torch.Tensor] = []
        for exchange in self.exchanges:
            parameter = _parameter(by_index, exchange.mine)
            mine = _gradient(parameter)
            keep.append(mine)
            if exchange.earlier:
                sends += groups.isend_tensor(mine, exchange.peer, exchange.tag)
                other = groups.recv_tensor(exchange.peer, exchange.tag + 1)
                parameter.grad = mine + other.to(mine.dtype)
            else:
                other = groups.recv_tensor(exchange.peer, exchange.tag)
                sends += groups.isend_tensor(mine, exchange.peer, exchange.tag + 1)
                parameter.grad = other.to(mine.dtype) + mine
        for work in sends:
            groups.wait(work)


def _stage_of(plan: RuntimePlan, layer: int) -> int:
    for stage in range(plan.pipeline_stages):
        if layer in plan.layers_of(stage):
            return stage
    raise LiveputError(f"plan {plan.generation} puts layer {layer} in no stage")


def _parameter(by_index: dict[int, LayerState], member: Member) -> torch.nn.Parameter:
    return by_index[member[0]].module.get_parameter(member[1])


def _gradient(parameter: torch.nn.Parameter) -> torch.Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
