"""Inference and serving memory: weights by format, KV cache, the forward's working memory, and a
vLLM-style KV pool (how many sequences of a length fit).

The weights by format are in :mod:`cabe.weights`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import api, engines, generation, infer_parallel, linear_attention, ssm
from cabe import gpus as gpu_catalog
from cabe.analytic import ALLOCATOR_SLACK_FRACTION  # reserved ≈ allocated × 1.05 (no fp32 loss buffers)
from cabe.architecture import ModelSpec
from cabe.engines.share import Share, of_stage
from cabe.engines.vllm import BLOCK_SIZE, serving  # noqa: F401  (re-exported: callers import them from here)
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu
from cabe.kv_cache import breakdown, kv_cache_bytes, kv_dtype_bytes, per_layer_token_bytes, resolve_kv_dtype
from cabe.search import largest
from cabe.vision.images import check_images
from cabe.vision.serving import vision_forward_bytes
from cabe.weights import weights_bytes

#: bytes of one Mamba-2 conv-state element when serving: the model's 16-bit dtype (transformers 5.24 cache_utils.py
#: ``LinearAttentionLayer.lazy_initialization`` makes it in the conv input's dtype); the SSM state is fp32 (cabe.ssm)
SSM_CONV_BYTES = 2


def forward_bytes(spec: ModelSpec, tokens: int, act_bytes: int = 2) -> int:
    """Working memory of the largest decoder layer over ``tokens`` tokens at once (flash/SDPA attention,
    no s×s scores): residual + normed input + the larger of attention (q, k, v, output) and MLP
    (gate, up, activation; ×k routed copies for MoE)."""
    h, q, kv = spec.hidden_size, spec.q_dim, spec.kv_dim
    attn = q + 2 * kv + q
    if spec.mamba2:  # a Mamba-2 mixer: in_proj's output, the convolved xBC, the scan's and the norm's outputs
        m = spec.mamba2
        attn = max(attn, m.in_proj_width + m.conv_dim + 2 * m.d_inner)
    mlp = 0
    for run in spec.runs:  # one layer runs at a time: the widest MLP
        f = spec.ffn_size(run)
        k = (spec.experts_per_token or 1) if run.mlp == "moe" else 1
        mlp = max(mlp, 3 * f * k + (h * k if run.mlp == "moe" and spec.num_experts else 0))
    return tokens * act_bytes * (2 * h + max(attn, mlp))


def indexer_moments(spec: ModelSpec, batch: int, queries: int, keys: int, act_bytes: int = 2) -> dict[str, int]:
    """DeepSeek-V3.2's layer at its lightning indexer, ``queries`` new tokens of each of ``batch`` sequences scored
    against ``keys`` cached ones (prefill: keys = queries; a later prefill chunk: every token cached so far), as
    transformers 5.24 runs it (models/deepseek_v32/modeling_deepseek_v32.py, ``DeepseekV32Attention.forward`` and
    ``DeepseekV32Indexer.forward``, under ``torch.no_grad``): named bytes, the cache apart (the KV cache holds the
    latent, the rotary key and the indexer's key). ``layer_inputs`` + ``attention_locals`` + ``indexer_locals`` live
    through every one of the indexer's moments (``matmul``, ``scaled``, ``selection``); the largest is the peak.

    * ``layer_inputs``: the decoder layer's residual and normed input (b·s·2h);
    * ``attention_locals``: what ``DeepseekV32Attention.forward`` holds when it calls the indexer (l.416-434):
      q_resid (l.416), q_b_proj's output (l.417, q_pass is a view of it), kv_a_proj_with_mqa's output (l.420, kv_pass
      a view), the rotated q_rot (l.426), query_states (l.432), and ``expand_kv`` over every *cached* token
      (l.393-400): kv_b_proj's output (value_states a view of it) and key_states;
    * ``indexer_locals``: wq_b's output (l.213; q_pass a view), the rotated q_rot (l.221) and ``torch.cat``'d q
      (l.222), k_norm's output (l.217; k_pass a view) and the rotated k_rot (l.221); the cat'd k goes when
      ``cache.update_indexer`` returns the cache's keys (l.226);
    * ``matmul`` (l.228): ``q.float()`` (b, s, H_I, D_I) and ``k.float()`` (b, t, D_I) beside the fp32 scores
      (b, s, H_I, t); ``at::matmul`` broadcasts k's (b, 1) batch dimensions with ``expand(...).reshape(...)``
      (``_matmul_impl``, aten/src/ATen/native/LinearAlgebra.cpp), a copy of k per query, (b·s, D_I, t) fp32, when
      b > 1 (with b = 1 the size-1 dimension merges with the stride-0 one: a view);
    * ``scaled`` (l.228-229): the scores times softmax_scale beside the scores, then relu's output beside those;
    * ``selection`` (l.232-242): the relu'd scores (a local to the end), weights_proj's output, its fp32 cast and
      scaled copy, the summed (b, s, t) fp32 index scores, the masked copy (``masked_fill`` with the negated bool
      SDPA mask, (b, s, t) bytes, l.236-239), then ``topk``'s fp32 values, int64 indices and their int32 cast.

    The mask the attention builds next from the top-k (l.447-458: a bool (b, s, t) ``new_ones``, its ``scatter``
    copy, the combined (b, 1, s, t) mask) and SDPA's working memory over the masked keys hold a few bytes per
    (query, key) pair where the indexer holds 8·H_I: transformers' eager / SDPA path attends to every key with a
    mask, so the sparsity saves no memory there; not counted.

    NOTE: serving engines do not build these: vLLM computes the indexer's logits with DeepGEMM's fp8 MQA-logits
    kernel (the heads summed inside it: one fp32 value per (query, key)) and attends to the top-k keys only with
    FlashMLA's sparse kernel (vllm-project/recipes, DeepSeek/DeepSeek-V3_2-Exp.md); :func:`serving` keeps
    :func:`forward_bytes`.
    """
    la = spec.latent_attention
    if la is None or not la.index_heads:
        return {}
    a, b, s, t, h, nh = act_bytes, batch, queries, keys, spec.hidden_size, spec.num_heads
    hi, di, r = la.index_heads, la.index_head_dim, la.rope_dim  # the indexer rotates config.qk_rope_head_dim
    topk = min(la.index_topk, t)
    q_head = la.qk_head_dim
    scores = 4 * b * s * hi * t  # fp32 (b, s, H_I, t)
    pairs = b * s * t
    weights = a * b * s * hi + 2 * 4 * b * s * hi  # weights_proj's output, .float(), × n_heads^-0.5
    return {
        "layer_inputs": a * b * s * 2 * h,
        "attention_locals": a * b * s * (la.q_lora_rank + 2 * nh * q_head + la.kv_lora_rank + r + nh * r)
        + a * b * t * nh * (la.nope_dim + la.v_head_dim + q_head),
        "indexer_locals": a * b * s * (2 * hi * di + hi * r + di + r),
        "matmul": 4 * b * s * hi * di + 4 * b * t * di + (4 * b * s * di * t if b > 1 else 0) + scores,
        "scaled": 2 * scores,
        "selection": scores
        + weights
        + max(2 * 4 * pairs + pairs, 4 * pairs + (4 + 8 + 4) * b * s * topk),  # masked_fill's, then topk's moment
    }


def indexer_prefill_bytes(spec: ModelSpec, batch: int, queries: int, keys: int, act_bytes: int = 2) -> int:
    """Peak bytes of a DeepSeek-V3.2 layer at its indexer (:func:`indexer_moments`); 0 without an indexer."""
    m = indexer_moments(spec, batch, queries, keys, act_bytes)
    if not m:
        return 0
    return (
        m["layer_inputs"] + m["attention_locals"] + m["indexer_locals"] + max(m["matmul"], m["scaled"], m["selection"])
    )


def prefill_chunks(context: int, chunk: int) -> tuple[tuple[int, int], ...]:
    """(new tokens, cached tokens after them) of the prefill chunks whose working memory can be the largest:
    transformers' ``generate`` splits the prompt with ``torch.split(prefill_ids, chunk_size)`` (generation/utils.py
    5.24, the chunked prefill), so the last chunk may be short; a cost that grows with both the chunk and the keys
    peaks at the last chunk or the last full one before it."""
    n = -(-context // chunk)
    last = context - chunk * (n - 1)
    return ((last, context),) if n == 1 else ((last, context), (chunk, context - last))


def _indexer_step(spec: ModelSpec, context: int, chunk: int, batch: int) -> dict[str, Any] | None:
    """DeepSeek-V3.2's indexer at the prefill chunk where it peaks, as a step (None without an indexer)."""
    la = spec.latent_attention
    if la is None or not la.index_heads:
        return None
    s, t = max(prefill_chunks(context, chunk), key=lambda st: indexer_prefill_bytes(spec, batch, *st))
    m = indexer_moments(spec, batch, s, t)
    total = indexer_prefill_bytes(spec, batch, s, t)
    # the moment's per-(query, key) bytes, the rest being per token
    per_pair = 4 * la.index_heads + (4 * la.index_head_dim if batch > 1 else 0)
    if max(m["scaled"], m["selection"]) > m["matmul"]:
        # the scaled scores beside the scores, or the scores beside the summed index scores
        per_pair = 8 * la.index_heads if m["scaled"] >= m["selection"] else 4 * la.index_heads + 4
    return {
        "key": "infer.indexer",
        "formula": "{b} × {s} queries × {t} keys × {per_pair} B + {rest} B",
        "bytes": total,
        "params": {
            "b": batch,
            "s": s,
            "t": t,
            "per_pair": per_pair,
            "rest": total - batch * s * t * per_pair,
            "heads": la.index_heads,
            "topk": la.index_topk,
        },
        "moments": m,
    }


def logits_bytes(spec: ModelSpec, rows: int) -> int:
    """Logits of ``rows`` positions: 16-bit output + the fp32 upcast for sampling / the loss."""
    return rows * spec.vocab_size * (2 + 4)


def estimate_inference(
    spec: ModelSpec,
    *,
    weights: str = "auto",
    kv_dtype: str = "auto",
    context: int = 4096,
    batch: int = 1,
    mode: str = "generate",
    prefill_chunk: int | None = None,
    group_size: int = 128,
    images: int = 0,
    image_size: str = "448x448",
    new_tokens: int | None = None,
    cache: str = "dynamic",
) -> dict[str, Any]:
    """Peak memory of running the model on ``batch`` sequences of ``context`` tokens.

    ``mode="generate"``: transformers' ``generate`` of ``new_tokens`` tokens after a prompt of the rest of the context
    (:func:`cabe.generation.resolve_new_tokens` when not given), with a ``dynamic`` or ``static`` cache: the largest
    of its moments (:mod:`cabe.generation`: the prefill's top layer, its logits, the last decode step).

    ``images`` per sequence (a model with a vision tower cabe models): their tokens are part of ``context``, so
    of the KV cache, as the processor writes them into the prompt; the tower runs on all of the batch's images at
    prefill, before the decoder, and its working memory (:func:`cabe.vision.serving.vision_forward_bytes`) is
    the activations' when it is the larger.

    DeepSeek-V3.2's lightning indexer scores every new token against every cached one at prefill
    (:func:`indexer_moments`, at the chunk of :func:`prefill_chunks` where it peaks): the working memory is the
    larger of that moment and :func:`forward_bytes`.

    ``mode="generate"``: prefill (in chunks of ``prefill_chunk`` tokens, default the whole prompt)
    then decoding; logits of the last token only. ``mode="prefill"``: scoring a whole prompt,
    logits of every position (perplexity, reward models).
    """
    if mode not in ("generate", "prefill"):
        raise InvalidValueError("bad_choice", "mode", value=mode, allowed="generate, prefill")
    for name, v in (("context", context), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InvalidValueError("not_integer", name, value=v)
        if v < 1 or v > (1 << 24):
            raise InvalidValueError("out_of_range", name, value=v, minimum=1, maximum=1 << 24)
    new = generation.resolve_new_tokens(context, new_tokens) if mode == "generate" else 0
    prompt = max(1, context - new)  # the tokens the prefill runs (generate: the prompt)
    chunk = min(prompt if prefill_chunk is None else prefill_chunk, prompt)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise InvalidValueError("out_of_range", "prefill_chunk", value=prefill_chunk, minimum=1, maximum=1 << 24)
    w = weights_bytes(spec, weights, group_size)
    kv_dtype = resolve_kv_dtype(kv_dtype, w["format"])
    kv = kv_cache_bytes(spec, context, batch, kv_dtype)
    act = forward_bytes(spec, batch * chunk)
    vision = _vision_step(spec, images, image_size, context, batch)
    act = max(act, vision["bytes"]) if vision else act
    indexer = _indexer_step(spec, prompt, chunk, batch)
    act = max(act, indexer["bytes"]) if indexer else act
    logits = logits_bytes(spec, batch * (context if mode == "prefill" else 1))
    comps = {"weights": w["total_bytes"], "kv_cache": kv, "activations": act, "logits": logits}
    moment = None
    if mode == "generate" and not spec.compressed_attention:  # transformers' generate, moment by moment
        working = max(vision["bytes"] if vision else 0, indexer["bytes"] if indexer else 0)
        moment, gen = generation.peak(
            spec,
            prompt=prompt,
            new_tokens=max(new, 1),
            batch=batch,
            chunk=chunk,
            # the compute dtype: quantized formats dequantise to 16-bit
            act_dtype=w["format"] if w["format"] in generation.ACT_BYTES else "bf16",
            kv_per_token=per_layer_token_bytes(spec, kv_dtype),
            cache=cache,
            working=working,
        )
        # gated DeltaNet layers: a fixed state per sequence beside the tokens (cabe.linear_attention)
        gen["kv_cache"] += batch * linear_attention.state_bytes(spec)
        comps = {"weights": w["total_bytes"], **gen}
        if spec.buffer_bytes:  # the model's buffers on the device beside its weights (GPT-BigCode's causal mask)
            comps["buffers"] = spec.buffer_bytes
    state = batch * ssm.state_bytes_per_sequence(spec, SSM_CONV_BYTES)
    if state:  # Mamba-2 layers: the conv and SSM states of every sequence, whatever its length
        comps["ssm_state"] = state
    total = sum(comps.values())
    return {
        "mode": mode,
        "weights_format": w["format"],
        "kv_dtype": kv_dtype,
        "context": context,
        "batch": batch,
        "prefill_chunk": chunk,
        **({"new_tokens": new, "prompt_tokens": prompt, "cache": cache, "peak_moment": moment} if moment else {}),
        "components": comps,
        "total_bytes": total,
        "reserved_bytes": round(total * (1 + ALLOCATOR_SLACK_FRACTION)),
        "weights": w,
        "kv": breakdown(spec, context, batch, kv_dtype),
        "steps": [
            {
                "key": "infer.weights",
                "formula": "{n} × {bpw} B",
                "bytes": w["total_bytes"],
                "params": {"n": spec.parameter_count, "bpw": round(w["total_bytes"] / spec.parameter_count, 4)},
            },
            _kv_step(spec, kv, kv_dtype, context, batch),
            {
                "key": "infer.logits." + mode,
                "formula": "{rows} × {v} × (2 + 4) B",
                "bytes": logits,
                "params": {"rows": batch * (context if mode == "prefill" else 1), "v": spec.vocab_size},
            },
            *([vision] if vision else []),
            *([indexer] if indexer else []),
        ],
    }


def _vision_step(spec: ModelSpec, images: int, image_size: str, context: int, batch: int) -> dict[str, Any] | None:
    """The vision tower's forward at prefill, as a step (None without images)."""
    if isinstance(images, bool) or not isinstance(images, int) or not 0 <= images <= 1 << 12:
        raise InvalidValueError("out_of_range", "images", value=images, minimum=0, maximum=1 << 12)
    grid = check_images(spec, images, image_size, context)
    if grid is None or spec.vision is None:
        return None
    n = batch * images * grid.patches
    return {
        "key": "infer.vision",
        "formula": "{images} × {patches} patches: {tokens} tokens each",
        "bytes": vision_forward_bytes(spec.vision, n),
        "params": {"images": batch * images, "patches": grid.patches, "tokens": grid.tokens},
    }


def _kv_step(spec: ModelSpec, kv: int, kv_dtype: str, context: int, batch: int) -> dict[str, Any]:
    params = {"layers": spec.attention_layers, "b": kv_dtype_bytes(kv_dtype), "tokens": context, "batch": batch}
    if spec.compressed_attention:  # DeepSeek-V4: per layer kind (cabe.compressed_attention.kv_cache_elements)
        return {
            "key": "infer.kv",
            "formula": "{layers} × (window + ⌊{tokens} / rate⌋ entries) × {d} × {b} B × {batch}",
            "bytes": kv,
            "params": {**params, "d": spec.head_dim},
        }
    la = spec.latent_attention
    if la:  # multi-head latent attention caches the latent and the rotary key (cabe.kv_cache.latent_token_elements)
        return {
            "key": "infer.kv",
            # DeepSeek-V3.2: + the indexer's key (index_head_dim), folded into d
            "formula": "{layers} × ({r} + {d}) × {b} B × {tokens} tokens × {batch}",
            "bytes": kv,
            "params": {**params, "r": la.kv_lora_rank, "d": la.rope_dim + la.index_head_dim},
        }
    return {
        "key": "infer.kv",
        "formula": "2 × {layers} × {kv} × {d} × {b} B × {tokens} tokens × {batch}",
        "bytes": kv,
        "params": {**params, "kv": spec.num_kv_heads, "d": spec.head_dim},
    }


def fit_inference(est: Mapping[str, Any], card: Gpu) -> dict[str, Any]:
    need = est["reserved_bytes"] + card.cuda_context_bytes
    return {
        "gpu": card.name,
        "display": card.display,
        "memory_bytes": card.memory_bytes,
        "needed_bytes": need,
        "margin_bytes": card.memory_bytes - need,
        "fits": need <= card.memory_bytes,
    }


# ---- serving engines: vLLM's pool lives in cabe.engines.vllm (re-exported here as ``serving``) ---------


# ---- solver: longest context, most concurrent sequences (no engine) -------------------------------


def max_context(spec: ModelSpec, card: Gpu, *, batch: int = 1, **kw: Any) -> int:
    """The longest context (prompt + generated) that fits; with ``new_tokens`` given, a prompt of at least one token
    beside them (0 when none fits)."""
    cap = spec.max_positions or (1 << 24)
    new = kw.get("new_tokens") or 0
    if new >= cap:
        return 0

    def fits(prompt: int) -> bool:
        return fit_inference(estimate_inference(spec, context=new + prompt, batch=batch, **kw), card)["fits"]

    prompt = largest(fits, cap - new)
    return new + prompt if prompt else 0


def max_batch(spec: ModelSpec, card: Gpu, *, context: int = 4096, **kw: Any) -> int:
    return largest(
        lambda b: fit_inference(estimate_inference(spec, context=context, batch=b, **kw), card)["fits"], 1 << 16
    )


def infer_json(body: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /api/infer``: {model | config, weights, kv_dtype, context, batch, mode, prefill_chunk,
    group_size, gpu, gpu_memory_utilization}. Raises CabeError.

    ``fit`` is the verdict on the card: the whole model on it, or on a replica split over several GPUs (tp, pp, dp)
    the fullest GPU's (``parallel.fit``, with ``per_gpu``: true), as the CLI prints it."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    allowed = (
        "model",
        "config",
        "weights",
        "kv_dtype",
        "context",
        "batch",
        "mode",
        "prefill_chunk",
        "new_tokens",
        "cache",
        "group_size",
        "gpu",
        "gpu_memory_utilization",
        "images",
        "image_size",
        *infer_parallel.FIELDS,
        "lang",
        "units",
    ) + engines.FIELDS
    unknown = [k for k in body if k not in allowed]
    if unknown:
        raise InvalidValueError("unknown_field", unknown[0], allowed=", ".join(allowed))
    src = api.model_source(body, allow_files=False)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    spec = src.spec
    engine = engines.engine_of(body)
    keys = ("weights", "kv_dtype", "mode", "prefill_chunk", "group_size", "images", "image_size", "new_tokens", "cache")
    kw = {k: body[k] for k in keys if body.get(k) is not None}
    context = body.get("context")
    context = min(4096, spec.max_positions or 4096) if context is None else context
    batch: int = 1 if body.get("batch") is None else body["batch"]
    est = estimate_inference(spec, context=context, batch=batch, **kw)
    kw["kv_dtype"] = est["kv_dtype"]  # "auto" resolved from the weights' format, for the engines below
    body = {**body, "kv_dtype": est["kv_dtype"]}
    out: dict[str, Any] = {"model": spec.name, **est, "notes": list(api.beyond_limits(spec, context))}
    card = gpu_catalog.gpu(str(body["gpu"])) if body.get("gpu") else None
    # several GPUs per replica, speed bounds on the card, the context limit with rope scaling (cabe.infer_parallel)
    out = infer_parallel.extend(out, body, spec, src.config, card)
    if card is None:
        return out
    out["fit"] = fit_inference(est, card)
    out["max_context"] = max_context(spec, card, batch=batch, **kw)
    out["max_batch"] = max_batch(spec, card, context=context, **kw)
    skw = {k: kw[k] for k in ("weights", "kv_dtype", "group_size") if k in kw}
    par = out.get("parallel")
    tp = par["tp"] if par else 1
    share = of_stage(par) if par else None  # the fullest GPU of a tensor- / pipeline-parallel replica
    util = 0.9 if body.get("gpu_memory_utilization") is None else body["gpu_memory_utilization"]
    out["serving"] = serving(spec, card, context=context, gpu_memory_utilization=util, tp=tp, share=share, **skw)
    if par:  # the replica's KV pool is vLLM's on its fullest GPU (cabe.engines.vllm), times the replicas
        seqs = out["serving"].get("max_concurrent_sequences", 0)
        par["fit"].update({"sequences_per_replica": seqs, "sequences_total": seqs * par["dp"]})
        # the verdict is the fullest GPU's (the model split over tp x pp), not the whole model on one card
        pf = par["fit"]
        out["fit"] = {
            **{k: pf[k] for k in ("gpu", "display", "memory_bytes", "needed_bytes", "fits")},
            "margin_bytes": pf["memory_bytes"] - pf["needed_bytes"],
            "per_gpu": True,
        }
    out["engine"] = _engine(engine, spec, card, body, context, out, tp, share)
    return out


def _engine(
    engine: str,
    spec: ModelSpec,
    card: Gpu,
    body: Mapping[str, Any],
    context: int,
    out: dict,
    tp: int,
    share: Share | None,
) -> dict:
    """``--engine``: transformers' ``generate`` (the solver's answers above) or a serving engine's accounting."""
    if engine == "hf":
        return {"engine": "hf", "max_context": out["max_context"], "max_concurrent_sequences": out["max_batch"]}
    return engines.run(engine, spec, card, body, context=context, tp=tp, share=share)
