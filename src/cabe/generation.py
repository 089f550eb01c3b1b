"""The memory of transformers' ``generate``, moment by moment: the prefill of the prompt (in chunks when asked), the
logits it keeps, then the decode steps -- as transformers 5.25 runs them under ``torch.no_grad`` (generation/utils.py:
2586, ``@torch.no_grad()`` on ``generate``), checked against that run on fake CUDA tensors (:mod:`cabe.trace.generate`,
``cabe infer --trace``).

A request generates ``new_tokens`` tokens after a prompt of ``context - new_tokens``: the prefill's forward makes
the first one, each of ``new_tokens - 1`` decode forwards one more, and the last is never fed back, so the cache
ends at ``context - 1`` tokens (generation/utils.py:3233-3292, ``_sample``).

The moments (each one's bytes beside the weights; the peak is the largest):

* ``prefill``: the top decoder layer of the last prefill chunk, at its MLP, every layer's cache written
  (:func:`layer_working`);
* ``prefill_logits``: the LM head on the last position only (``logits_to_keep=1``, utils.py:2958-2959;
  models/llama/modeling_llama.py:470-471) beside the final hidden states of the chunk, then the fp32 copy
  ``outputs.logits[:, -1].to(copy=True, dtype=torch.float32)`` (utils.py:3251) beside the 16-bit logits;
* ``decode``: the last decode step, the cache at ``context - 1`` tokens, while ``torch.cat`` grows one layer's keys
  (cache_utils.py:136-137: old and new both live at the cat), the previous step's fp32 logits still held (the
  variable ``next_token_logits`` lives until reassigned) beside the new logits.

The cache as transformers builds it (cache_utils.py): ``DynamicCache`` grows by ``torch.cat`` per step; its
sliding-window layers (``DynamicSlidingWindowLayer``, l.196-256) keep ``full_key_states[:, :, -window + 1:]``, a
*view* of the cat, so after a prefill a sliding layer's storage holds every token of the chunk and the window
before it until the next step's cat replaces it; ``StaticCache`` preallocates ``max_cache_len = context - 1`` tokens
per layer (its sliding layers the window) with ``torch.zeros`` at the first write (l.439-448).

cuBLAS's workspace (:data:`cabe.units.CUBLAS_WORKSPACE`) comes with the first matmul, through the caching allocator.
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.units import CUBLAS_WORKSPACE

#: the caches ``generate`` builds (``cache_implementation``; sliding-window layers follow from the config)
CACHES = ("dynamic", "static")
#: bytes of an element in the dtype the model computes in
ACT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: generated tokens when the request names none: at most this many, and at most half the context
DEFAULT_NEW_TOKENS = 256


def resolve_new_tokens(context: int, new_tokens: int | None) -> int:
    """The generated tokens of a request: ``new_tokens``, or ``min(DEFAULT_NEW_TOKENS, context // 2)`` (at least 1
    when the context has room for a prompt of one token); refused when it leaves no prompt."""
    if new_tokens is None:
        return max(1, min(DEFAULT_NEW_TOKENS, context // 2)) if context > 1 else 0
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int):
        raise InvalidValueError("not_integer", "new_tokens", value=new_tokens)
    if not 0 <= new_tokens < context:
        raise InvalidValueError("out_of_range", "new_tokens", value=new_tokens, minimum=0, maximum=context - 1)
    return new_tokens


#: hidden-size tensors a decoder layer's MLP runs beside (:func:`layer_working`), by the model code's bookkeeping:
#: transformers 5.25's Llama-style models keep the embedding output (``inputs_embeds``, modeling_llama.py:372, l.390),
#: the layer's input (the caller's ``hidden_states``, l.393-403), the residual after attention (l.308) and the MLP's
#: normed input (l.311-312); GPT-2 and GPT-BigCode also keep the position embeddings' output beside the token
#: embeddings' (modeling_gpt2.py:569-577, ``inputs_embeds`` and ``position_embeds`` locals of ``GPT2Model.forward``)
#: and the attention's output (l.285, ``attn_output`` a local of ``GPT2Block.forward`` until it returns)
HIDDEN_COPIES = {"gpt2": 6, "gpt_bigcode": 6}
#: the activations whose module computes in Python, its temporaries beside its input (transformers 5.25
#: activations.py:65-66, ``NewGELUActivation``: ``0.5 * input`` and ``torch.pow(input, 3.0)`` then ``0.044715 *``
#: that, live together with the input: 4 f-wide tensors); the others are one kernel (``F.gelu``, ``F.silu``)
PYTHON_ACTIVATIONS = {"gelu_new": 3}


def _mlp_width(spec: ModelSpec, run: Any) -> int:
    """Elements per token a dense MLP holds at its peak: ``act_fn(gate_proj(x)) * up_proj(x)``: the activation, up's
    output and their product (modeling_llama.py:164, gate_proj's output dies when the activation is made): 3·f; a fused
    ``gate_up_proj`` (Phi-3: models/phi3/modeling_phi3.py, ``up_states.chunk(2)``) keeps its 2·f output beside the
    activation and the product: 4·f; a plain MLP (``act(c_fc(x))``, modeling_gpt2.py:241-242): c_fc's output and the
    activation's, with a Python activation's temporaries (:data:`PYTHON_ACTIVATIONS`)."""
    f = spec.ffn_size(run)
    if run.mlp == "plain":
        return f * (1 + max(1, PYTHON_ACTIVATIONS.get(spec.activation, 1)))
    fused = any(lin.name == "gate_up_proj" for lin in run.linears)
    return 4 * f if fused else 3 * f


def _moe_width(spec: ModelSpec, run: Any, decode: bool, act_bytes: int) -> float:
    """Elements per token a routed-experts layer holds beyond the hidden copies, as transformers 5.25 runs its experts
    (integrations/moe.py): at the prefill ``grouped_mm_experts_forward`` (l.424-537) on ``S = tokens × k`` rows: the
    gathered hidden states (S, h) beside gate_up's (S, 2f) output, the activation and the product (S·(h + 4f)), then at
    its end the gathered input, down's output, the weighted output and its unpermuted copy (4·S·h); at a decode step
    ``generate`` switches the experts to ``batched_mm`` on every device but the CPU (generation/utils.py:2500-2519),
    which gathers each routed pair's weights (moe.py:143-165, ``gate_up_proj[expert_ids]`` then
    ``down_proj[expert_ids]``, both live at the second): S·3·f·h (S·2·f·h for ungated experts)."""
    f, h, k = spec.ffn_size(run), spec.hidden_size, spec.experts_per_token or 1
    gated = 2 if spec.activation != "plain" else 1
    if decode:
        return k * (gated + 1) * f * h
    # the weighted output and its unpermuted copy take the routing weights' dtype: fp32 where the router keeps its
    # sigmoid scores in fp32 (DeepSeek-V3: modeling_deepseek_v3.py ``DeepseekV3TopkRouter``, ``router_logits.float()``
    # and the weights gathered from them), the model's elsewhere
    end = 2 + (2 * 4 / act_bytes if spec.router.startswith("sigmoid") else 2)
    return k * max(h + 4 * f, end * h)


def _attention_width(
    spec: ModelSpec, queries: int, keys: int, act_bytes: int, masked: bool, half: bool = False
) -> float:
    """Bytes per query token the attention holds beyond the hidden copies at its peak (0 where the MLP's is always
    larger).

    * multi-head latent attention (models/deepseek_v3/modeling_deepseek_v3.py 5.25, ``DeepseekV3Attention.forward``):
      per query the queries, their rotated part and their cat with it (H·(2·qk_head + rope)) and SDPA's output (H·v);
      per cached key kv_b_proj's output over every cached latent (H·(nope + v)) and the keys (the per-head keys cat'd
      with the rotary key expanded to every head, H·qk_head); the mask's copy when there is one;
    * eager attention (Gemma 2's logit soft-capping, gpt-oss's sinks: ``sdpa_fallback``): the (queries × keys) scores
      per head: Gemma 2's masked scores in the model's dtype beside softmax's fp32 copy of them and its fp32 output
      (models/gemma2/modeling_gemma2.py ``eager_attention_forward``: ``softmax(..., dtype=torch.float32)``), gpt-oss's
      masked scores, their ``torch.cat`` with the sinks and that minus its max (models/gpt_oss/modeling_gpt_oss.py
      ``eager_attention_forward``), three in the model's dtype; beside them ``repeat_kv``'s expanded keys and values
      and the queries.
    """
    la = spec.latent_attention
    heads = spec.num_heads
    if la is None and spec.sdpa_fallback != "eager":
        return _sdpa_width(spec, queries, keys, act_bytes, masked)
    if la is not None:  # per query: q, its rotated part, its cat and the output; per key: kv_b_proj's output, the keys
        per_key = act_bytes * heads * (la.nope_dim + la.v_head_dim + la.qk_head_dim)
        mask = keys * act_bytes * (2 if keys % 8 else 1) if masked else 0  # its copy per (query, key), as below
        return act_bytes * heads * (2 * la.qk_head_dim + la.v_head_dim + la.rope_dim) + per_key * keys / queries + mask
    # Gemma 2: bf16 scores are cast to fp32 by a copy before softmax's kernel; fp16's kernel reads them as they are
    # (``half_to_float``, aten/src/ATen/native/SoftMax.cpp), then casts its fp32 output back beside it
    pair = 3 * act_bytes if spec.attention_sinks else (8 if half or act_bytes == 4 else act_bytes + 8)
    expanded = (2 * heads * spec.head_dim * act_bytes if heads > spec.num_kv_heads > 1 else 0) * keys / queries
    return heads * keys * pair + expanded + act_bytes * spec.q_dim


def _sdpa_width(spec: ModelSpec, queries: int, keys: int, a: int, masked: bool) -> float:
    """Bytes per query token SDPA holds beyond the hidden copies, as transformers 5.25 calls it
    (integrations/sdpa_attention.py:42-51 and l.127-128: keys and values expanded by ``repeat_kv`` to every head
    unless there is no mask, where ``enable_gqa`` passes the grouped heads instead) and as PyTorch picks its kernel on
    an sm90 GPU (:mod:`cabe.trace.attention`, sdp_utils.cpp): FlashAttention takes no mask and 16-bit inputs only;
    the memory-efficient kernel takes a mask but no grouped heads; else the math kernel
    (aten/src/ATen/native/transformers/attention.cpp ``_scaled_dot_product_attention_math``), which expands the grouped
    keys and values itself (``repeat_interleave``), scales a copy of the queries and of the keys, and keeps the
    (queries × keys) scores beside their softmax, with the causal mask in the model's dtype when no mask is given.

    ``masked``: transformers builds a mask (a static cache's decode, a prefill chunk after the first, a sliding layer
    past its window): its conversion to the model's dtype for the kernel
    (``convert_boolean_attn_mask``; the bool mask itself: :func:`_mask_bytes`)."""
    heads, kv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    if masked:
        # per sequence's key: repeat_kv's expanded keys and values; per (query, key): the mask's copy in the model's
        # dtype, and another where the memory-efficient kernel pads its last dimension to a multiple of 8
        # (preprocess_mask, mem_eff_alignment)
        # (one KV head: ``expand`` then ``reshape`` merges the size-1 head dimension, a view, no copy)
        expanded = (2 * heads * d * a if heads > kv > 1 else 0) * keys / queries
        return expanded + keys * a * (2 if keys % 8 else 1) + heads * d * a
    if heads > kv and (a == 4 or d > 256):  # no flash, grouped heads: the math kernel
        per_key = 3 * heads * d * a + 2 * heads * a * queries + a
        return per_key * keys / queries + heads * d * a
    return 0


def layer_working(
    spec: ModelSpec,
    batch: int,
    queries: int,
    act_bytes: int,
    attention: tuple[tuple[int, bool], ...] = (),
    decode: bool = False,
    half: bool = False,
    mlp_bytes: int | None = None,
    residual_bytes: int | None = None,
) -> int:
    """Bytes the largest decoder layer's forward holds over ``batch`` × ``queries`` tokens under ``torch.no_grad``:
    the hidden-size copies the model code keeps (:data:`HIDDEN_COPIES`, 4 for Llama-style code) beside the largest
    of the MLP (:func:`_mlp_width`; its tensors ``mlp_bytes`` each, the hidden copies ``residual_bytes``: ``act_bytes`` when
    None), the routed experts
    (:func:`_moe_width`) and the attention of each kind of layer (:func:`_attention_width`; ``attention``: (keys,
    masked) of each, the queries' when empty); the rotary ``cos`` and ``sin`` (b, s, head_dim) in the model's dtype
    live through the layers (modeling_llama.py:391)."""
    h = spec.hidden_size
    wide = 0.0
    mlp = act_bytes if mlp_bytes is None else mlp_bytes
    for run in spec.runs:  # one layer runs at a time: the widest (in act_bytes units)
        if run.mlp == "moe" and spec.num_experts:
            wide = max(wide, _moe_width(spec, run, decode, act_bytes))
        else:
            wide = max(wide, _mlp_width(spec, run) * mlp / act_bytes)
    rotary = 2 * spec.head_dim if spec.position == "rotary" else 0
    # OLMo 2 normalises after the MLP, which reads the residual itself (models/olmo2/modeling_olmo2.py:309-310): no
    # normed copy beside it
    copies = HIDDEN_COPIES.get(spec.model_type, 3 if spec.norm_placement == "post" else 4)
    kinds = attention or ((queries, False),)
    res = act_bytes if residual_bytes is None else residual_bytes
    base = res * copies * h + act_bytes * rotary + _mask_bytes(spec, queries, kinds, act_bytes)
    per_token = base + act_bytes * wide
    if spec.sdpa_fallback == "eager" and spec.latent_attention is None:
        # eager attention returns its probabilities (b, H, q, t) beside its output, and the decoder layer keeps them in
        # ``_`` until it returns (models/gemma2/modeling_gemma2.py ``hidden_states, _ = self.self_attn(...)``): they
        # live through the MLP; gpt-oss's are a view of its (t + 1)-wide probabilities with the sink
        per_token += spec.num_heads * act_bytes * max(k + (1 if spec.attention_sinks else 0) for k, _ in kinds)
    for keys, masked in kinds:
        width = _attention_width(spec, queries, keys, act_bytes, masked, half)
        if width:
            per_token = max(per_token, base + width)
    return round(batch * queries * per_token)


def _mask_bytes(spec: ModelSpec, queries: int, kinds: tuple[tuple[int, bool], ...], act_bytes: int) -> float:
    """Bytes per query token of the masks the model's ``forward`` makes once and keeps through every layer
    (``create_causal_mask`` / ``create_sliding_window_causal_mask``, masking_utils.py; one per kind of layer): SDPA's
    (b, 1, q, t) bool mask where one is built (:func:`_attention_kinds`), eager attention's in the model's float dtype
    always (``eager_mask``)."""
    eager = spec.sdpa_fallback == "eager" and spec.latent_attention is None
    return sum(keys * (act_bytes if eager else 1) for keys, masked in kinds if masked or eager)


def _attention_kinds(spec: ModelSpec, queries: int, keys: int, window_keys: int, masked: bool) -> tuple:
    """(keys, masked) of each kind of attention layer at a forward of ``queries`` tokens: a full layer attends
    ``keys``; a sliding one ``window_keys``, with a mask once its keys reach the window (masking_utils.py:286-287,
    ``local_attention_size``)."""
    out: dict[int | None, tuple[int, bool]] = {}  # one per kind of layer: the model makes one mask for each
    for g in spec.layer_groups:
        if g.mixer != "attention":
            continue
        win = window(spec, g)
        out[win] = (window_keys, masked or window_keys >= win) if win else (keys, masked)
    return tuple(out.values())


def window(spec: ModelSpec, group: Any) -> int | None:
    """The window of a layer's cache as transformers builds it: a sliding or chunked layer's, and every layer's when
    the config sets one ``sliding_window`` for all (Phi-3: cache_utils.py:2017-2035, ``get_layer_types_and_kwargs``
    makes a ``sliding_attention`` layer of each layer whose config has ``sliding_window``)."""
    if group.attention in ("sliding", "chunked") and group.window:
        return int(group.window)
    return spec.sdpa_mask_window or None


def _group_tokens(group: Any, kept: int, storage: int, static_len: int | None, win: int | None = None) -> int:
    """Tokens a layer of ``group`` holds: ``static_len`` (its preallocation) for a static cache, else ``storage``
    for a sliding layer right after a cat (the view keeps the whole cat) and ``kept`` for a full one."""
    if group.mixer != "attention":
        return 0
    if static_len is not None:
        return min(static_len, win) if win else static_len
    return storage if win else kept


def cache_bytes(spec: ModelSpec, per_token: float, batch: int, kept: int, storage: int, static: int | None) -> int:
    """The KV cache of every attention layer at a moment (:func:`_group_tokens`), ``per_token`` bytes per token
    and layer."""
    tokens = sum(g.count * _group_tokens(g, kept, storage, static, window(spec, g)) for g in spec.layer_groups)
    return round(batch * per_token * tokens)


def moments(
    spec: ModelSpec,
    *,
    prompt: int,
    new_tokens: int,
    batch: int,
    chunk: int,
    act_dtype: str,
    kv_per_token: float,
    cache: str = "dynamic",
    working: int = 0,
) -> dict[str, dict[str, int]]:
    """Each moment's bytes beside the weights, by component (``kv_cache``, ``activations``, ``logits``).

    ``act_dtype``: the dtype the model computes in (:data:`ACT_BYTES`); ``kv_per_token``: one layer's cached bytes per token (:func:`cabe.kv_cache.per_layer_token_bytes`);
    ``working``: a prefill working set computed elsewhere (a vision tower, DeepSeek-V3.2's indexer) when larger
    than :func:`layer_working`'s."""
    if cache not in CACHES:
        raise InvalidValueError("bad_choice", "cache", value=cache, allowed=", ".join(CACHES))
    a, b, v, h = ACT_BYTES[act_dtype], batch, spec.vocab_size, spec.hidden_size
    half = act_dtype == "fp16"
    end = prompt + new_tokens - 1  # tokens cached when the last decode step has run
    static = end if cache == "static" else None  # max_cache_len (generation/utils.py _prepare_static_cache)
    last = prompt - chunk * ((prompt - 1) // chunk)  # the last chunk's tokens (torch.split, utils.py:4357)
    window_before = max(((window(spec, g) or 0) - 1 for g in spec.layer_groups), default=0)

    def chunk_moment(queries: int, cached: int, masked: bool) -> dict[str, int]:
        """A prefill forward of ``queries`` tokens after which ``cached`` are cached: its top layer."""
        # sliding layers: the window kept before the chunk, then the chunk cat'd to it (cache_utils.py:236-242)
        storage = min(cached - queries, window_before) + queries if window_before > 0 else cached
        kinds = _attention_kinds(spec, queries, static or cached, storage, masked)
        return {
            "kv_cache": cache_bytes(spec, kv_per_token, b, cached, storage, static),
            "activations": max(layer_working(spec, b, queries, a, kinds, half=half), working),
            "logits": 0,
        }

    out = {"prefill": chunk_moment(last, prompt, prompt > last)}
    if prompt > chunk:  # the first of several chunks: no mask yet (masking_utils.py:297-300)
        out["prefill_first"] = chunk_moment(chunk, chunk, False)
    if prompt - last > chunk:  # the last full chunk before a short last one (more queries, fewer keys)
        out["prefill_full_chunk"] = chunk_moment(chunk, prompt - last, True)
    prefill_kv = out["prefill"]["kv_cache"]
    out |= {
        "prefill_logits": {
            "kv_cache": prefill_kv,
            # the final hidden states beside the 16-bit logits, then the logits beside their fp32 copy
            "activations": 0,
            "logits": max(b * last * h * a, b * v * 4) + b * v * a,
        },
    }
    if new_tokens > 1:
        kept = cache_bytes(spec, kv_per_token, b, end, min(end, window_before + 1) if window_before else end, static)
        # one layer's keys (or values) of the step before, live at the cat (dynamic cache only)
        cat = 0 if static else round(b * kv_per_token / 2 * (end - 1))
        out["decode"] = {
            "kv_cache": kept + cat,
            "activations": layer_working(
                spec,
                b,
                1,
                a,
                _attention_kinds(spec, 1, static or end, min(static or end, window_before + 1), static is not None),
                True,
                half,
            ),
            "logits": b * v * (4 + a),
        }
    return out


def peak(
    spec: ModelSpec,
    *,
    prompt: int,
    new_tokens: int,
    batch: int,
    chunk: int,
    act_dtype: str,
    kv_per_token: float,
    cache: str = "dynamic",
    working: int = 0,
) -> tuple[str, dict[str, int]]:
    """The largest of :func:`moments` (its name and components, cuBLAS's workspace added)."""
    ms = moments(
        spec,
        prompt=prompt,
        new_tokens=new_tokens,
        batch=batch,
        chunk=chunk,
        act_dtype=act_dtype,
        kv_per_token=kv_per_token,
        cache=cache,
        working=working,
    )
    name = max(ms, key=lambda k: sum(ms[k].values()))
    return name, {**ms[name], "cuda_workspaces": CUBLAS_WORKSPACE}
