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


def layer_working(spec: ModelSpec, tokens: int, act_bytes: int) -> int:
    """Bytes a decoder layer's forward holds at its MLP over ``tokens`` tokens under ``torch.no_grad``
    (models/llama/modeling_llama.py 5.25): the embedding output, which the model's ``forward`` keeps in
    ``inputs_embeds`` through every layer (l.372, l.390); the layer's input (the caller's ``hidden_states``,
    l.393-403), the residual after attention (l.308) and the normed input of the MLP (l.311-312); inside the MLP
    ``act_fn(gate_proj(x)) * up_proj(x)`` (l.164): the activation, up_proj's output and their product (gate_proj's
    output dies when the activation is made), so 4·h + 3·f per token; ``k`` routed copies of the expert width for
    a MoE layer. The attention holds less wherever the MLP is at least as wide as the queries (it is, in every
    family cabe serves); the rotary ``cos`` and ``sin`` (b, s, head_dim) in the model's dtype live through the layers
    (l.391)."""
    h = spec.hidden_size
    mlp = 0
    for run in spec.runs:  # one layer runs at a time: the widest MLP
        f = spec.ffn_size(run)
        k = (spec.experts_per_token or 1) if run.mlp == "moe" else 1
        width = 3 * f * k if run.mlp != "plain" else 2 * f
        mlp = max(mlp, width + (h * k if run.mlp == "moe" and spec.num_experts else 0))
    rotary = 2 * spec.head_dim if spec.position == "rotary" else 0
    return tokens * act_bytes * (4 * h + mlp + rotary)


def _group_tokens(group: Any, kept: int, storage: int, static_len: int | None) -> int:
    """Tokens a layer of ``group`` holds: ``static_len`` (its preallocation) for a static cache, else ``storage``
    for a sliding layer right after a cat (the view keeps the whole cat) and ``kept`` for a full one."""
    if group.mixer != "attention":
        return 0
    sliding = group.attention in ("sliding", "chunked") and group.window
    if static_len is not None:
        return min(static_len, group.window) if sliding else static_len
    return storage if sliding else kept


def cache_bytes(spec: ModelSpec, per_token: float, batch: int, kept: int, storage: int, static: int | None) -> int:
    """The KV cache of every attention layer at a moment (:func:`_group_tokens`), ``per_token`` bytes per token
    and layer."""
    tokens = sum(g.count * _group_tokens(g, kept, storage, static) for g in spec.layer_groups)
    return round(batch * per_token * tokens)


def moments(
    spec: ModelSpec,
    *,
    prompt: int,
    new_tokens: int,
    batch: int,
    chunk: int,
    act_bytes: int,
    kv_per_token: float,
    cache: str = "dynamic",
    working: int = 0,
) -> dict[str, dict[str, int]]:
    """Each moment's bytes beside the weights, by component (``kv_cache``, ``activations``, ``logits``).

    ``kv_per_token``: one layer's cached bytes per token (:func:`cabe.kv_cache.per_layer_token_bytes`);
    ``working``: a prefill working set computed elsewhere (a vision tower, DeepSeek-V3.2's indexer) when larger
    than :func:`layer_working`'s."""
    if cache not in CACHES:
        raise InvalidValueError("bad_choice", "cache", value=cache, allowed=", ".join(CACHES))
    a, b, v, h = act_bytes, batch, spec.vocab_size, spec.hidden_size
    end = prompt + new_tokens - 1  # tokens cached when the last decode step has run
    static = end if cache == "static" else None  # max_cache_len (generation/utils.py _prepare_static_cache)
    last = prompt - chunk * ((prompt - 1) // chunk)  # the last chunk's tokens (torch.split, utils.py:4357)
    window_before = max((g.window or 0) - 1 for g in spec.layer_groups) if spec.layer_groups else 0
    # sliding layers: the window kept before the chunk, then the chunk cat'd to it (cache_utils.py:236-242)
    storage = min(prompt - last, window_before) + last if window_before > 0 else prompt
    prefill_kv = cache_bytes(spec, kv_per_token, b, prompt, storage, static)
    out = {
        "prefill": {
            "kv_cache": prefill_kv,
            "activations": max(layer_working(spec, b * last, a), working),
            "logits": 0,
        },
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
            "activations": layer_working(spec, b, a),
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
    act_bytes: int,
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
        act_bytes=act_bytes,
        kv_per_token=kv_per_token,
        cache=cache,
        working=working,
    )
    name = max(ms, key=lambda k: sum(ms[k].values()))
    return name, {**ms[name], "cuda_workspaces": CUBLAS_WORKSPACE}
