"""The model head: the final norm, the lm_head and the loss, by loss kernel — transformers' loss (the logits, their
fp32 upcast and log-softmax), torchtune's chunked loss, Liger's and Apple's fused linear cross-entropy (modelled from
their Triton source), a sequence classifier's head — and LoRA on the lm_head or the token embedding.

Logits: the lm_head output (a·V), its fp32 upcast in the loss (4V, transient), and log-softmax's fp32 output (4V,
saved), as transformers 5.24 loss/loss_utils.py ``ForCausalLMLoss`` makes them. Proved by tests/trace/test_loss.py,
test_lora_head_trace.py, test_modules_to_save_trace.py, test_bert_trace.py."""

from __future__ import annotations

from dataclasses import replace

from cabe.activations import compressed
from cabe.activations.terms import HeadActivations
from cabe.architecture import ModelSpec
from cabe.facts import head_facts
from cabe.objectives.fused_head import fused_head, policy_outputs
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc


def head_activations(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    """The final norm and the loss, by loss kernel (``setup.resolved_loss``)."""
    if spec.head == "sequence_classification":
        return _classifier_head(spec, setup, dt)
    head = _lm_head(spec, setup, dt)
    # what the lm_head saves of its input (HeadActivations.gathered_input): its matmul's when its weight trains,
    # LoRA's, modules_to_save's copy
    gathered = (dt.residual * spec.hidden_size if setup.method == "full" else 0) + lm_head_lora_saved(spec, setup, dt)
    return replace(head, gathered_input=gathered + lm_head_saved_input(spec, setup, dt))


def _lm_head(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    h, v = spec.hidden_size, spec.vocab_size
    rho = dt.residual
    a = dt.compute
    full = setup.method == "full"
    if spec.norm == "rmsnorm":
        final_norm = 4 * h + 4 + (rho * h if full else 0) + (rho * h if full else 0)
    else:
        ln_in = 4 if dt.autocast else rho  # autocast runs layer_norm on an fp32 cast of its input
        final_norm = ln_in * h + 8 + (rho * h if full else 0)
    final_norm += lm_head_lora_saved(spec, setup, dt) + lm_head_saved_input(spec, setup, dt)
    if spec.hyper_connections:  # DeepSeek-V4's hc_head and fp32 final norm (activations.compressed)
        final_norm += compressed.head_saved(spec, rho, dt.autocast, full)
    # Gemma 2's final soft-capping (logits / cap, tanh, × cap) saves tanh's 16-bit output
    softcap = a * v if spec.final_logit_softcapping else 0
    # DPO, KTO and GRPO score with TRL's fused LM head (cabe.objectives.fused_head): no logits
    if setup.objective in ("dpo", "kto", "grpo"):
        return _trl_fused_head(final_norm, rho * h if full else 0, spec, setup, dt)
    loss = setup.resolved_loss
    if loss == "chunked":
        return _chunked_loss(final_norm, softcap, v, a, setup)
    if loss == "litgpt":
        return _litgpt_loss(final_norm, softcap, v, a, setup, 4 if dt.autocast else a)
    if loss in ("liger", "cce"):
        return _fused_linear_loss(loss, final_norm, rho * h if full else 0, spec, setup, dt)
    if setup.tp > 1 and setup.loss_parallel:
        return _hf_loss_parallel(final_norm, softcap, v, a)
    return _hf_loss(final_norm, softcap, v, a)


def _adapter_input(dt: Dtypes) -> tuple[int, int]:
    """(bytes per element of what lora_A saves of its input, of lora_A's output that lora_B saves) for an adapted
    ``Linear`` whose base weight is frozen (peft 0.21 tuners/lora/layer.py ``Linear.forward``: ``x =
    self._cast_input_dtype(x, lora_A.weight.dtype)``, then ``lora_B(lora_A(dropout(x)))``): under autocast the
    16-bit casts; else the input in the adapters' dtype (its own copy when that is not the compute dtype)."""
    if dt.autocast:
        return 2, 2
    return (dt.adapter_compute if dt.adapter_compute != dt.compute else dt.compute), dt.adapter_compute


def lm_head_lora_saved(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token a LoRA on the lm_head saves (the frozen base saves nothing of its input): lora_A's
    input (the final norm's output, cast as :func:`_adapter_input` says) and lora_A's output (r values);
    with dropout, CUDA's 1-byte mask and the dropped copy in place of the input."""
    if not head_facts(spec, setup).lm_head_adapted:
        return 0
    h, r = spec.hidden_size, setup.lora_rank
    x, mid = _adapter_input(dt)
    if setup.lora_dropout > 0:
        x = 2 if dt.autocast else dt.adapter_compute  # nn.Dropout's output in the adapters' dtype (cast under autocast)
        return x * h + h + mid * r
    return x * h + mid * r


def lm_head_saved_input(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token the lm_head's matmul saves of its input when ``modules_to_save`` trains a copy of it
    (cabe.method.saved_modules): the final norm's output, or autocast's 16-bit cast of it."""
    if not head_facts(spec, setup).lm_head_saved:
        return 0
    return (2 if dt.autocast else dt.residual) * spec.hidden_size


def embedding_lora_saved(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes per token a LoRA on the token embedding saves until backward reaches it (peft 0.21
    tuners/lora/layer.py ``Embedding.forward``: ``after_A = F.embedding(x, lora_embedding_A.T)``, which saves
    only the ids the batch already holds, then ``(after_A @ lora_embedding_B.T) * scaling``, whose matmul saves
    ``after_A``, r values per token, or autocast's 16-bit cast of it)."""
    if not head_facts(spec, setup).embedding_adapted:
        return 0
    return (2 if dt.autocast else dt.adapter_compute) * setup.lora_rank


def _hf_loss(final_norm: int, softcap: int, v: int, a: int) -> HeadActivations:
    """transformers' ForCausalLMLoss (loss/loss_utils.py, l. 51-73): ``logits.float()`` of the whole
    b·s×V logits, then ``cross_entropy`` (log-softmax saved in fp32, nll_loss)."""
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=4 * v + softcap,
        forward_peak_extra=0 if a == 4 else 4 * v,
        # nll_loss's gradient (a zeroed fp32 b·s×V, scattered) + log-softmax's input gradient (fp32)
        backward_peak_extra=4 * v + 4 * v,
    )


def _hf_loss_parallel(final_norm: int, softcap: int, v: int, a: int) -> HeadActivations:
    """transformers' ForCausalLMLoss on logits kept sharded over the vocabulary by tensor parallelism, inside
    torch's ``loss_parallel()`` (torch 2.13 distributed/tensor/parallel/loss.py): per GPU these bytes over ``tp``
    (:func:`cabe.parallel.activations.tensor_parallel`'s ``head``). Its log-softmax (``_log_softmax``, l. 197-221)
    keeps ``shifted = x - x_max`` while it makes ``exp(shifted)`` and the result: one fp32 logits-sized tensor more
    than the single-GPU kernel at the forward's peak. Its backward (``_nll_loss_and_log_softmax_backward``, l.
    451-518) is log-softmax's and NLL's in one: ``zeros_like(x)`` scattered, then ``(grad_input + exp(x)) *
    grad_output``: the zeros, ``exp(x)`` and their sum beside the saved log-softmax."""
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=4 * v + softcap,
        forward_peak_extra=(0 if a == 4 else 4 * v) + 4 * v,
        backward_peak_extra=3 * 4 * v,
    )


#: LitGPT's ``lm_head_chunk_size`` in its fine-tuning loops (finetune/lora.py, full.py: 128 positions)
LITGPT_CHUNK = 128


def loss_chunk_positions(setup: TrainingSetup) -> list[int]:
    """The positions of each chunk the lm_head runs over, in order: torchtune's ``tensor_split(n)`` (s mod n chunks
    of ceil(s/n), then floor(s/n)), LitGPT's ``split(128)`` (128 each, the last what is left); one chunk for the
    other losses."""
    s = setup.tokens_per_sequence
    if setup.resolved_loss == "chunked":
        n = setup.loss_chunks
        return [s // n + (1 if i < s % n else 0) for i in range(n)]
    if setup.resolved_loss == "litgpt":
        return [min(LITGPT_CHUNK, s - i) for i in range(0, s, LITGPT_CHUNK)]
    return [s]


def loss_chunk_tokens(setup: TrainingSetup) -> tuple[int, int]:
    """(tokens of the largest chunk, tokens of the last chunk), batch included (:func:`loss_chunk_positions`)."""
    positions = loss_chunk_positions(setup)
    return setup.batch * max(positions), setup.batch * positions[-1]


def _chunked_loss(final_norm: int, softcap: int, v: int, a: int, setup: TrainingSetup) -> HeadActivations:
    """torchtune's CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py, l. 65-100) over
    ``TransformerDecoder.chunked_output``: every logits chunk stays (together a·V per token), each is
    upcast and log-softmaxed in turn, so only one chunk's fp32 copy is transient; the log-softmax of every
    chunk is saved. Backward runs chunk by chunk from the last: its nll and log-softmax gradients (fp32)."""
    full_chunk, last = loss_chunk_tokens(setup)
    upcast = 0 if a == 4 else round_alloc(4 * v * last)
    # backward of the last chunk (every log-softmax still saved), or of the one before it (one fewer saved)
    before_last = max(8 * v * last, 8 * v * full_chunk - 4 * v * last)
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=4 * v + softcap,
        forward_peak_extra=0,
        backward_peak_extra=0,
        forward_fixed=upcast,
        backward_fixed=before_last,
    )


def _litgpt_loss(final_norm: int, softcap: int, v: int, a: int, setup: TrainingSetup, ce: int) -> HeadActivations:
    """LitGPT's fine-tuning loss (litgpt/finetune/lora.py and utils.py:302-332, v0.5.13; cabe.trace.loss
    ``litgpt_cross_entropy``): the lm_head over chunks of 128 positions, every chunk's logits alive until the loss is
    done (a·V), each chunk's cross-entropy in ``ce`` bytes — the logits' own dtype (bf16-true), or fp32 under
    autocast (bf16-mixed: cross_entropy is on autocast's fp32 list, its input cast and its log-softmax fp32) — the
    log-softmax saved; the sliced last chunk is copied by its reshape when the batch is above 1. Backward, chunk by
    chunk from the last: its nll and log-softmax gradients. The loop keeps ``logits`` bound through backward, the
    optimizer step and the next forward (``carried``)."""
    positions = loss_chunk_positions(setup)
    b, last = setup.batch, positions[-1] - 1  # (the last chunk loses its final position: logits[-1][..., :-1, :])
    copy = round_alloc(a * v * b * last) if b > 1 else 0
    cast = round_alloc(ce * v * b * max(positions)) if ce != a else 0  # autocast's fp32 input, one chunk at a time
    # backward runs every chunk's loss before any chunk's lm_head (their mm nodes are older: the engine runs the
    # newest first, torch/csrc/autograd/engine.cpp): as each chunk's saved tensors go, its logits' gradient joins the
    # ones waiting, so the loss backward holds what forward saved plus one chunk's nll and log-softmax gradients
    backward = 2 * ce * v * b * max(positions)
    # under autocast the fp32 cast of each chunk stays beside its log-softmax (traced: 4 + 2 bytes per logit)
    saved = ce * v + (a * v if ce != a else 0)
    return HeadActivations(
        final_norm=final_norm,
        logits=a * v,
        saved_logsoftmax=saved + softcap,
        forward_peak_extra=0,
        backward_peak_extra=0,
        forward_fixed=copy + cast,
        backward_fixed=backward,
        carried=a * v,
    )


def _fused_linear_loss(
    loss: str, final_norm: int, head_input: int, spec: ModelSpec, setup: TrainingSetup, dt: Dtypes
) -> HeadActivations:
    """Fused linear cross-entropy: the logits are never whole (modelled from the kernels' source; Triton,
    not traceable on a CPU).

    * ``liger``: LigerFusedLinearCrossEntropyFunction (liger_kernel/ops/fused_linear_cross_entropy.py,
      ``fused_linear_cross_entropy_forward``): ``grad_input = zeros_like(_input)`` (b·s×h in the input's
      dtype) and fp32 ``loss_1d`` (b·s); chunks of ``next_power_of_2(ceil(b·s / ceil(V/h)))`` rows, each
      ``_input_chunk @ weight.t()`` (chunk×V in the compute dtype, its gradient written in place by the
      Triton kernel) and its ``grad_logits_chunk @ weight`` (chunk×h); the gradients are made in forward and
      saved, so the lm_head's input is not.
    * ``cce``: cut_cross_entropy/cce.py, ``LinearCrossEntropyFunction``: saves ``e`` (the final norm's output,
      kept even when the lm_head is frozen), the fp32 log-sum-exp (b·s) and the valid indices; backward's
      kernel writes ``de`` (b·s×h) blockwise, with no b·s×V tensor.
    """
    h, v, a, rho = spec.hidden_size, spec.vocab_size, dt.compute, dt.residual
    tokens = setup.batch * setup.tokens_per_sequence
    if loss == "liger":
        inc = -(-v // h)
        chunk = min(1 << max(0, (-(-tokens // inc) - 1).bit_length()), tokens)
        # a trained lm_head: grad_weight = zeros_like(weight), made in forward and saved until backward
        grad_weight = round_alloc(v * h * dt.grad) if setup.method == "full" else 0
        return HeadActivations(
            final_norm=final_norm - head_input,
            logits=0,
            saved_logsoftmax=rho * h,
            forward_peak_extra=4,
            backward_peak_extra=0,
            forward_fixed=round_alloc(a * v * chunk) + round_alloc(a * h * chunk) + grad_weight,
            backward_fixed=grad_weight,
        )
    return HeadActivations(
        final_norm=final_norm - head_input,
        logits=0,
        saved_logsoftmax=rho * h + 4 + 8,  # e, lse (fp32), valids (int64)
        forward_peak_extra=4,  # the negated dot products, then the nll, per token (fp32)
        backward_peak_extra=rho * h,  # de
        forward_fixed=round_alloc(4 * v),  # logit_avg (fp32, V) for the gradient filter
        backward_fixed=0,
    )


def _trl_fused_head(
    final_norm: int, head_input: int, spec: ModelSpec, setup: TrainingSetup, dt: Dtypes
) -> HeadActivations:
    """TRL's fused LM head (:mod:`cabe.objectives.fused_head`): no logits; what it keeps and its transients are
    bytes of the batch, not per token, for the outputs the policy asks for
    (:func:`cabe.objectives.fused_head.policy_outputs`); the lm_head's input is not saved (``head_input``), but the final hidden states live through the head's forward."""
    outputs, top1 = policy_outputs(setup)
    f = fused_head(spec, setup, dt, outputs, top1=top1)
    return HeadActivations(
        final_norm=final_norm - head_input,
        logits=0,
        saved_logsoftmax=0,
        # the backbone's final hidden states, alive until the patched forward returns (trl/trainer/utils.py:1618)
        forward_peak_extra=dt.residual * spec.hidden_size,
        backward_peak_extra=0,
        forward_fixed=f.kept + f.forward_transient,
        backward_fixed=f.kept + f.backward_transient,
    )


def _classifier_head(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    """A sequence-classification encoder (BERT): no logits per token. ``final_norm`` stands for the
    embeddings' LayerNorm and dropout (``BertEmbeddings``), which save, per token, the norm's input
    (fp32 under autocast, layer_norm being on its fp32 list), its mean and rstd (8) and the dropout's
    1-byte mask — only when the embeddings train. The pooler and classifier save b·h and b·labels
    elements per *sequence* (the first token): under 0.1 % of a layer, not counted."""
    if setup.method != "full":
        return HeadActivations(0, 0, 0, 0, 0)
    h = spec.hidden_size
    ln_in = 4 if dt.autocast else dt.residual
    mask = h if spec.embedding_dropout > 0 else 0
    return HeadActivations(
        final_norm=ln_in * h + 8 + mask, logits=0, saved_logsoftmax=0, forward_peak_extra=0, backward_peak_extra=0
    )
