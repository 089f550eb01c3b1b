"""TRL's fused log-prob head, as GRPOTrainer runs it (trl 1.16.0): the per-token log-probabilities of the completion
tokens without the ``(batch, seq, vocab)`` logits.

``GRPOTrainer.__init__`` patches the policy (and a separate reference model) with ``add_fused_lm_head``
(grpo_trainer.py:1066-1077); ``_get_per_token_logps_and_entropies`` (grpo_trainer.py:1419-1508) calls the model with
``labels`` whose prompt part is -100 and ``fused_lm_head=True``. The patched forward (trainer/utils.py:1599-1697):

* runs the backbone; its final hidden states ``[b, s, h]`` (the final norm's output) live until the forward returns;
* on CUDA with Triton (``_use_triton``, kernels/chunked_logprob.py:48) keeps only the scored positions,
  ``hidden_states[mask]`` and ``labels[mask]``: a new ``[N, h]`` tensor and ``N`` int64 targets, ``N = b × C`` the
  completion tokens (every one scored: ``labels[:, :-logits_to_keep] = -100``, grpo_trainer.py:1493-1494);
* ``ChunkedLogProbFunction.forward`` (kernels/chunked_logprob.py:311-391): seven fp32 ``[N]`` running statistics and
  one ``[min(N, 4096), 32768]`` tile buffer in the compute dtype (``TOKEN_CHUNK_SIZE`` l.31,
  ``_CHUNKED_LOGPROB_CHUNK_SIZE`` utils.py:1506); the Triton kernel folds each tile in place, so no ``[N, V]`` tensor
  and no fp32 logits ever exist; it saves ``hidden``, ``targets``, ``log_z`` and the entropy (fp32 ``[N]``);
* its backward (l.393-465): fp32 ``grad_hidden [N, h]`` and, when the lm_head trains, fp32 ``grad_weight [V, h]``,
  the tile buffer, then both cast to the inputs' dtypes while the fp32 ones are still referenced;
* then ``hidden_states[mask]``'s backward scatters ``grad_hidden`` into zeros ``[b, s - 1, h]`` and the slice
  ``[:, :-1]``'s backward into zeros ``[b, s, h]``.

The chunking knobs are not GRPOConfig fields: 4,096 tokens x 32,768 vocabulary entries per tile are the kernel's
constants; the rows per forward are ``per_device_train_batch_size`` (``batch``) for the no-grad passes
(grpo_trainer.py:2505, ``batch_size``) and the whole micro-batch for the policy's forward (l.3030).
"""

from __future__ import annotations

from cabe.activations.terms import HeadActivations
from cabe.architecture import ModelSpec
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc

#: kernels/chunked_logprob.py:31, ``TOKEN_CHUNK_SIZE``: tokens per projection tile
TOKEN_CHUNK = 4096
#: trainer/utils.py:1506, ``_CHUNKED_LOGPROB_CHUNK_SIZE``: vocabulary entries per projection tile
VOCAB_CHUNK = 32768
#: fp32 ``[N]`` running statistics of the forward (chunked_logprob.py:340-346)
STATS = 7


def scored_tokens(setup: TrainingSetup) -> int:
    """``N``: the completion tokens of a micro-batch the head scores (the label of every completion position)."""
    return setup.batch * min(setup.max_completion_length, setup.tokens_per_sequence - 1)


def tile_bytes(spec: ModelSpec, n: int, compute: int) -> int:
    """The ``mm_buf`` tile: ``[min(N, 4096), min(V, 32768)]`` in the compute dtype."""
    return round_alloc(min(n, TOKEN_CHUNK) * min(spec.vocab_size, VOCAB_CHUNK) * compute)


def fused_head(final_norm: int, spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> HeadActivations:
    """The head of a GRPO policy step: ``final_norm`` is what the final norm saves per token (without the lm_head's
    saved input, which this head does not keep); the completion-scaled bytes are fixed terms (``N`` of
    :func:`scored_tokens`), the sequence-scaled ones per token."""
    h, v, rho, a = spec.hidden_size, spec.vocab_size, dt.residual, dt.compute
    n = scored_tokens(setup)
    tokens = setup.batch * setup.tokens_per_sequence
    trains_head = setup.method == "full"  # the lm_head (or the tied embedding) trains: grad_weight
    tile = tile_bytes(spec, n, a)
    # ``weight[start:end].to(compute_dtype)`` and ``hidden[...].to(compute_dtype)``: copies when they differ
    w_copy = round_alloc(min(v, VOCAB_CHUNK) * h * a) if dt.weight_copies else 0
    h_copy = round_alloc(min(n, TOKEN_CHUNK) * h * a) if rho != a else 0
    saved = round_alloc(n * rho * h) + round_alloc(8 * n) + 2 * round_alloc(4 * n)  # hidden, targets, log_z, entropy
    forward = (
        STATS * round_alloc(4 * n) + tile + w_copy + h_copy + 2 * round_alloc(4 * n)  # log-probs and entropy
    )
    grad_w = (round_alloc(4 * v * h) + round_alloc(dt.weight * v * h)) if trains_head else 0
    fused_back = round_alloc(4 * n * h) + round_alloc(rho * n * h) + tile + w_copy + h_copy + grad_w
    # hidden_states[mask]'s backward (zeros [b, s-1, h]) beside its input; then the slice's (zeros [b, s, h])
    index_back = max(round_alloc(rho * n * h), round_alloc(rho * h * (tokens - setup.batch))) + round_alloc(
        rho * h * tokens
    )
    return HeadActivations(
        final_norm=final_norm,
        logits=0,
        # the labels' mask ``labels != -100`` (bool, [b, s-1]), kept by the scatter's and the index's backward
        saved_logsoftmax=1,
        # the final hidden states, alive until the patched forward returns
        forward_peak_extra=rho * h,
        backward_peak_extra=0,
        forward_fixed=saved + forward,
        backward_fixed=saved + max(fused_back, index_back - saved),
    )
