"""The KV cache: 2 (K and V) × layers × kv_heads × head_dim × tokens × bytes per element.

GQA and MQA are in ``num_kv_heads`` (Llama-3.1-8B: 8 KV heads for 32 query heads; MQA: 1).
State-space layers (Granite-4.0-H's Mamba-2 mixers) keep no KV cache: a fixed state per sequence instead
(:func:`cabe.ssm.state_bytes_per_sequence`). Sliding-window layers (Mistral-7B-v0.1, Gemma 2/3) keep at most ``sliding_window`` tokens: a
serving engine with a sliding-window-aware cache (vLLM's hybrid allocator, HF's
``HybridCache``) caps those layers at the window; the global layers grow with the context.
"""

from __future__ import annotations

from cabe import compressed_attention, linear_attention
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.layers import LayerGroup

#: bytes per cached element
KV_CHOICES = ("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4")  # the field's choices
KV_DTYPES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "int4": 0.5,
}


#: ``kv_dtype="auto"``: the cache in the dtype the model computes in, as transformers' caches keep it (the keys and
#: values the attention made) and vLLM's ``kv_cache_dtype="auto"`` (the model dtype); quantized weight formats
#: compute in 16-bit
AUTO = "auto"
_COMPUTE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}


def resolve_kv_dtype(kv_dtype: str, weights_format: str) -> str:
    """``auto`` as the weights' compute dtype (bf16 for a quantized format); any other choice as given (checked)."""
    if kv_dtype == AUTO:
        return _COMPUTE.get(weights_format, "bf16")
    kv_dtype_bytes(kv_dtype)
    return kv_dtype


def kv_dtype_bytes(kv_dtype: str) -> float:
    if kv_dtype not in KV_DTYPES:
        allowed = ", ".join((AUTO, *KV_DTYPES))
        raise InvalidValueError("bad_choice", "kv_dtype", value=kv_dtype, allowed=allowed)
    return KV_DTYPES[kv_dtype]


def per_layer_token_bytes(spec: ModelSpec, kv_dtype: str = "fp16") -> float:
    """K and V of one token in one layer: 2 × kv_heads × head_dim × bytes; with multi-head latent attention,
    the latent and the rotary key: (kv_lora_rank + rope_dim) × bytes (see :func:`latent_token_elements`)."""
    if spec.latent_attention:
        return latent_token_elements(spec) * kv_dtype_bytes(kv_dtype)
    return 2 * spec.num_kv_heads * spec.head_dim * kv_dtype_bytes(kv_dtype)


def latent_token_elements(spec: ModelSpec) -> int:
    """Cached elements per token per layer of multi-head latent attention: the normalised kv latent and the
    rotated shared key, not the per-head keys and values. transformers 5.24 (models/deepseek_v3/
    modeling_deepseek_v3.py, ``DeepseekV3Attention.forward``) calls ``cache.update(kv_nope, k_rot, ...)``
    with (b, 1, s, kv_lora_rank) and (b, 1, s, rope_dim) before ``expand_kv``; vLLM caches the same ``kv_c_normed``
    and ``k_pe``: ``MLAAttention`` sets ``head_size = kv_lora_rank + qk_rope_head_dim`` and ``num_kv_heads = 1``
    (vllm/model_executor/layers/attention/mla_attention.py, vllm-project/vllm@0014ca6). DeepSeek-V3: 512 + 64 =
    576 per token and layer, against 2 × 128 heads × 192 = 49,152 for the expanded k and v. (vLLM's
    ``fp8_ds_mla`` format, 656 B per token and layer with its scales and a bf16 rotary key, is not modelled.)
    DeepSeek-V3.2 adds its indexer's key, ``index_head_dim`` per token and layer (``DynamicIndexedLayer``):
    576 + 128 = 704, cached in the same dtype here (vLLM's fp8 indexer cache adds per-block scales, not modelled)."""
    la = spec.latent_attention
    return la.cache_width if la else 2 * spec.num_kv_heads * spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "fp16") -> float:
    """Every attention layer's K and V for one token (while the context is within every window); Mamba-2 and
    linear-attention layers cache no tokens (:mod:`cabe.ssm`, :func:`cabe.linear_attention.state_bytes`)."""
    return spec.attention_layers * per_layer_token_bytes(spec, kv_dtype)


def cached_layers(spec: ModelSpec) -> int:
    """Layers that keep a KV cache: every layer but the Mamba-2 and linear-attention ones."""
    return spec.attention_layers


def kv_cache_bytes(
    spec: ModelSpec, context: int, batch: int = 1, kv_dtype: str = "fp16", cap_sliding: bool = True
) -> int:
    """KV cache of ``batch`` sequences of ``context`` tokens each; sliding layers capped at the window."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise InvalidValueError(
            "not_integer" if not isinstance(context, int) else "out_of_range",
            "context",
            value=context,
            minimum=0,
            maximum=1 << 24,
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise InvalidValueError("out_of_range", "batch", value=batch, minimum=1, maximum=1 << 20)
    if spec.compressed_attention:  # DeepSeek-V4: windows, compressed entries, open windows (cabe.compressed_attention)
        return compressed_attention.kv_cache_bytes(spec, context, batch, kv_dtype_bytes(kv_dtype))
    per = per_layer_token_bytes(spec, kv_dtype)
    tokens = sum(
        g.count * (attended(g, context) if cap_sliding else context)
        for g in spec.layer_groups
        if g.mixer == "attention"  # a Mamba-2 layer keeps a fixed state instead (cabe.ssm)
    )
    # linear-attention layers keep a fixed state per sequence instead (cabe.linear_attention)
    return round(batch * per * tokens) + batch * linear_attention.state_bytes(spec)


def attended(group: LayerGroup, context: int) -> int:
    """Tokens one layer of ``group`` keeps of a ``context``-token sequence: all of them, or the window. Chunked
    layers (Llama 4) keep at most their chunk: transformers caches them in a ``DynamicSlidingWindowLayer`` of
    ``attention_chunk_size`` (cache_utils.py 5.24, ``LAYER_TYPE_CACHE_MAPPING``: "sliding and chunked are the same
    in how they should behave, only the mask differs"); a token attends at most its chunk. A linear-attention layer
    (gated DeltaNet) keeps no token: its fixed state is counted per sequence (cabe.linear_attention)."""
    if group.mixer != "attention":
        return 0
    if group.attention in ("sliding", "chunked") and group.window:
        return min(context, group.window)
    return context


def breakdown(spec: ModelSpec, context: int, batch: int, kv_dtype: str) -> dict[str, object]:
    per = per_layer_token_bytes(spec, kv_dtype)
    sliding = spec.sliding_layers if spec.sliding_window else 0
    if spec.compressed_attention:  # DeepSeek-V4: not linear in the context; the mean over this context's tokens
        per = kv_cache_bytes(spec, context, 1, kv_dtype) / max(1, context) / spec.num_layers
    out: dict[str, object] = {
        "bytes_per_token_per_layer": per,
        "bytes_per_token": per * spec.attention_layers,
        "full_layers": spec.attention_layers - sliding,
        "sliding_layers": sliding,
        "sliding_window": spec.sliding_window,
        "formula": _formula(spec, kv_dtype),
        "total_bytes": kv_cache_bytes(spec, context, batch, kv_dtype),
    }
    if spec.gated_deltanet is not None:  # Mamba-2 layers' states: cabe.ssm, a component of their own
        out.update(linear_attention.state_breakdown(spec, batch))
    return out


def _formula(spec: ModelSpec, kv_dtype: str) -> str:
    b = kv_dtype_bytes(kv_dtype)
    ca = spec.compressed_attention
    if ca:  # DeepSeek-V4 (cabe.compressed_attention.kv_cache_elements)
        return f"{spec.num_layers} × (window {ca.window} + entries ⌊L / rate⌋) × {ca.head_dim} × {b} B"
    if spec.latent_attention:
        la = spec.latent_attention
        index = f" + {la.index_head_dim}" if la.index_head_dim else ""  # DeepSeek-V3.2: the indexer's key
        return f"{spec.attention_layers} × ({la.kv_lora_rank} + {la.rope_dim}{index}) × {b} B"
    return f"2 × {spec.attention_layers} × {spec.num_kv_heads} × {spec.head_dim} × {b} B"
