"""TRL's fused LM head (trl 1.16.0 ``add_fused_lm_head``, trl/trainer/utils.py:1548-1698, and
``ChunkedLogProbFunction``, trl/kernels/chunked_logprob.py:292-465): what every TRL trainer's forward
(``fused_lm_head=True``) holds in place of the logits — DPO's and KTO's policy and reference passes
(:mod:`cabe.objectives.preference`), GRPO's policy step and its no-grad passes (:mod:`cabe.objectives.grpo`). No
torch here.

The patched forward (utils.py:1599-1660) runs the backbone; its final hidden states ``[rows, seq, h]``
(``backbone_outputs.last_hidden_state``, l. 1618) live until it returns. On a CUDA machine with Triton
(``_use_triton``, chunked_logprob.py:48) only the positions with a label are scored (``compact``, utils.py:1642):
``hidden_states[:, :-1][mask]`` is a copy of the K scored positions' hidden states (saved for backward with the K
int64 targets, the fp32 log-normaliser and entropy, chunked_logprob.py:386); the projection runs on one
``[min(K, 4096), 32768]`` tile in the compute dtype (``mm_buf``, l. 347) beside seven fp32 per-position statistics
(l. 340-346); every output asked for is scattered back to the ``rows × (seq - 1)`` positions
(``new_zeros(mask.shape).masked_scatter``, utils.py:1657). Backward: fp32 ``grad_hidden`` (K × h), fp32
``grad_weight`` when the head trains (l. 406-411), the tile again, then the casts to the inputs' dtypes (l. 455-457),
then the index's and the slice's backward into zeros of the whole rows.

Which outputs a trainer asks for (``add_fused_lm_head(outputs=...)``) and which positions carry a label are the
trainer's: :func:`policy_outputs` and :func:`completion_positions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.architecture import ModelSpec
from cabe.facts import head_facts
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc

#: chunked_logprob.py:31 (TOKEN_CHUNK_SIZE) and trl/trainer/utils.py:1506 (_CHUNKED_LOGPROB_CHUNK_SIZE)
TOKEN_TILE, VOCAB_TILE = 4096, 32768
#: the fp32 per-position statistics the forward keeps through its loop (chunked_logprob.py:340-346)
STATISTICS = 7


@dataclass(frozen=True)
class FusedHead:
    """Bytes of the fused head over one forward (rows of ``seq`` tokens)."""

    kept: int  # from the head's forward to its backward: mask, compact hidden copy, targets, log_z, entropy, outputs
    forward_transient: int  # the peak of the kernel's forward above ``kept`` (tile, statistics, casts)
    backward_transient: int  # the peak of the head's backward above ``kept``
    hidden_states: int  # the backbone's final hidden states, alive until the patched forward returns (l. 1618)


def completion_positions(setup: TrainingSetup) -> int:
    """Positions of a row with a completion label (the labels shifted by one, utils.py:1618-1619): the ones after the
    prompt. GRPO's rows are prompt + completion (``seq = p + c``) with every completion token scored
    (``labels[:, :-logits_to_keep] = -100``, grpo_trainer.py:1495-1496): ``c`` positions."""
    return setup.seq - max(setup.resolved_prompt_length, 1)


def scored_tokens(setup: TrainingSetup) -> int:
    """K: the positions of a forward's ``setup.batch`` rows the head scores."""
    return setup.batch * completion_positions(setup)


def policy_outputs(setup: TrainingSetup) -> tuple[int, bool]:
    """(the fp32 per-position outputs, the one-byte is_top1) the policy's forward asks the head for: GRPO's
    log-probs and entropy (``add_fused_lm_head(..., outputs=("log_probs", "entropy"))``, grpo_trainer.py:1068-1073);
    DPO's log-probs, entropy, mean logits and top-1 (dpo_trainer.py:954-960), WPO's weighting one more; KTO's three
    (kto_trainer.py:967-970)."""
    if setup.objective == "grpo":
        return 2, False
    dpo = setup.objective == "dpo"
    return 3 + (1 if dpo and setup.use_weighting else 0), dpo


def fused_head(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, outputs: int, top1: bool = False, grad: bool = True
) -> FusedHead:
    """The fused head over ``setup.batch`` rows of ``setup.seq`` tokens; ``outputs``: the fp32 per-position outputs
    asked for (log_probs, entropy, mean_logits, log_sum_sq_probs), ``top1``: the one-byte is_top1 too (DPO's policy,
    dpo_trainer.py:954-960; a separate reference asks for log_probs only, l. 961-962; GRPO's a separate reference too,
    grpo_trainer.py:1075-1077); ``grad``: False for a forward under ``torch.no_grad`` (nothing saved: the outputs and the
    label mask returned, ``label_mask=mask``, utils.py:1694)."""
    h, v = spec.hidden_size, spec.vocab_size
    rows, tokens = setup.batch, setup.tokens_per_sequence
    k, p = scored_tokens(setup), rows * (tokens - 1)
    rho, cd = dt.residual, dt.compute
    tile = min(k, TOKEN_TILE)
    scattered = outputs * round_alloc(4 * p) + (round_alloc(p) if top1 else 0)  # the outputs over every position
    # the arguments of the kernel (l. 1645-1648): hidden_states[mask] and labels[mask], saved when it has a backward
    inputs = round_alloc(k * h * rho) + round_alloc(8 * k)
    saved = round_alloc(p) + inputs + 2 * round_alloc(4 * k)  # the mask, the inputs, log_z, entropy (l. 386)
    kept = scattered + (saved if grad else round_alloc(p))
    buf = round_alloc(tile * VOCAB_TILE * cd)
    # the head's weight trains (full fine-tuning, or PEFT's modules_to_save copy of it, cabe.method.saved_modules):
    # its fp32 gradient is made in the head's backward (l. 409-411)
    trained_head = setup.method == "full" or head_facts(spec, setup).lm_head_saved
    w = dt.weight if trained_head else dt.frozen  # the head's weight as stored
    # a 16-bit tensor in the load dtype under the other 16-bit autocast (fp16 weights, bf16 autocast) is cast too
    other16 = dt.autocast and setup.dtype in ("bf16", "fp16") and setup.dtype != setup.autocast

    def cast(nbytes: int) -> bool:  # ``.to(compute_dtype)`` copies when the dtype differs (l. 329: compute_dtype)
        return nbytes != cd or (nbytes == 2 and other16)

    hidden_cast = round_alloc(tile * h * cd) if cast(rho) else 0  # hidden_chunk.to(compute_dtype), l. 352 / 420
    first, second = min(v, VOCAB_TILE), min(max(v - VOCAB_TILE, 0), VOCAB_TILE)
    # weight[start:end].to(compute_dtype): in forward a temporary of the mm (l. 356); in backward bound to ``w_chunk``
    # (l. 423), so the previous chunk's lives while the next is cast: two chunks at once
    weight_cast = round_alloc(first * h * cd) if cast(w) else 0
    weight_casts = weight_cast + (round_alloc(second * h * cd) if cast(w) else 0)
    loop = STATISTICS * round_alloc(4 * k) + buf + hidden_cast + weight_cast
    # after the loop (l. 378-383): log_z, then each output asked for beside the statistics, one fp32 temporary
    # (entropy's ``x_sum_exp / sum_exp``) and is_top1's two comparisons and their ``&``
    after = (STATISTICS + 2 + outputs) * round_alloc(4 * k) + buf + (3 * round_alloc(k) if top1 else 0)
    forward = max(loop, after) + round_alloc(16 * k)  # (CUDA's nonzero indices of the selection: K × 2 int64)
    if not grad:  # the kernel's inputs are freed when it returns
        forward += inputs
    grads = round_alloc(4 * k * h) + (round_alloc(4 * v * h) if trained_head else 0) + round_alloc(4 * k)
    # after the loop the last tile's buffers are still bound (mm_buf, hidden_chunk, w_chunk) while the return casts
    # grad_hidden to the hidden states' dtype and then grad_weight to the head's (l. 456-457), beside the fp32 ones
    last = v - VOCAB_TILE * ((v - 1) // VOCAB_TILE)
    last_cast = round_alloc(last * h * cd) if cast(w) else 0
    hidden_back = round_alloc(k * h * rho) if rho != 4 else 0
    weight_back = round_alloc(v * h * dt.weight) if trained_head and dt.weight != 4 else 0
    tail = grads + buf + hidden_cast + last_cast + hidden_back + weight_back
    backward = max(grads + buf + hidden_cast + weight_casts, tail)
    rows_h = round_alloc(p * h * rho) + round_alloc(rows * tokens * h * rho)  # index's, then the slice's, zeros
    backward = max(backward, round_alloc(k * h * rho) + rows_h)
    return FusedHead(
        kept=kept,
        forward_transient=forward,
        backward_transient=backward,
        hidden_states=round_alloc(rows * tokens * h * rho),
    )
