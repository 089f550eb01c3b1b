"""What a data-parallel strategy gets and gives: one GPU's model-parallel share of the states in,
the states it keeps (and what it adds: buffers, gathered parameters, host memory) out.

Bytes per stored byte: the single-GPU estimate (:mod:`cabe.analytic`) rounds every tensor to the
allocator's 512-byte blocks and knows each optimizer's state per parameter; :class:`Scale` carries
those totals per stored byte, so a GPU's share of the sums in :class:`~cabe.parallel.shares.Holdings`
turns into the same bytes the single-GPU pass would count for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.parallel.shares import Holdings
from cabe.step import StepParts
from cabe.training import TrainingSetup

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Scale:
    """The single-GPU pass's bytes per stored byte (``weights`` ≈ 1, the allocator's rounding) and per
    trainable stored byte (``optimizer``: the optimizer's state; ``grads``; ``temporaries``: the step's)."""

    weights: float
    optimizer: float
    grads: float
    temporaries: float

    @classmethod
    def of(cls, parts: StepParts, whole: Holdings) -> Scale:
        stored = whole.stored + whole.quantized
        t = whole.trainable
        return cls(
            weights=parts.weights / stored if stored else 0.0,
            optimizer=parts.optimizer / t if t else 0.0,
            grads=parts.grads / t if t else 0.0,
            temporaries=parts.optimizer_temporaries / t if t else 0.0,
        )


@dataclass(frozen=True)
class Context:
    """One GPU's view: its layout, its holdings, the scale, and its model-parallel (TP / PP / EP)
    share of the states before any data-parallel sharding."""

    setup: TrainingSetup
    cfg: ShardConfig
    dt: Any
    layout: Layout
    mine: Holdings
    scale: Scale

    @property
    def amp(self) -> bool:
        return bool(self.dt.weight_copies)

    @property
    def offload_optimizer(self) -> bool:
        return self.setup.offload in ("optimizer", "both")

    @property
    def offload_parameters(self) -> bool:
        return self.setup.offload in ("parameters", "both")

    @property
    def group(self) -> int:
        return self.layout.shard_group

    # ---- this GPU's model-parallel share of the states, as the single-GPU pass stores them ------
    @property
    def weights(self) -> float:
        return (self.mine.stored + self.mine.quantized) * self.scale.weights  # fp32 with AMP

    @property
    def grads(self) -> float:
        return self.mine.trainable * self.scale.grads

    @property
    def optimizer(self) -> float:
        return self.mine.trainable * self.scale.optimizer

    @property
    def temporaries(self) -> float:
        return self.mine.trainable * self.scale.temporaries

    @property
    def sharded_fraction(self) -> float:
        """The share of this GPU's trainable bytes it keeps after data-parallel sharding."""
        return self.mine.trainable_sharded / self.mine.trainable


@dataclass
class States:
    """What a strategy leaves on the GPU; ``buffers[phase][name]`` are bytes live in that phase."""

    weights: float
    grads: float
    optimizer: float
    temporaries: float
    host: float = 0.0  # host RAM per GPU process
    keep_copies: bool = True  # autocast's 16-bit weight copies (the module itself stays fp32)
    buffers: dict[str, dict[str, float]] = field(default_factory=lambda: {p: {} for p in PHASES})
    notes: list[str] = field(default_factory=list)

    def everywhere(self, name: str, nbytes: float) -> None:
        if nbytes > 0:
            for d in self.buffers.values():
                d[name] = d.get(name, 0) + nbytes


def unsharded(c: Context) -> States:
    """No data parallelism (one GPU, or only TP / PP): the model-parallel share is what stays."""
    return States(c.weights, c.grads, c.optimizer, c.temporaries)
