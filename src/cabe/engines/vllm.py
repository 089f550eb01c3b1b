"""vLLM's memory accounting at startup (the v1 engine), from its source.

What vLLM does when it starts (vllm-project/vllm, v1 engine, 0.10-0.11 line; files and functions named):

1. ``Worker.init_device`` (vllm/v1/worker/gpu_worker.py) takes a ``MemorySnapshot`` after the CUDA context and the
   distributed environment exist and sets ``requested_memory = total_memory × gpu_memory_utilization``.
2. ``Worker.determine_available_memory`` runs ``GPUModelRunner.profile_run`` inside ``memory_profiling``
   (vllm/utils/mem_utils.py): one dummy forward of ``max_num_batched_tokens`` tokens spread over
   ``min(max_num_seqs, tokens)`` requests, then ``_dummy_sampler_run`` on the last token of each request (temperature
   0.5, top-p 0.9, top-k vocab - 1: the sort path). ``non_kv_cache_memory = weights + torch_peak_increase +
   non_torch_increase``; ``available_kv_cache_memory = requested_memory - non_kv_cache_memory``. CUDA graphs are
   captured after the KV cache is allocated (``compile_or_warm_up_model`` -> ``capture_model``), inside the
   ``1 - gpu_memory_utilization`` headroom: not subtracted here (newer releases can subtract a profiled estimate when
   ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is set; not modelled).
3. ``get_kv_cache_spec`` gives every layer a spec: ``FullAttentionSpec`` (page = block_size × kv_heads × head_size × 2 ×
   dtype bytes), ``MLAAttentionSpec`` (one latent "head" of kv_lora_rank + rope dim, no ×2), ``SlidingWindowSpec``,
   ``ChunkedLocalAttentionSpec``, ``MambaSpec`` (one page holds a sequence's whole state).
4. vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``: layers with equal specs are split into
   groups of ``group_size`` layers (the smallest count of layers of one spec; the largest count when it is under
   1.25 × the smallest), the last group of a kind padded; ``get_kv_cache_config_from_groups`` makes ``group_size``
   tensors, each shared by one layer of every group: ``num_blocks = available // page_size // group_size``.
   Hybrid attention + Mamba models first raise the attention block size until an attention page holds a Mamba state
   (``HybridAttentionMambaModelConfig.verify_and_update_config``, vllm/model_executor/models/config.py; a multiple of
   16 tokens) and pad the Mamba page to it.
5. ``_report_kv_cache_config``: "GPU KV cache size: num_blocks // len(groups) × block_size tokens" and
   ``get_max_concurrency_for_kv_cache_config``: "Maximum concurrency for L tokens per request: num_blocks /
   cdiv(group_size × Σ_groups max_memory_usage_bytes(L), group_size × page)"; a full-attention group needs
   cdiv(L, block) blocks, a sliding one cdiv(min(window - 1 + max_num_batched_tokens, L), block) + 1
   (``SlidingWindowSpec.max_memory_usage_bytes``), a Mamba one a single block.

Pure Python, no torch; nothing from :mod:`cabe.inference` (which re-exports :func:`serving`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from cabe import linear_attention
from cabe.architecture import ModelSpec
from cabe.engines.share import Share
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu
from cabe.kv_cache import kv_cache_bytes, kv_dtype_bytes, per_layer_token_bytes
from cabe.search import largest
from cabe.training import number
from cabe.vision.serving import vision_forward_bytes
from cabe.weights import weights_bytes

BLOCK_SIZE = 16
#: vllm/v1/core/kv_cache_utils.py ``_get_kv_cache_groups_uniform_page_size``: max < 1.25 × min -> group by the max
GROUP_BALANCE = 1.25
#: the attention kernels' block alignment a hybrid model's attention block size is rounded up to
#: (``HybridAttentionMambaModelConfig``: ``kernel_block_alignment_size = 16`` for FlashAttention)
HYBRID_BLOCK_ALIGNMENT = 16
#: bytes of one Mamba / linear-attention state element in vLLM: the model's 16-bit dtype (``_state_per_layer``)
STATE_BYTES = 2
#: vllm/model_executor/layers/fused_moe/fused_moe.py ``fused_experts_impl``: tokens are processed in chunks of
#: ``VLLM_FUSED_MOE_CHUNK_SIZE`` (default 32768, vllm/envs.py)
FUSED_MOE_CHUNK = 32768
#: bytes per (request, vocabulary entry) at the sampler's peak, vllm/v1/sample/sampler.py ``Sampler.forward`` and
#: ops/topk_topp_sampler.py ``apply_top_k_top_p`` (native path): the bf16 logits (2), their float32 copy (4),
#: ``logits.sort`` values (4) and int64 indices (8), ``probs_sort = logits_sort.softmax`` (4; the cumsum writes into
#: it) and the bool top-p mask (1)
SAMPLER_BYTES_PER_LOGIT = 2 + 4 + 4 + 8 + 4 + 1


@dataclass(frozen=True)
class Kind:
    """Layers of one KV cache spec: ``kind`` full | sliding | chunked | mla | mamba; ``window`` for the local kinds;
    ``page`` bytes of one block of one layer; ``block`` its tokens."""

    kind: str
    layers: int
    page: int
    block: int
    window: int = 0


def kv_kinds(spec: ModelSpec, kv_dtype: str, block_size: int, tp: int = 1) -> list[Kind]:
    """The layers grouped by their spec, as ``GPUModelRunner.get_kv_cache_spec`` makes them (per tensor-parallel
    rank: KV heads split over ``tp``, replicated when fewer, vllm/config ``get_num_kv_heads``)."""
    dtype = kv_dtype_bytes(kv_dtype)
    if spec.latent_attention:
        per_token = per_layer_token_bytes(spec, kv_dtype)  # the latent and rotary key: not split by TP
    else:
        per_token = 2 * max(1, spec.num_kv_heads // tp) * spec.head_dim * dtype
    by: dict[tuple[str, int], int] = {}
    states: int = 0
    for g in spec.layer_groups:
        if g.mixer != "attention":
            states += g.count
            continue
        kind = "mla" if spec.latent_attention else ("full" if g.attention == "full" else g.attention)
        window = g.window or 0 if kind in ("sliding", "chunked") else 0
        by[(kind, window)] = by.get((kind, window), 0) + g.count
    block = block_size
    page = round(block * per_token)
    out: list[Kind] = []
    if states:  # Mamba-2 / gated DeltaNet layers: one page holds a sequence's conv + recurrent state
        state = _state_per_layer(spec)
        if by:
            block = HYBRID_BLOCK_ALIGNMENT * math.ceil(state / (HYBRID_BLOCK_ALIGNMENT * per_token))
            block = max(block, block_size)
            page = round(block * per_token)
        out.append(Kind("mamba", states, max(page, state) if by else state, block))
    for (kind, window), n in by.items():
        out.append(Kind(kind, n, page, block, window))
    return out


def _state_per_layer(spec: ModelSpec) -> int:
    """One sequence's conv + SSM (recurrent) state in one Mamba-2 / gated DeltaNet layer, both in the model's
    16-bit dtype: vllm/model_executor/layers/mamba/mamba_utils.py ``MambaStateDtypeCalculator`` with
    ``mamba_ssm_cache_dtype`` "auto" (the default) takes the model dtype for the conv and the SSM state."""
    per = []
    if spec.mamba2 and any(g.mixer == "mamba2" for g in spec.layer_groups):
        per.append((spec.mamba2.conv_state_elements + spec.mamba2.ssm_state_elements) * STATE_BYTES)
    dn = spec.gated_deltanet
    if dn and linear_attention.linear_layers(spec):
        per.append((dn.conv_state_elements + dn.recurrent_state_elements) * STATE_BYTES)
    return max(per) if per else 0


def group_size(kinds: list[Kind]) -> int:
    """Layers per KV cache group (``_get_kv_cache_groups_uniform_page_size``)."""
    counts = [k.layers for k in kinds]
    lo, hi = min(counts), max(counts)
    return hi if hi < lo * GROUP_BALANCE else lo


def groups(kinds: list[Kind]) -> list[Kind]:
    """One entry per KV cache group: each kind cut into ``cdiv(layers, group_size)`` groups."""
    size = group_size(kinds)
    return [k for k in kinds for _ in range(-(-k.layers // size))]


def blocks_per_request(kinds: list[Kind], length: int, max_num_batched_tokens: int) -> int:
    """Blocks (of every layer of a group at once) one request of ``length`` tokens needs at most
    (``get_max_concurrency_for_kv_cache_config``)."""
    total = 0
    for k in groups(kinds):
        if k.kind == "mamba":
            total += 1
        elif k.kind in ("sliding", "chunked"):
            total += -(-min(k.window - 1 + max_num_batched_tokens, length) // k.block) + 1
        else:
            total += -(-length // k.block)
    return total


def profile_bytes(spec: ModelSpec, tokens: int, requests: int, tp: int = 1) -> dict[str, int]:
    """The torch peak increase of ``profile_run``: the larger of the forward's largest layer over ``tokens`` tokens
    and the sampler over ``requests`` rows (the forward's hidden states still held).

    Dense layer (vllm/model_executor/models/llama.py ``LlamaMLP``): the residual and hidden states (2h), then
    ``gate_up_proj``'s [t, 2f] output beside ``SiluAndMul``'s [t, f]; attention: ``qkv_proj``'s [t, q + 2kv] and the
    attention output [t, q]. MoE layer (``fused_experts_impl``): router logits [t, E], ``intermediate_cache1/3`` sharing
    one [M·k, max(2I, h)] buffer, ``intermediate_cache2`` [M·k, I] (M = min(t, 32768)) and the [t, h] output. Widths
    per tensor-parallel rank (÷ tp)."""
    a = 2
    h = spec.hidden_size
    kv_heads = spec.num_kv_heads if tp == 1 else max(1, spec.num_kv_heads // tp)
    attn = 2 * spec.q_dim // tp + 2 * kv_heads * spec.head_dim
    layer = 0
    for g in spec.layer_groups:
        f = spec.ffn_size(g) // tp
        if g.mlp == "moe" and spec.num_experts:
            k, m = spec.experts_per_token or 1, min(tokens, FUSED_MOE_CHUNK)
            mlp = tokens * a * (spec.num_experts + h) + m * k * a * (max(2 * f, h) + f)
        else:
            mlp = tokens * a * 3 * f
        mixer = tokens * a * attn
        if g.mixer == "mamba2" and spec.mamba2:
            mm = spec.mamba2
            mixer = tokens * a * (mm.in_proj_width + mm.conv_dim + 2 * mm.d_inner) // tp
        layer = max(layer, tokens * a * 2 * h + max(mixer, mlp))
    # the logits are gathered whole on every rank before sampling (``LogitsProcessor._gather_logits``): not ÷ tp
    sampler = tokens * a * h + requests * a * h + requests * spec.vocab_size * SAMPLER_BYTES_PER_LOGIT
    out = {"forward": layer, "sampler": sampler}
    enc = encoder_profile(spec, tokens)
    if enc:  # the encoder's outputs stay in the encoder cache through the decoder's dummy run
        out.update(enc)
        out["forward"] += enc["encoder_outputs"]
        out["sampler"] += enc["encoder_outputs"]
    out["peak"] = max(out["forward"], out["sampler"], out.get("encoder", 0))
    return out


def encoder_profile(spec: ModelSpec, tokens: int) -> dict[str, int]:
    """A multimodal model's encoder in ``profile_run`` (vllm/v1/worker/gpu_model_runner.py): a dummy batch of the
    modality with the most tokens per item, ``max(1, encoder_compute_budget // max_tokens_per_item)`` images of the
    largest size the processor keeps (``encoder_compute_budget = max(max_num_batched_tokens, max_tokens_per_item)``,
    vllm/v1/core/encoder_cache_manager.py ``compute_encoder_budget``), run through the tower; its outputs are cached
    (``self.encoder_cache``) while the decoder's dummy run follows. Empty without a vision tower."""
    tower = spec.vision
    if tower is None:
        return {}
    if tower.kind == "siglip":  # every image resized to the square: tokens_per_image soft tokens
        patches = (tower.image_size // tower.patch_size) ** 2
        per_item = tower.tokens_per_image
    else:  # Qwen's smart_resize keeps at most max_pixels: that many pixels in patches, merge_size² per token
        patches = tower.max_pixels // tower.patch_size**2
        per_item = patches // tower.merge_size**2
    items = max(1, max(tokens, per_item) // per_item)
    return {
        "encoder_items": items,
        "encoder": vision_forward_bytes(tower, items * patches),
        "encoder_outputs": items * per_item * spec.hidden_size * 2,
    }


def batch_defaults(card: Gpu) -> tuple[int, int]:
    """``vllm serve``'s ``max_num_batched_tokens`` and ``max_num_seqs`` for ``card``
    (vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults``, ``UsageContext.OPENAI_API_SERVER``): 8192 and 1024
    on a card of 70 GiB or more that is not an A100, else 2048 and 256."""
    if card.memory_bytes >= 70 * (1 << 30) and "a100" not in card.name:
        return 8192, 1024
    return 2048, 256


def serving(
    spec: ModelSpec,
    card: Gpu,
    *,
    weights: str = "auto",
    kv_dtype: str = "fp16",
    context: int = 4096,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int = BLOCK_SIZE,
    group_size: int = 128,
    tp: int = 1,
    share: Share | None = None,
) -> dict[str, Any]:
    """vLLM's KV pool on ``card``: budget, profile, KV cache groups, blocks, tokens and concurrency at ``context``
    (``max_num_batched_tokens`` / ``max_num_seqs`` not given: ``vllm serve``'s defaults for the card).

    Non-torch memory is taken as the card's CUDA context (``Gpu.cuda_context_bytes``): vLLM 0.6 took its baseline
    before the context existed, so the context was in ``non_torch_increase`` (1.79 GiB with it in PR #10511's log);
    since the snapshot moved after ``init_device`` the context is outside the budget and the increase is the cuBLAS
    workspace, attention backends' buffers and, with TP, NCCL's.

    ``tp`` > 1: one rank of a tensor-parallel replica (KV heads ÷ tp, or replicated when fewer). ``share`` (from
    :func:`cabe.serving_parallel.per_gpu`): that GPU's weights and stage layers, and its communication buffers: NCCL's
    and the custom all-reduce's IPC buffers are non-torch memory (``non_torch_increase``), the custom all-reduce's
    registered buffer is allocated through PyTorch before the profile (torch peak). Without ``share`` a rank's weights
    are the whole model's ÷ tp and no buffer is counted.
    """
    util = number("gpu_memory_utilization", gpu_memory_utilization, minimum=0.0, maximum=1.0, strict=True)
    tokens_default, seqs_default = batch_defaults(card)
    max_num_batched_tokens = tokens_default if max_num_batched_tokens is None else max_num_batched_tokens
    max_num_seqs = seqs_default if max_num_seqs is None else max_num_seqs
    for name, v in (
        ("context", context),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_num_seqs", max_num_seqs),
        ("block_size", block_size),
        ("tp", tp),
    ):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidValueError("not_integer", name, value=v)
        if v < 1 or v > (1 << 24):
            raise InvalidValueError("out_of_range", name, value=v, minimum=1, maximum=1 << 24)
    w = weights_bytes(spec, weights, group_size)["total_bytes"] // tp if share is None else share.weights_bytes
    requests = min(max_num_seqs, max_num_batched_tokens)
    prof = profile_bytes(spec, max_num_batched_tokens, requests, tp)
    budget = util * card.memory_bytes
    non_torch = card.cuda_context_bytes + (share.non_torch_bytes if share else 0)
    pool = int(budget - w - prof["peak"] - non_torch - (share.torch_bytes if share else 0))
    kinds = kv_kinds(spec, kv_dtype, block_size, tp)
    if share is not None:  # the stage's layers only (each pipeline stage's worker has its own pool)
        kinds = [replace(k, layers=share.layer_count(k.layers)) for k in kinds]
    out: dict[str, Any] = {
        "engine": "vllm",
        "gpu": card.name,
        "tp": tp,
        "gpu_memory_utilization": util,
        "budget_bytes": round(budget),
        "weights_bytes": w,
        "activation_profile_bytes": prof["peak"],
        "profile": prof,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "non_torch_bytes": non_torch,
        "comm_torch_bytes": share.torch_bytes if share else 0,
        "kv_pool_bytes": max(pool, 0),
        "block_size": kinds[0].block if kinds else block_size,
        "context": context,
        "kv_dtype": kv_dtype,
        "weights_format": weights,
        "kv_cache_groups": [
            {"kind": k.kind, "layers": k.layers, "window": k.window, "page_bytes": k.page} for k in kinds
        ],
    }
    if spec.compressed_attention or not kinds:  # DeepSeek-V4: bytes per sequence (cabe.compressed_attention)
        return _by_bytes(out, spec, kv_dtype, pool, context)
    size = group_size_of(kinds)
    n_groups = len(groups(kinds))
    page = max(k.page for k in kinds)
    out["group_size"] = size
    out["num_groups"] = n_groups
    out["block_bytes"] = page * size  # one block of every layer of a group: the unit num_blocks counts
    if pool <= 0:
        out.update(
            {"fits": False, "max_concurrent_sequences": 0, "max_context": 0, "total_blocks": 0, "kv_cache_tokens": 0}
        )
        return out
    num_blocks = pool // page // size
    per_request = blocks_per_request(kinds, context, max_num_batched_tokens)
    out["total_blocks"] = num_blocks
    out["kv_cache_tokens"] = num_blocks // n_groups * min(k.block for k in kinds)
    out["blocks_per_sequence"] = per_request
    out["bytes_per_sequence"] = per_request * page * size
    out["max_concurrency"] = num_blocks / per_request
    out["max_concurrent_sequences"] = int(num_blocks // per_request)
    cap = spec.max_positions or (1 << 24)
    out["max_context"] = largest(lambda n: blocks_per_request(kinds, n, max_num_batched_tokens) <= num_blocks, cap)
    out["max_context_capped"] = out["max_context"] >= cap
    out["fits"] = out["max_concurrent_sequences"] >= 1
    return out


group_size_of = group_size  # the name ``serving`` reads (its keyword ``group_size`` is the weights' quantization)


def _by_bytes(out: dict[str, Any], spec: ModelSpec, kv_dtype: str, pool: int, context: int) -> dict[str, Any]:
    def seq(n: int) -> int:
        return kv_cache_bytes(spec, n, 1, kv_dtype)

    if pool <= 0:
        out.update({"fits": False, "max_concurrent_sequences": 0, "max_context": 0, "total_blocks": 0})
        return out
    out["bytes_per_sequence"] = seq(context)
    out["max_concurrent_sequences"] = int(pool // seq(context))
    out["max_concurrency"] = pool / seq(context)
    cap = spec.max_positions or (1 << 24)
    out["max_context"] = largest(lambda n: seq(n) <= pool, cap)
    out["max_context_capped"] = out["max_context"] >= cap
    out["fits"] = out["max_concurrent_sequences"] >= 1
    return out
