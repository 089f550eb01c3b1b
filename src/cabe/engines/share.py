"""One GPU's share of a tensor- / pipeline-parallel replica, as a serving engine's accounting needs it.

:func:`cabe.serving_parallel.per_gpu` lays the replica out (weights per rank with vocab padding and replicated
norms, each pipeline stage's layers, the communication buffers); an engine then budgets that GPU the way it budgets a
whole card. ``None`` where an engine takes one: the whole model on one GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Share:
    #: the GPU's weights (its stage's layers, split over the tensor-parallel group)
    weights_bytes: int
    #: allocated through PyTorch besides the model: vLLM's custom all-reduce registered buffer
    torch_bytes: int
    #: outside PyTorch: NCCL's channel buffers, the custom all-reduce IPC buffers, pipeline send / receive
    non_torch_bytes: int
    #: decoder layers on this GPU's stage, of ``total_layers``
    layers: int
    total_layers: int

    def layer_count(self, count: int) -> int:
        """Of ``count`` layers of one kind in the model, those on this stage (in proportion to the stage's layers:
        ``get_pp_indices`` cuts by position, and cabe keeps the kinds' counts, not their positions)."""
        if self.layers == self.total_layers:
            return count
        return max(1, round(count * self.layers / self.total_layers)) if count else 0


def of_stage(par: dict[str, Any], stage: int | None = None) -> Share:
    """The share of ``stage`` (default: the fullest) of :func:`cabe.serving_parallel.per_gpu`'s answer."""
    st = par["stages"][par["worst_stage"] if stage is None else stage]
    comm = st["comm"]
    start, end = st["layers"]
    return Share(
        weights_bytes=st["components"]["weights"],
        torch_bytes=comm["custom_all_reduce_torch"],
        non_torch_bytes=st["non_torch_bytes"],
        layers=end - start,
        total_layers=sum(par["partition"]),
    )
