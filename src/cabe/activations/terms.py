"""The activation rooms' data: a saved tensor group (:class:`Term`), one decoder layer's saved bytes and moments
(:class:`LayerActivations`), the head's (:class:`HeadActivations`). Plain frozen data; the rooms fill them
(:mod:`cabe.activations.compose`, :mod:`cabe.activations.head`), the estimate and :mod:`cabe.step` read them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cabe.frozen import cached, quick


class Term(NamedTuple):
    """One saved tensor group: ``bytes_per_token`` for one layer (or for the model head). (A named tuple: a layer adds
    a score of them per estimate, and the explanation is keyed by them; a frozen dataclass builds and hashes slower.)"""

    name: str
    bytes_per_token: int
    formula: str


@quick
@dataclass(frozen=True)
class LayerActivations:
    terms: tuple[Term, ...]
    backward_workspace_per_token: int  # transient extra while one layer runs backward
    forward_workspace_per_token: int  # transient extra while one layer runs forward
    per_layer_bytes: int = 0  # saved tensors that do not grow with tokens (Gemma's fp32 1 + w)
    flash_rng_bytes: int = 0  # CUDA flash attention's philox seed and offset (not on the CPU kernel)
    # what the MLP block saves, released before attention's backward (_freed_before_attention_backward),
    # and the transient of attention's own backward (the math / eager kernels' s×s gradients)
    mlp_saved_per_token: int = 0
    attention_workspace_per_token: int = 0
    # DoRA: the largest transient of one adapted module's weight norm, made in every forward (per layer)
    dora_norm_bytes: int = 0
    # the block's backward transient while every saved tensor is still alive (the layer's MLP backward); the
    # attention's own transient comes later, once the MLP's saved tensors are released (step.LayerRun)
    mlp_workspace_per_token: int = 0
    # of ``terms``: the bytes per token that are the layer's input itself (a norm that saves its fp32 input
    # as it is): under checkpointing that tensor is the checkpoint's saved input, not a new one
    input_alias_per_token: int = 0
    # the MLP backward's transient that does not grow with tokens (a LoRA-wrapped expert stack's W' gradient)
    mlp_workspace_constant: int = 0
    # the largest transient of one adapted module's forward: PEFT's cast of its input to the adapters' dtype and
    # the dropped copy (see adapters.note_lora_input); under checkpointing it comes back in the layer's recompute
    lora_forward_transient_per_token: int = 0
    # DoRA with dropout on a Conv1D (fan_in_fan_out) layer: the gradient of PEFT's throwaway ``Parameter(W.T)``
    # (see adapters._dora_stray_parameter), made in this layer's backward and freed with the graph; of it, the
    # MLP block's
    stray_grad_bytes: int = 0
    stray_grad_mlp_bytes: int = 0
    # DeepSeek-V3.2's lightning indexer (no_grad): its largest transient while it scores (see
    # latent._indexer_transient), and the bytes per token the layer saves after it ran (not yet alive then)
    indexer_transient_per_token: int = 0
    indexer_after_per_token: int = 0
    # the largest moment of one adapted module's forward (PEFT's input copies, LoRA's or DoRA's output arithmetic),
    # in bytes for the setup's tokens, beyond all the layer saves (see adapters.note_lora_input, _note_dora_result):
    # a transient of the forward and of a recompute
    dora_result_bytes: int = 0
    # the routed experts' backward before any MLP gradient exists (grouped_mm dispatch: moe.dispatch_workspace), per
    # token, beside every tensor the layer saved; 0: none
    dispatch_workspace_per_token: int = 0
    # of ``terms``: what the routed experts' backward has released by the time it makes their weights' last
    # gradient (the experts' outputs, products and activations, and all the block saved after them), per token;
    # the MLP block's gradient moment holds every gradient beside the rest (step.LayerRun.experts_freed)
    experts_freed_per_token: int = 0
    # checkpointing: the gradient of the layer's output, waiting in autograd's input buffer while the layer is
    # recomputed (set where it is not small beside the rest: DeepSeek-V4's n streams, cabe.compressed_attention)
    output_grad_per_token: int = 0
    # of ``terms``: what the linears that read the attention's and the MLP's input save of it (the shared input,
    # its casts, the adapters' copies: activations.adapters.linear_inputs), and of that the MLP block's. Sequence
    # parallelism all-gathers that input before the column-parallel projections, so it stays whole on every GPU
    # (cabe.parallel.activations.sequence_parallel)
    gathered_input_per_token: int = 0
    mlp_gathered_per_token: int = 0
    # of ``terms``: the residual stream's own tensors (the stream norms' inputs, outputs and statistics, dropout masks on
    # the stream: LayerState.add_stream), and of that the MLP block's. Tensor parallelism without sequence parallelism
    # leaves them whole on every GPU, as it does the gathered inputs above; sequence parallelism splits them by
    # position (cabe.parallel.activations)
    # fp8 training with torchao's Float8Linear (cabe.fp8): the largest moment of the layer's forward and of its MLP
    # backward while its casts run, in bytes for the setup's tokens, beyond everything the layers saved (0: none)
    fp8_forward_bytes: int = 0
    fp8_backward_bytes: int = 0
    stream_at: tuple[int, ...] = ()  # (the indices of those terms: read under TP only, summed when read)
    mlp_from: int = 0  # (the index of the MLP block's first term)

    @property
    def stream_per_token(self) -> int:
        return sum(self.terms[i].bytes_per_token for i in self.stream_at)

    @property
    def mlp_stream_per_token(self) -> int:
        return sum(self.terms[i].bytes_per_token for i in self.stream_at if i >= self.mlp_from)

    @property
    def indexer_moment_per_token(self) -> int:
        """What the indexer adds on top of every saved tensor of the layer it runs in: its transient less what the
        layer saves only after it (a moment inside the layer's forward, or inside a checkpointed recompute)."""
        return max(0, self.indexer_transient_per_token - self.indexer_after_per_token)

    @property
    def constant_bytes(self) -> int:
        return self.per_layer_bytes + self.flash_rng_bytes

    @cached  # (in the instance's __dict__, outside the fields: read by several parts of an estimate)
    def bytes_per_token(self) -> int:
        return sum(t.bytes_per_token for t in self.terms)


@quick
@dataclass(frozen=True)
class HeadActivations:
    final_norm: int  # saved by the final norm (per token)
    logits: int  # lm_head output kept until the loss is done (per token)
    saved_logsoftmax: int  # log-softmax output saved for backward (per token)
    forward_peak_extra: int  # transient fp32 upcast at the loss (per token)
    backward_peak_extra: int  # grads of log-softmax and of the logits at the head's backward
    # bytes that do not scale with all the tokens: one chunk's transients (chunked / fused losses)
    forward_fixed: int = 0
    backward_fixed: int = 0
    # logits the training loop keeps from one step to the next (per token; LitGPT: cabe.step.StepParts.carried_logits)
    carried: int = 0
    # of ``final_norm``: what the lm_head saves of its input (the final norm's output): all-gathered whole on every
    # GPU by sequence parallelism (cabe.parallel.activations.sequence_parallel)
    gathered_input: int = 0
