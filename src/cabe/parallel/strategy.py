"""What a data-parallel strategy gets and gives: one GPU's model-parallel share of the states in,
the states it keeps (and what it adds: buffers, gathered parameters, host memory) out.

One pass, tensor by tensor: every parameter tensor this GPU holds (:class:`~cabe.parallel.shares.Held`,
its TP / EP / PP share applied) is turned into bytes with the single-GPU pass's own rules — its stored
dtype (:func:`cabe.parameters.stored_bytes`), the allocator's 512-byte rounding per tensor, the optimizer
registry's state rule per tensor — after the strategy has cut it (FSDP2's dim-0 chunks, ZeRO-3's padded
partitions, ZeRO-1/2's flat aligned partition). With one GPU and no sharding the sums are, byte for
byte, the single-GPU figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.parallel.shares import Holdings, dense_bytes, optimizer_bytes, pieces, quantized_held_bytes
from cabe.training import TrainingSetup

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Context:
    """One GPU's view: its layout, its holdings (tensor by tensor), and its model-parallel (TP / PP / EP)
    share of the states before any data-parallel sharding."""

    setup: TrainingSetup
    cfg: ShardConfig
    dt: Any
    layout: Layout
    mine: Holdings

    @property
    def amp(self) -> bool:
        """The module computes in 16-bit while its masters are fp32: autocast's copies of fp32 weights,
        or a sharding engine's ``param_dtype`` (FSDP ``MixedPrecision``, DeepSpeed ``bf16``)."""
        return bool(self.dt.weight_copies or self.dt.gathered)

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the parameters as the module computes with them (gathered / 16-bit)."""
        return int(self.dt.gathered or (2 if self.amp else self.dt.weight))

    @property
    def offload_optimizer(self) -> bool:
        return self.setup.offload in ("optimizer", "both")

    @property
    def offload_parameters(self) -> bool:
        return self.setup.offload in ("parameters", "both")

    @property
    def group(self) -> int:
        return self.layout.shard_group

    # ---- this GPU's model-parallel share of the states, tensor by tensor -------------------------
    @property
    def weights(self) -> int:
        return dense_bytes(pieces(self.mine.held)) + quantized_held_bytes(self.mine.held, self.setup)

    @property
    def grads(self) -> int:
        return dense_bytes(self._grad_pieces)

    @property
    def optimizer(self) -> int:
        state = optimizer_bytes(pieces(self.mine.held, trainable=True), self.setup)[0]
        if self.setup.optimizer == "sgd-momentum":  # (its buffer is ``clone(grad)``: torch/optim/sgd.py)
            state += self.grads - dense_bytes(pieces(self.mine.held, trainable=True))
        return state

    @property
    def _grad_pieces(self) -> list[Any]:
        """The trainable tensors as their gradients stand after backward. Under tensor parallelism alone a trained,
        untied, vocabulary-sharded embedding keeps the whole vocabulary's gradient: DTensor's embedding backward
        gives it as a partial sum (torch 2.13 distributed/tensor/_ops/_embedding_ops.py, no Shard(0) strategy) and
        AccumulateGrad stores that as ``.grad``, whole on every GPU (traced: llama-3.1-8b, TP 8)."""
        items = pieces(self.mine.held, trainable=True)
        if self.layout.tp == 1 or self.layout.strategy != "none" or self.mine.tied:
            return items
        tp = self.layout.tp
        return [(replace(t, numel=t.numel * tp) if t.name == "embed_tokens" else t, n, b) for t, n, b in items]

    @property
    def temporaries(self) -> int:
        return optimizer_bytes(pieces(self.mine.held, trainable=True), self.setup)[1]


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
    # live in the layers' backward only, not beside the loss head's (step.StepParts.extra_layer_backward)
    layer_backward: dict[str, float] = field(default_factory=dict)
    # live once a layer below the top one runs backward (step.StepParts.extra_below_top)
    below_top: dict[str, float] = field(default_factory=dict)
    # the head's weight gradients (the tied lm_head's pending one, the chunked loss's summed ones, the tied
    # embedding's backward) are made whole by autograd, this many times the stored gradient's bytes per element
    # (FSDP: the unsharded parameter's, in the gathered dtype); 0: they shrink as the gradients do
    whole_head_grads: float = 0.0
    # the tied embedding's summed gradient is the .grad ``grads`` counts (DeepSpeed ZeRO-1 keeps every 16-bit .grad
    # whole until the backward's end): beside it at that moment only the lm_head's and the embedding's own
    head_grad_counted: bool = False
    # the gradients at the optimizer's step, where they differ from ``grads`` at the backward's end (DeepSpeed ZeRO-1/2:
    # rank 0's ``grads_in_partition``); None: ``grads``
    step_grads: float | None = None
    # the gradients this rank keeps as a model state (the ZeRO paper's 2Ψ/N under stages 2/3), where the timeline
    # holds them elsewhere than ``grads`` (``step_grads``, a buffer); None: ``grads``
    state_grads: float | None = None
    # the gradients at the embedding's backward, where they differ from ``grads`` (FSDP2: the root unit's shards are
    # made only in its post-backward, after it); None: ``grads``
    embedding_grads: float | None = None
    # live while a layer above the bottom one runs backward (step.StepParts.extra_above_bottom)
    above_bottom: dict[str, float] = field(default_factory=dict)
    # live once the layer running backward makes its gradients (step.StepParts.extra_layer_grads)
    layer_grads: dict[str, float] = field(default_factory=dict)
    # held once per layer whose backward has not ended, from its forward on (step.StepParts.extra_pending_layer;
    # FSDP2 with reshard_after_forward=False: each unit's all-gathered parameters)
    pending_layer: dict[str, float] = field(default_factory=dict)
    # held once per layer whose backward has ended, to the end of backward (step.StepParts.extra_done_layer)
    done_layer: dict[str, float] = field(default_factory=dict)
    # the backward buffers that differ at the embedding's backward, after every layer's (step.StepParts.extra_embedding)
    embedding_backward: dict[str, float] | None = None
    # expert parallelism under FSDP2: the experts unit's gathered parameters, live only while its own layer runs
    # (cabe.parallel.fsdp), in forward at the top MoE layer's exchange (plan: its forward transient)
    experts_gathered: float = 0.0
    # transients of one moment of backward, (layers from the top of the gradient's path, buffers); -1: the end of
    # backward (step.StepParts.extra_flush: DeepSpeed ZeRO-3's bucket flushes)
    flushes: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    # live at the forward's start (step.StepParts.extra_forward_start)
    forward_start: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def everywhere(self, name: str, nbytes: float) -> None:
        if nbytes > 0:
            for d in self.buffers.values():
                d[name] = d.get(name, 0) + nbytes


def unsharded(c: Context) -> States:
    """No data parallelism (one GPU, or only TP / PP): the model-parallel share is what stays."""
    return States(c.weights, c.grads, c.optimizer, c.temporaries)
