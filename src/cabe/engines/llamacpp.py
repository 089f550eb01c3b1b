"""llama.cpp's memory on a GPU, from its source (ggml-org/llama.cpp): GGUF tensor types, the KV cache's types and
cells, the compute buffer, ``-ngl`` offload.

* GGML types (ggml/src/ggml.c ``type_traits``, block structs in ggml/src/ggml-common.h): bytes per block / values per
  block, e.g. ``block_q4_K`` = d, dmin (2 × fp16) + scales[12] + qs[128] = 144 bytes per 256 weights (4.5 bits).
* A file type mixes them (src/llama-quant.cpp ``llama_tensor_get_type``): Q4_K_M is Q4_K but ``output.weight`` (or the
  tied ``token_embd``) in Q6_K, and ``attn_v`` and ``ffn_down`` in Q6_K in the layers ``use_more_bits`` picks (the
  first and last eighth, every third between); Q5_K_M the same over Q5_K; Q4_K_S / Q3_K_M bump the first layers to
  Q5_K. A k-quant row length not a multiple of 256 falls back (``Q4_K -> Q5_0``, ``Q5_K -> Q5_1``, ``Q6_K -> Q8_0``);
  1-D tensors (norms, biases, the SSM's small tensors) and routers (``ffn_gate_inp``) stay F32.
* The KV cache (src/llama-kv-cache.cpp): ``n_ctx`` cells (padded to 256) × layers × (n_embd_k_gqa × size(type_k) +
  n_embd_v_gqa × size(type_v)), ``-ctk`` / ``-ctv`` picking the types (f16, q8_0, q4_0...); sliding-window layers
  (llama-kv-cache-iswa.cpp) keep min(n_ctx, pad(n_swa × n_seq + n_ubatch, 256)) cells unless ``--swa-full``;
  recurrent layers (llama-memory-recurrent.cpp) one f32 conv and SSM state per sequence.
* The compute buffer (llama-context.cpp ``graph_reserve`` at n_ubatch tokens, every token an output; ggml-alloc
  reuses memory between ops): at the output the normed hidden states and the f32 logits [n_vocab, n_ubatch] are
  live; in a layer the residual, the input and the FFN's gate, up and their product [n_ff, n_ubatch] (MoE: per
  selected expert, ``build_moe_ffn``); without flash attention the f32 KQ scores [n_kv, n_ubatch, n_head] (softmax in
  place).
* ``-ngl N``: the first N repeating layers' weights and KV cells on the GPU; ``output.weight`` too when N exceeds the
  layer count; ``token_embd`` stays in host memory (``llama_model::load_tensors``: the input layer is on the CPU).
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.gpus import Gpu
from cabe.search import largest

#: ggml type -> (values per block, bytes per block)
GGML_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),  # d (fp16) + qs[32]
    "q4_0": (32, 18),  # d + qs[16]
    "q4_1": (32, 20),  # d, m + qs[16]
    "q5_0": (32, 22),  # d + qh[4] + qs[16]
    "q5_1": (32, 24),  # d, m + qh[4] + qs[16]
    "iq4_nl": (32, 18),  # d + qs[16]
    "q2_k": (256, 84),  # scales[16] + qs[64] + d, dmin
    "q3_k": (256, 110),  # hmask[32] + qs[64] + scales[12] + d
    "q4_k": (256, 144),  # d, dmin + scales[12] + qs[128]
    "q5_k": (256, 176),  # d, dmin + scales[12] + qh[32] + qs[128]
    "q6_k": (256, 210),  # ql[128] + qh[64] + scales[16] + d
    "iq4_xs": (256, 136),  # d + scales_h + scales_l[4] + qs[128]
}
#: the KV cache types ``-ctk`` / ``-ctv`` accept (common/arg.cpp ``kv_cache_types``)
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: file types (``llama-quantize`` names, lower case) -> their base ggml type
FILE_TYPES: dict[str, str] = {
    "f16": "f16",
    "bf16": "bf16",
    "q8_0": "q8_0",
    "q6_k": "q6_k",
    "q5_k_m": "q5_k",
    "q5_k_s": "q5_k",
    "q5_0": "q5_0",
    "q4_k_m": "q4_k",
    "q4_k_s": "q4_k",
    "q4_0": "q4_0",
    "q3_k_m": "q3_k",
    "q2_k": "q2_k",
}
#: llama-quant.cpp ``convert_incompatible_tensor``: a k-quant tensor whose rows are not a multiple of 256
K_FALLBACK = {"q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0", "iq4_xs": "iq4_nl"}
KV_PAD = 256
F32 = 4


def type_bytes(t: str, n: int) -> float:
    block, size = GGML_TYPES[t]
    return n / block * size


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp ``use_more_bits``: the first and last eighth of the layers and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _pick(ftype: str, base: str, role: str, i: int, n: int, spec: ModelSpec) -> str:
    """``llama_tensor_get_type`` for the file types above: ``role`` output | attn_v | ffn_down | other."""
    if base in ("f16", "bf16"):
        return base
    if role == "output":
        return base if base == "q8_0" else "q6_k"
    if role == "attn_v":
        if spec.num_experts == 8:  # "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
            return "q8_0"
        if ftype in ("q4_k_m", "q5_k_m") and _use_more_bits(i, n):
            return "q6_k"
        if ftype == "q4_k_s" and i < 4:
            return "q5_k"
        if ftype == "q3_k_m":
            return "q5_k" if i < 2 else "q4_k"
        if ftype == "q2_k":
            return "q4_k" if spec.num_heads // max(spec.num_kv_heads, 1) >= 4 else "q3_k"
    if role == "ffn_down":
        if ftype in ("q4_k_m", "q5_k_m") and _use_more_bits(i, n):
            return "q6_k"
        if ftype == "q4_k_s" and i < n // 8:
            return "q5_k"
        if ftype == "q3_k_m":
            return "q5_k" if i < n // 16 else "q4_k"
        if ftype == "q2_k":
            return "q3_k"
    if role == "attn_output" and ftype in ("q3_k_m", "q2_k"):
        return "q4_k" if ftype == "q3_k_m" else "q3_k"
    return base


def _role(name: str, slot: str) -> str:
    if "v_proj" in name and "kv" not in name:
        return "attn_v"
    if "down" in name or slot in ("down", "shared_down"):
        return "ffn_down"
    if slot == "o" and "out_proj" not in name:
        return "attn_output"
    return "other"


def tensors(spec: ModelSpec, ftype: str) -> list[dict[str, Any]]:
    """Every tensor group of the GGUF file: name, layer (-1 outside the layers), elements, ggml type, bytes."""
    if ftype not in FILE_TYPES:
        raise InvalidValueError("bad_choice", "weights", value="gguf-" + ftype, allowed=", ".join(FILE_TYPES))
    base = FILE_TYPES[ftype]
    n = spec.num_layers
    out: list[dict[str, Any]] = []

    def add(name: str, layer: int, rows: int, cols: int, t: str) -> None:
        if GGML_TYPES[t][0] > 1 and rows % GGML_TYPES[t][0]:
            t = K_FALLBACK.get(t, "f16") if rows % 32 == 0 else "f16"
        out.append(
            {"name": name, "layer": layer, "elements": rows * cols, "type": t, "bytes": type_bytes(t, rows * cols)}
        )

    emb = _pick(ftype, base, "output", 0, n, spec) if spec.tie_word_embeddings else base
    add("token_embd", -1, spec.hidden_size, spec.vocab_size, emb)
    if not spec.tie_word_embeddings:
        add("output", -1, spec.hidden_size, spec.vocab_size, _pick(ftype, base, "output", 0, n, spec))
    i = 0
    for g in spec.layer_groups:
        for _ in range(g.count):
            for lin in g.linears:
                small = lin.in_features < 32 or (lin.role in ("router", "ssm") and lin.slot not in ("qkv", "o"))
                t = "f32" if small else _pick(ftype, base, _role(lin.name, lin.slot), i, n, spec)
                add(lin.name, i, lin.in_features, lin.out_features * lin.copies, t)
            i += 1
    norms = (
        spec.parameter_count
        - spec.embedding_count
        - spec.lm_head_count
        - sum(e["elements"] for e in out[1:] if e["name"] != "output")
    )
    if norms > 0:  # norms, biases: F32
        out.append({"name": "norms", "layer": -1, "elements": norms, "type": "f32", "bytes": norms * F32})
    return out


def kv_bytes(
    spec: ModelSpec,
    n_ctx: int,
    type_k: str,
    type_v: str,
    *,
    n_ubatch: int,
    n_seq: int = 1,
    swa_full: bool = False,
    layers: int | None = None,
) -> dict[str, float]:
    """The KV cache of ``n_ctx`` cells (and the recurrent states of ``n_seq`` sequences) over the first ``layers``:
    ``kv_full`` the layers that keep every cell, ``kv_swa`` the sliding-window ones, ``kv`` both."""
    for name, t in (("cache_type_k", type_k), ("cache_type_v", type_v)):
        if t not in KV_TYPES:
            raise InvalidValueError("bad_choice", name, value=t, allowed=", ".join(KV_TYPES))
    cells = -(-n_ctx // KV_PAD) * KV_PAD
    per_cell = type_bytes(type_k, spec.kv_dim) + type_bytes(type_v, spec.kv_dim)
    left = spec.num_layers if layers is None else layers
    kv = swa = state = 0.0
    for g in spec.layer_groups:
        take = min(g.count, left)
        left -= take
        if g.mixer == "attention":
            if g.attention in ("sliding", "chunked") and g.window and not swa_full:
                swa += take * min(cells, -(-(g.window * n_seq + n_ubatch) // KV_PAD) * KV_PAD) * per_cell
            else:
                kv += take * cells * per_cell
        elif g.mixer == "mamba2" and spec.mamba2:
            state += take * n_seq * (spec.mamba2.conv_state_elements + spec.mamba2.ssm_state_elements) * F32
        elif g.mixer == "gated_deltanet" and spec.gated_deltanet:
            dn = spec.gated_deltanet
            state += take * n_seq * (dn.conv_state_elements + dn.recurrent_state_elements) * F32
    return {"cells": cells, "kv": kv + swa, "kv_full": kv, "kv_swa": swa, "recurrent": state}


def compute_bytes(spec: ModelSpec, n_ctx: int, n_ubatch: int, flash_attn: bool = True) -> int:
    """The GPU compute buffer of the worst-case graph (``graph_reserve`` at ``n_ubatch`` tokens, all outputs)."""
    h, u = spec.hidden_size, n_ubatch
    out = spec.vocab_size + h  # the normed hidden states beside the f32 logits
    ffn = 0
    for g in spec.layer_groups:
        f = spec.ffn_size(g)
        k = (spec.experts_per_token or 1) if g.mlp == "moe" else 1
        ffn = max(ffn, 2 * h + 3 * f * k + (2 * spec.num_experts if g.mlp == "moe" else 0))
    attn = 2 * h + 2 * spec.q_dim
    if not flash_attn:
        cells = -(-n_ctx // KV_PAD) * KV_PAD
        attn += spec.num_heads * cells
    return u * F32 * max(out, ffn, attn)


def serving(
    spec: ModelSpec,
    card: Gpu,
    *,
    weights: str = "gguf-q4_k_m",
    context: int = 4096,
    n_ctx: int | None = None,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    n_gpu_layers: int | None = None,
    flash_attn: bool = True,
) -> dict[str, Any]:
    """llama.cpp on ``card``: the GPU's model buffer, KV buffer, compute buffer; the largest ``n_ctx`` that fits and
    the parallel slots (``-np``) of ``context`` tokens each (a slot gets n_ctx / np cells)."""
    for name, v in (("context", context), ("n_batch", n_batch), ("n_ubatch", n_ubatch)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 24:
            raise InvalidValueError("out_of_range", name, value=v, minimum=1, maximum=1 << 24)
    ftype = weights[5:] if weights.startswith("gguf-") else weights
    ftype = {"fp16": "f16", "auto": "f16"}.get(ftype, ftype)
    ngl = spec.num_layers + 1 if n_gpu_layers is None else n_gpu_layers
    if isinstance(ngl, bool) or not isinstance(ngl, int) or ngl < 0:
        raise InvalidValueError("out_of_range", "n_gpu_layers", value=n_gpu_layers, minimum=0, maximum=1 << 12)
    ubatch = min(n_ubatch, n_batch)  # llama-context.cpp: n_ubatch = min(n_batch, n_ubatch)
    ts = tensors(spec, ftype)
    on_gpu = min(ngl, spec.num_layers)
    gpu_w = sum(t["bytes"] for t in ts if 0 <= t["layer"] < on_gpu)
    if ngl > spec.num_layers:
        gpu_w += sum(t["bytes"] for t in ts if t["name"] in ("output", "norms")) or 0
        if spec.tie_word_embeddings:  # the output reuses token_embd, duplicated onto the output's device
            gpu_w += next(t["bytes"] for t in ts if t["name"] == "token_embd")
    file_bytes = sum(t["bytes"] for t in ts)

    def need(ctx: int, seqs: int = 1) -> dict[str, float]:
        kv = kv_bytes(spec, ctx, cache_type_k, cache_type_v, n_ubatch=ubatch, n_seq=seqs, layers=on_gpu)
        comp = compute_bytes(spec, ctx, ubatch, flash_attn) if on_gpu else 0
        total = gpu_w + kv["kv"] + kv["recurrent"] + comp + card.cuda_context_bytes
        return {**kv, "compute": comp, "total": total}

    ctx = n_ctx or context
    now = need(ctx)
    cap = spec.max_positions or (1 << 24)
    fits = now["total"] <= card.memory_bytes
    longest = largest(lambda c: need(c)["total"] <= card.memory_bytes, cap)
    slots = largest(lambda s: need(s * context, s)["total"] <= card.memory_bytes, 1 << 12) if context <= cap else 0
    return {
        "engine": "llamacpp",
        "gpu": card.name,
        "weights_format": "gguf-" + ftype,
        "file_bytes": round(file_bytes),
        "bits_per_weight": round(8 * file_bytes / spec.parameter_count, 3),
        "types": _by_type(ts),
        "n_gpu_layers": ngl,
        "model_buffer_bytes": round(gpu_w),
        "n_ctx": ctx,
        "kv_cells": now["cells"],
        "cache_type_k": cache_type_k,
        "cache_type_v": cache_type_v,
        "kv_buffer_bytes": round(now["kv"]),
        "kv_buffer_full_bytes": round(now["kv_full"]),  # llama-server prints the two caches of an iSWA model apart
        "kv_buffer_swa_bytes": round(now["kv_swa"]),
        "recurrent_state_bytes": round(now["recurrent"]),
        "n_batch": n_batch,
        "n_ubatch": ubatch,
        "flash_attn": flash_attn,
        "compute_buffer_bytes": round(now["compute"]),
        "non_torch_bytes": card.cuda_context_bytes,
        "needed_bytes": round(now["total"]),
        "fits": fits,
        "context": context,
        "max_context": longest,
        "max_context_capped": longest >= cap,
        "max_concurrent_sequences": slots,
    }


def _by_type(ts: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in ts:
        out[t["type"]] = out.get(t["type"], 0) + t["elements"]
    return out
