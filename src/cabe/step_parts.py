"""What a training step is made of, per GPU: :class:`StepParts` (bytes), :class:`LayerRun` (the runs of like layers
of a model whose layers differ), :class:`RunBuffers` (a sharded plan's buffers per run) and :class:`Moment` (what is
live at one moment). :mod:`cabe.step` walks them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cabe.frozen import quick


@quick
@dataclass(frozen=True)
class Moment:
    """What is live at one moment of the step: component name -> bytes."""

    phase: str  # "forward" | "backward" | "optimizer"
    where: str  # e.g. "loss", "head", "top_layer", "bottom_layer", "step"
    components: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.components.values())


@quick
@dataclass(frozen=True)
class LayerRun:
    """Per-GPU figures of ``count`` consecutive layers in the gradient's path that are made alike (bytes per
    layer): the layer-shaped fields of :class:`StepParts`, for one run of a model whose layers differ."""

    count: int
    grads: int  # gradients one layer makes
    copies: int  # autocast copies one layer saves for backward (0 with checkpointing)
    saved: int  # what one layer keeps for backward
    recompute: int = 0  # checkpointing: a recomputed layer's activations
    workspace: int = 0  # transient extra while one layer runs backward
    copies_recompute: int = 0  # checkpointing: the copies of the layer being recomputed
    copies_cached: int = 0  # checkpointing: what autocast's cache alone holds of one layer
    cached_count: int = 0  # checkpointing: layers of the run whose copies sit in the cache
    grads_mlp: int = 0  # of ``grads``: what the MLP block's backward makes, before attention's
    mlp_saved: int = 0  # of ``saved`` (or ``recompute``): what the MLP block saved, freed before attention's backward
    attention_workspace: int = 0  # transient extra while attention's backward runs
    recompute_transient: int = 0  # checkpointing: a transient of the layer's recomputed forward (PEFT's casts)
    # gradients of throwaway parameters (DoRA + dropout on Conv1D: cabe.activations _dora_stray_parameter) one
    # layer's backward makes, alive until the graph is freed after backward; of them, the MLP block's
    stray_grads: int = 0
    stray_grads_mlp: int = 0
    # gradient accumulation: the largest new gradient of the MLP block / of attention, made beside the .grad the
    # previous micro-batch left (AccumulateGrad adds it in place, then frees it: a MoE's expert stack is GBs)
    accum_grad_mlp: int = 0
    accum_grad_attention: int = 0
    # the routed experts' backward before any MLP gradient is made (cabe.activations _dispatch_workspace): a
    # transient beside everything the layer saved; 0: no such moment
    dispatch_workspace: int = 0
    # torchao's fp8 casts in the MLP's output projection's backward, beside everything the layer saved and before any
    # MLP gradient (cabe.activations.compose ``_fp8_moments``); 0: no such moment
    fp8_workspace: int = 0
    # the MLP block's gradient moment: what the routed experts' backward released before their last weight gradient
    # (cabe.activations LayerActivations.experts_freed_per_token)
    experts_freed: int = 0
    # checkpointed layers; of ``saved`` / ``recompute`` / ``mlp_saved``: the all-gathered inputs under SP (as
    # StepParts.gathered_layer ...); the run's LayerGroup (a sharded plan's units are sized by it) and its buffers
    # while this run's unit is the one they hold (RunBuffers; None: the StepParts' own)
    checkpointed: bool = False
    gathered: int = 0
    gathered_recompute: int = 0
    mlp_gathered: int = 0
    # of ``saved`` / ``recompute`` / ``mlp_saved``: the residual stream's tensors, whole on every GPU under TP (as
    # StepParts.stream_layer ...: cabe.parallel.activations.tensor_parallel_saved)
    stream: int = 0
    stream_recompute: int = 0
    mlp_stream: int = 0
    group: Any = field(default=None, compare=False)
    buffers: Any = field(default=None, compare=False)


@quick
@dataclass(frozen=True)
class RunBuffers:
    """A sharded plan's buffers (the StepParts fields of these names, whole) while the unit they hold is one run's
    layer's: a MoE unit's gathered parameters are many times a dense one's (cabe.parallel.runs)."""

    extra_forward: dict[str, int]
    extra_backward: dict[str, int]
    extra_layer_backward: dict[str, int]
    extra_below_top: dict[str, int]
    extra_above_bottom: dict[str, int]
    extra_layer_grads: dict[str, int]
    extra_pending_layer: dict[str, int]
    extra_done_layer: dict[str, int]


@quick
@dataclass(frozen=True)
class StepParts:
    """Per-GPU sizes, in bytes, that a training step is made of."""

    weights: int  # parameters as stored (incl. 4-bit weights and their quantization state)
    optimizer: int  # optimizer state held by the allocator
    grads: int  # every gradient, at the end of backward
    grads_head: int  # gradients made at the head (lm_head, final norm)
    grads_per_layer: int
    grad_layers: int  # layers the gradient flows through (all but frozen-bottom ones)
    # Autocast's 16-bit weight copies (aten/src/ATen/autocast_mode.cpp, cached_cast): it caches the cast
    # of a weight only when the weight is an fp32 leaf that requires grad, until the autocast context
    # exits (the end of forward); any other cast lives only as long as autograd saves it for backward.
    copies_layer: int  # copies one layer in the gradient's path saves for backward (0 with checkpointing)
    copies_head: int  # the lm_head's copy (saved for backward; outside the checkpointed layers)
    saved_layer: int  # what one layer keeps for backward (its input only, with checkpointing)
    recompute_layer: int  # checkpointing: the activations of the layer being recomputed
    workspace_layer: int  # transient extra while one layer runs backward
    rotary: int  # cos/sin tables shared by all layers
    head_saved: int  # log-softmax output, saved for backward
    final_norm_saved: int  # what the final norm saves (counted with the activations)
    head_forward_extra: int  # logits + fp32 upcast, alive while the loss is computed
    head_backward_extra: int  # gradients of log-softmax and of the logits
    optimizer_temporaries: int
    grads_in_forward: bool  # gradient accumulation: last micro-batch's gradients still live
    embedding_backward_workspace: int = 0  # 16-bit embeddings: CUDA accumulates their gradient in fp32
    embedding_saved: int = 0  # a LoRA on the embedding: lora_embedding_A's output, until backward ends
    copies_cached_layer: int = 0  # checkpointing: what autocast's cache alone holds of one trained layer
    cached_layers: int = 0  # checkpointing: trained layers whose copies sit in the cache at forward's end
    copies_recompute: int = 0  # checkpointing: the copies of the one layer being recomputed
    # checkpointing: layers outside the gradient's path (freeze's frozen bottom) still keep their input
    # alive through the step (the checkpoint's saved inputs; seen in the trace)
    frozen_inputs: int = 0
    # ... and, under autocast, the 16-bit weight copies those frozen layers left out of selective checkpointing
    # saved (their input requires grad, so each matmul keeps its cast of the frozen weight)
    frozen_copies: int = 0
    # tied embeddings: the lm_head's gradient waits in autograd's input buffer of the shared weight's
    # AccumulateGrad node until the embedding's gradient arrives at the very end of backward
    tied_grad_pending: int = 0
    # autocast on an fp32 lm_head: MmBackward0 gives the 16-bit copy's gradient, ToCopyBackward0 casts it
    # to the weight's dtype; both are alive at that moment (``head_weight_grad`` is the cast)
    head_copy_grad: int = 0
    head_weight_grad: int = 0
    # torchtune's chunked loss on a trained head: the weight gradient summed across chunks out of place (three
    # weight-sized gradients) while the logits gradients of the chunks not yet reached wait
    head_chunk_grads: int = 0
    head_chunk_logits: int = 0
    # extra per-phase components from sharding (communication buffers, gathered layers ...)
    extra_forward: dict[str, int] = field(default_factory=dict)
    extra_backward: dict[str, int] = field(default_factory=dict)
    extra_optimizer: dict[str, int] = field(default_factory=dict)
    # ... and buffers that exist only once the layers' backward has begun (FSDP's unsharded gradients of the unit
    # running backward and the previous unit's reduce-scatter input): not beside the loss head's backward
    extra_layer_backward: dict[str, int] = field(default_factory=dict)
    # ... and those that exist only once a layer below the top one runs backward (FSDP's reduce-scatter input of the
    # unit above, kept until the next unit's post-backward reclaims it)
    extra_below_top: dict[str, int] = field(default_factory=dict)
    # ... and those of the layer's own gradients, once it makes them (FSDP's unsharded gradients of the unit): not
    # at the moments before its first gradient (the experts' dispatch, the end of its recomputed forward)
    extra_layer_grads: dict[str, int] = field(default_factory=dict)
    # ... and those of a layer that has a unit below it to prefetch (FSDP's next unit gathered ahead): not at the
    # bottom layer of the gradient's path, whose next unit is the root's, gathered all along
    extra_above_bottom: dict[str, int] = field(default_factory=dict)
    # ... and those held once per layer of the gradient's path whose backward has not ended, from its forward on: all
    # of them at the end of forward and at the loss head's backward, those at or below the layer running backward
    # (FSDP2 with reshard_after_forward=False: each unit's all-gathered parameters, freed in its post-backward)
    extra_pending_layer: dict[str, int] = field(default_factory=dict)
    # held once per layer of the gradient's path whose backward has ended, to the end of backward (HSDP's all-reduce
    # inputs: parallel.fsdp); the embedding's moment holds every one, the optimizer's none
    extra_done_layer: dict[str, int] = field(default_factory=dict)
    # the backward buffers at the embedding's backward, after every layer's, where they differ from
    # ``extra_backward`` (FSDP: only the root unit is still gathered); None: ``extra_backward``
    extra_embedding: dict[str, int] | None = None
    # transients of one moment of backward (DeepSpeed ZeRO-3's bucket flush, cabe.parallel.zero): (layers from the top
    # of the gradient's path, buffers) beside that layer's backward; -1: after every layer's, beside ``extra_embedding``;
    # -2: after the loss head's backward, before any layer's (DeepSpeed ZeRO-2's reduces of the head's gradients)
    extra_flush: tuple[tuple[int, dict[str, int]], ...] = ()
    # the forward's start, where the first layer's unit is gathered beside the unit before it and its all-gather
    # output (FSDP2: cabe.parallel.fsdp ``_forward_start``), before any layer has saved anything; empty: no moment
    extra_forward_start: dict[str, int] = field(default_factory=dict)
    # the layers in the gradient's path, run by run from the bottom, when their figures are known run by
    # run (a model whose layers differ); empty: ``grad_layers`` layers of the per-layer fields above
    runs: tuple[LayerRun, ...] = ()
    # a trained embedding (untied): its backward gets the gradient of its output (tokens × h) when every
    # other gradient exists, and makes the last one
    embedding_grad_input: int = 0
    # the per-layer split of the layer's backward (see LayerRun), for plans that walk a mean layer
    grads_mlp_layer: int = 0
    mlp_saved_layer: int = 0
    # of ``saved_layer`` / ``recompute_layer`` / ``mlp_saved_layer`` / ``final_norm_saved``: what the linears reading
    # a block's input save of it (LayerActivations.gathered_input_per_token, HeadActivations.gathered_input), the
    # tensors sequence parallelism all-gathers (cabe.parallel.activations.sequence_parallel)
    gathered_layer: int = 0
    gathered_recompute_layer: int = 0
    mlp_gathered_layer: int = 0
    final_norm_gathered: int = 0
    # of ``saved_layer`` / ``recompute_layer`` / ``mlp_saved_layer``: the residual stream's tensors (the stream norms',
    # dropout masks on it: LayerActivations.stream_per_token; a checkpointed layer's input; the layer's constants),
    # whole on every GPU under tensor parallelism as the gathered inputs are (cabe.parallel.activations)
    stream_layer: int = 0
    stream_recompute_layer: int = 0
    mlp_stream_layer: int = 0
    attention_workspace_layer: int = 0
    # the gradients at the optimizer's step where they differ from ``grads`` (DeepSpeed ZeRO-1/2: rank 0's gradient
    # partition, cabe.parallel.zero); None: ``grads``
    grads_at_step: int | None = None
    # the gradients at the embedding's backward, where they differ from ``grads`` (FSDP2's root unit: its sharded
    # gradients are reduce-scattered after the embedding's backward, cabe.parallel.fsdp); None: ``grads``
    grads_at_embedding: int | None = None
    # cuBLAS's workspaces, held by the caching allocator from the first step on (cabe.units.CUDA_WORKSPACES)
    cuda_workspaces: int = 0
    # logits a training loop keeps bound from one step to the next (LitGPT's ``logits``: through backward, the
    # optimizer step and the next forward, until the next step's exist): at every moment but the loss's, where they
    # are the head's own logits (cabe.activations.head._litgpt_loss)
    carried_logits: int = 0
    # a transient of the top layer's forward when every layer below holds its activations (DoRA's weight
    # norms: cabe.activations ``adapters._dora_norm_transient``); 0: none worth a moment
    forward_transient: int = 0
    # checkpointing: the largest transient of a recomputed layer's forward (LayerRun.recompute_transient)
    recompute_transient_layer: int = 0
    # the routed experts' first backward nodes beside everything a layer saved (LayerRun.dispatch_workspace): the
    # largest over the runs, for plans that walk a mean layer (a MoE layer among dense ones holds it)
    dispatch_workspace_layer: int = 0
    # torchao's fp8 casts in a layer's first backward (LayerRun.fp8_workspace)
    fp8_workspace_layer: int = 0
    # images (cabe.vision.training): what the vision tower saves for backward, alive from its forward (before the first
    # decoder layer) until its own backward (after the bottom layer's), and the gradients of its weights. Its
    # backward runs from the merger down to the bottom block, releasing each block's saved tensors and making its
    # gradients: ``vision_backward`` is the activations at its largest moment (what is still saved and that
    # block's transient), ``vision_backward_grads`` the tower's gradients made by then
    vision_saved: int = 0
    vision_grads: int = 0
    vision_backward: int = 0
    vision_backward_grads: int = 0
    # the tower's forward (before the decoder's): what it has saved and its largest transient, beside the pixels
    vision_forward: int = 0

    def layer_runs(self) -> tuple[LayerRun, ...]:
        """The gradient's path as runs of like layers, bottom first."""
        if self.runs:
            return self.runs
        if not self.grad_layers:
            return ()
        return (
            LayerRun(
                self.grad_layers,
                self.grads_per_layer,
                self.copies_layer,
                self.saved_layer,
                self.recompute_layer,
                self.workspace_layer,
                self.copies_recompute,
                self.copies_cached_layer,
                self.cached_layers,
                self.grads_mlp_layer,
                self.mlp_saved_layer,
                self.attention_workspace_layer,
                self.recompute_transient_layer,
                dispatch_workspace=self.dispatch_workspace_layer,
                fp8_workspace=self.fp8_workspace_layer,
            ),
        )
