"""SGLang's memory accounting at startup, from its source (sgl-project/sglang, python/sglang/srt).

1. ``ServerArgs._handle_gpu_memory_settings`` (server_args.py, the heuristic of PR #10975, SGLang 0.5.4+): when
   ``--mem-fraction-static`` is not given, ``reserved_mem`` (MiB) = 512 (attention backends' metadata)
   + max(chunked_prefill_size, 2048) × 1.5 (activations) + cuda_graph_max_bs × 2 (CUDA graphs)
   + tp × pp / 8 × 1024 (parallelism), at least 10 GiB on a card over 60 GiB, and
   ``mem_fraction_static = round((gpu_mem - reserved_mem) / gpu_mem, 3)``. ``chunked_prefill_size`` defaults to
   2048 under 35 GiB, 8192 under 160 GiB, 16384 above; ``cuda_graph_max_bs`` by the card as well.
2. ``ModelRunner.profile_max_num_token`` (model_executor/model_runner.py): ``total_gpu_memory`` is the free memory
   before the weights load; after it, ``rest_memory = available_gpu_memory - total_gpu_memory × (1 -
   mem_fraction_static)`` and ``max_total_num_tokens = rest_memory // cell_size`` with ``cell_size = kv_heads_per_rank ×
   head_dim × num_layers × 2 × dtype bytes`` (MLA: (kv_lora_rank + qk_rope_head_dim) × num_layers × dtype bytes).
   So the KV pool is free_before × mem_fraction_static - weights: the activations, CUDA graphs and the rest live in
   free_before × (1 - mem_fraction_static).
3. Sliding-window models (``ModelRunner.set_num_token_hybrid``): the per-layer token count × num_layers is split
   into a full pool and a SWA pool with ``swa_max = full_max × swa_full_tokens_ratio`` (default 0.8):
   ``full_max = total_tokens / (ratio × swa_layers + full_layers)``.
4. ``MHATokenToKVPool`` (mem_cache/memory_pool.py) allocates K and V buffers of (size + page_size) rows per layer and
   logs "KV Cache is allocated. #tokens: N, K size: X GB, V size: X GB" (GB = 2^30 bytes); ``ReqToTokenPool`` holds an
   int32 row of context_len + 4 slots per running request (max_running_requests from the token count).
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.engines.share import Share
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu
from cabe.kv_cache import kv_dtype_bytes, latent_token_elements
from cabe.training import number
from cabe.weights import weights_bytes

MIB = 1 << 20
GIB = 1 << 30
#: server_args.py ``swa_full_tokens_ratio`` default
SWA_FULL_TOKENS_RATIO = 0.8
#: model_runner.py ``init_memory_pool``: ``max_num_reqs = min(max(int(tokens / context_len × 512), 2048), 4096)``
REQS_PER_CONTEXT, MIN_REQS, MAX_REQS = 512, 2048, 4096


def defaults(card: Gpu, tp: int = 1, pp: int = 1) -> dict[str, Any]:
    """``chunked_prefill_size``, ``cuda_graph_max_bs`` and the ``mem_fraction_static`` SGLang picks for ``card``."""
    gpu_mem = card.memory_bytes / MIB
    if gpu_mem < 35 * 1024:  # A10, L40, 4090
        chunk, graphs = 2048, 24
    elif gpu_mem < 160 * 1024:  # H100, H200, A100
        chunk, graphs = 8192, 256
    else:  # B200, MI300
        chunk, graphs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + tp * pp / 8 * 1024
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return {
        "chunked_prefill_size": chunk,
        "cuda_graph_max_bs": graphs,
        "reserved_mib": reserved,
        "mem_fraction_static": round((gpu_mem - reserved) / gpu_mem, 3),
    }


def cell_bytes(spec: ModelSpec, kv_dtype: str, tp: int = 1) -> float:
    """One token of every attention layer: K and V (or MLA's latent and rotary key), per tensor-parallel rank."""
    layers = sum(g.count for g in spec.layer_groups if g.mixer == "attention")
    b = kv_dtype_bytes(kv_dtype)
    if spec.latent_attention:
        return latent_token_elements(spec) * layers * b
    return max(1, spec.num_kv_heads // tp) * spec.head_dim * layers * 2 * b


def serving(
    spec: ModelSpec,
    card: Gpu,
    *,
    weights: str = "auto",
    kv_dtype: str = "fp16",
    context: int = 4096,
    mem_fraction_static: float | None = None,
    group_size: int = 128,
    tp: int = 1,
    share: Share | None = None,
) -> dict[str, Any]:
    """SGLang's token pool on ``card`` (one tensor-parallel rank when ``tp`` > 1) and the sequences of ``context``
    tokens it holds at once. ``share`` (:func:`cabe.serving_parallel.per_gpu`): the GPU's weights and stage layers,
    and its communication buffers, allocated when the process groups start (``ModelRunner.init_torch_distributed``),
    before ``total_gpu_memory`` is read: they are not in the free memory the fraction applies to."""
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= 1 << 24:
        raise InvalidValueError("out_of_range", "context", value=context, minimum=1, maximum=1 << 24)
    auto = defaults(card, tp)
    mfs = auto["mem_fraction_static"] if mem_fraction_static is None else mem_fraction_static
    mfs = number("mem_fraction_static", mfs, minimum=0.0, maximum=1.0, strict=True)
    # total_gpu_memory: free before the weights load, after the process groups' buffers
    free_before = (
        card.memory_bytes - card.cuda_context_bytes - (share.non_torch_bytes + share.torch_bytes if share else 0)
    )
    w = weights_bytes(spec, weights, group_size)["total_bytes"] // tp if share is None else share.weights_bytes
    rest = free_before - w - free_before * (1 - mfs)
    cell = cell_bytes(spec, kv_dtype, tp)
    if share is not None:  # a pipeline stage's pool holds its own layers' K and V
        cell = cell * share.layers / share.total_layers
    tokens = max(int(rest // cell), 0) if cell else 0
    out: dict[str, Any] = {
        "engine": "sglang",
        "gpu": card.name,
        "tp": tp,
        "mem_fraction_static": mfs,
        "mem_fraction_static_auto": mem_fraction_static is None,
        "chunked_prefill_size": auto["chunked_prefill_size"],
        "cuda_graph_max_bs": auto["cuda_graph_max_bs"],
        "free_before_weights_bytes": free_before,
        "weights_bytes": w,
        "headroom_bytes": round(free_before * (1 - mfs)),
        "kv_pool_bytes": max(round(rest), 0),
        "cell_bytes": cell,
        "context": context,
        "kv_dtype": kv_dtype,
        "weights_format": weights,
        "max_total_num_tokens": tokens,
    }
    full = tokens
    swa_layers = spec.sliding_layers
    if swa_layers:  # set_num_token_hybrid: the same bytes as tokens × num_layers, split between the two pools
        full_layers = sum(g.count for g in spec.layer_groups if g.mixer == "attention") - swa_layers
        total = tokens * (full_layers + swa_layers)
        full = int(total / (SWA_FULL_TOKENS_RATIO * swa_layers + full_layers))
        out["swa_max_total_num_tokens"] = int(full * SWA_FULL_TOKENS_RATIO)
        out["full_max_total_num_tokens"] = full
    per_layer = cell / max(1, sum(g.count for g in spec.layer_groups if g.mixer == "attention"))
    half = 1 if spec.latent_attention else 2
    out["k_size_gib"] = round(tokens * per_layer / half * _attn_layers(spec) / GIB, 2)
    reqs = min(max(int(full / max(spec.max_positions or context, 1) * REQS_PER_CONTEXT), MIN_REQS), MAX_REQS)
    out["max_running_requests"] = reqs
    out["req_to_token_bytes"] = (reqs + 1) * ((spec.max_positions or context) + 4) * 4
    out["max_concurrent_sequences"] = full // context
    if swa_layers and spec.sliding_window:  # a sequence holds min(context, window) SWA tokens
        out["max_concurrent_sequences"] = min(
            full // context, out["swa_max_total_num_tokens"] // min(context, spec.sliding_window)
        )
    out["max_context"] = min(full, spec.max_positions or full)
    out["fits"] = out["max_concurrent_sequences"] >= 1
    return out


def _attn_layers(spec: ModelSpec) -> int:
    return sum(g.count for g in spec.layer_groups if g.mixer == "attention")
