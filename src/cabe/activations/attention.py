"""Attention kernels: what eager attention, SDPA's flash, memory-efficient and math kernels, and sink attention save,
and their forward and backward transients, per token of one layer.

Flash and memory-efficient SDPA (as CUDA picks them) save q and k after rotary, v, the output and the fp32
log-sum-exp (4·nh); rotary saves nothing per layer (``q * cos`` keeps cos only). Eager attention saves the fp32
softmax (4·nh·s) and its cast (a·nh·s): quadratic in s. The math kernel upcasts q, k, v to fp32 and keeps the s×s
softmax (aten/src/ATen/native/transformers/attention.cpp). Which kernel runs is a fact of the request
(:mod:`cabe.facts`). Proved by tests/core_torch/test_saved_tensors.py, test_saved_tensors_mqa_sinks.py,
tests/trace/test_eager_views.py, test_eager_softmax_backward.py, test_falcon_flash.py, test_mechanisms.py."""

from __future__ import annotations

from cabe.activations.state import LayerState
from cabe.architecture import ModelSpec


def core(layer: LayerState) -> None:
    """The attention kernel's saved tensors (:func:`_attention_core`) with this layer's shapes and flags."""
    _attention_core(
        layer.add,
        layer.facts.attn,
        layer.facts.a_attn,
        layer.q,
        layer.facts.kv,
        layer.facts.nh,
        layer.facts.s,
        layer.facts.gqa,
        layer.facts.spec,
        layer.facts.quantized,
        layer.facts.autocast,
        layer.facts.key_cast,
        layer.facts.batch,
        layer.facts.gqa_repeat,
        _sink_bytes(layer),
    )


def _sink_bytes(layer: LayerState) -> int:
    """The bytes of gpt-oss's sink parameters, for ``cat``'s promotion: their dtype, or fp32 when they are
    16-bit in the other 16-bit dtype than autocast's (bf16 with fp16 promotes to fp32)."""
    b = layer.facts.dt_weight if layer.facts.base_trainable else layer.facts.dt_frozen
    other16 = layer.facts.autocast and {layer.facts.setup.dtype, layer.facts.setup.autocast} == {"bf16", "fp16"}
    return 4 if b == 2 and other16 else b


def fused_view_ok(quantized: bool, a: int, autocast: bool) -> bool:
    """Whether slices of a fused qkv output reach the attention kernel uncast (so the kernel saves views of
    it): always off QLoRA; under QLoRA only fp32 outputs without autocast (autocast casts bnb's fp32 output)."""
    return not quantized or (a == 4 and not autocast)


def _attention_core(
    add,
    attn: str,
    a: int,
    q: int,
    kv: int,
    nh: int,
    s: int,
    gqa: bool,
    spec: ModelSpec,
    quantized: bool = False,
    autocast: bool = False,
    key_cast: bool = False,
    batch: int = 1,
    gqa_repeat: bool = False,
    param_bytes: int = 4,
) -> None:
    if attn == "math":
        _math_attention_core(add, q, kv, nh, s, batch, gqa_repeat, spec.attention_dropout)
        return
    if attn == "eager" and spec.attention_sinks:
        _sink_attention_core(add, a, q, kv, nh, s, gqa, param_bytes, spec.attention_dropout)
        return
    # With QLoRA under autocast the fused output is fp32 and SDPA gets a 16-bit cast of v instead of the
    # view; without autocast and with fp32 queries nothing casts: v stays a strided view of the fused fp32
    # output, which the kernel saves (pythia-1.4b QLoRA, sdpa, no autocast: -7.9% without this).
    fused_view = spec.value_is_qkv_view and fused_view_ok(quantized, a, autocast)
    if attn == "efficient":
        _efficient_attention_core(add, a, q, kv, nh, s, gqa, spec, fused_view, key_cast)
        return
    if attn == "flash":
        add("attn.query", a * q, f"{a}·q")
        add("attn.key", a * kv, f"{a}·kv")
        if fused_view:
            # NOTE: v is a view of the fused qkv output (CUDA kernels take it strided): the whole storage
            # stays alive as long as v is saved
            add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
        else:
            add("attn.value", a * kv, f"{a}·kv")
        add("attn.output", a * q, f"{a}·q")
        add("attn.logsumexp", 4 * nh, "4·nh")
        return
    # What the two matmuls save. torch.matmul folds (b, heads, s, d) into bmm's (b·heads, s, d) with ``reshape``
    # (aten/src/ATen/native/LinearAlgebra.cpp, ``_matmul_impl``): a view only for one sequence (the strided
    # heads of a fused qkv, or the stride-0 heads of an expanded key, cannot merge with a batch dimension),
    # else a compact copy of every head. ``repeat_kv``'s ``expand(...).reshape(...)`` is a view for one kv head
    # (the size-1 kv dimension merges with the stride-0 repeat), a copy for more. So with b = 1 and one kv head
    # (or no grouping) the kernel keeps views: of the fused qkv output's whole storage where q / v are its
    # slices. (phi-3-mini QLoRA eager b8 s256 was +7.8% with the view at every batch; starcoderbase-3b QLoRA
    # eager b1 +5.8% with copies of k and v at b = 1.)
    # (an autocast cast of an expanded key is a full copy: ``_to_copy`` cannot keep stride-0 heads)
    uncast = fused_view_ok(quantized, a, autocast)
    shared = batch == 1 and (not gqa or (spec.num_kv_heads == 1 and uncast))
    kv_saved = kv if shared else q if gqa else kv
    kv_sym = "q" if kv_saved == q and kv != q else "kv"
    qkv_views = spec.qkv_views and uncast
    if qkv_views and shared:
        add("attn.qkv_fused", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
    else:
        add("attn.query", a * q, f"{a}·q")
        add("attn.key", a * kv_saved, f"{a}·{kv_sym}")
    if qkv_views and shared:
        pass
    elif fused_view and shared:
        add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")
    else:
        add("attn.value", a * kv_saved, f"{a}·{kv_sym}")
    if not spec.eager_softmax_fp32:  # NOTE: GPT-2's eager attention takes the softmax in the compute dtype
        sm = 4 if autocast else a  # ... but softmax is on autocast's fp32 list
        add("attn.softmax", sm * nh * s, f"{sm}·nh·s")
        if sm != a and not spec.attention_dropout > 0:
            # the second matmul (autocast's lower-precision list) casts the fp32 probabilities and saves the cast
            # (Llama 4's eager_attention_forward; GPT-2's casts them itself, .type(value.dtype)); with dropout the
            # matmul saves dropout's output instead (counted below)
            add("attn.probs", a * nh * s, f"{a}·nh·s")
    else:
        add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
        # NOTE: softmax(dtype=fp32).to(query.dtype): the cast is saved by the second matmul, unless dropout
        # follows it (dropout saves its mask only; the matmul saves dropout's output, counted below)
        if a != 4 and not spec.attention_dropout > 0:
            add("attn.probs", a * nh * s, f"{a}·nh·s")
    if spec.attn_logit_softcapping:
        add("attn.softcap_tanh", a * nh * s, f"{a}·nh·s")
    if spec.attention_dropout > 0:
        add("attn.dropout", (1 + a) * nh * s, f"(1+{a})·nh·s")


def forward_workspace(attn: str, a: int, nh: int, s: int) -> int:
    if attn == "eager":
        return 2 * a * nh * s  # raw scores and the masked scores before softmax
    return 0


def _efficient_attention_core(
    add, a: int, q: int, kv: int, nh: int, s: int, gqa: bool, spec: ModelSpec, fused_view: bool, key_cast: bool
) -> None:
    """Memory-efficient SDPA with a mask, as transformers calls it (integrations/sdpa_attention.py, 5.24:
    ``use_gqa_in_sdpa`` is false with a mask on CUDA, so ``repeat_kv`` materialises keys and values with every
    query head). PyTorch's CUDA branch of ``scaled_dot_product_attention`` (aten/src/ATen/native/transformers/
    attention.cpp) first turns the boolean mask into a new additive one of the query's dtype
    (``convert_boolean_attn_mask``: ``at::zeros_like`` + ``masked_fill_``; transformers' mask is a batch-expanded
    view, so the copy is b·s·s), pads and expands it (``preprocess_mask``, a view); the kernel saves q, k, v, that
    bias, its output, the fp32 logsumexp and the philox seed and offset.

    ``repeat_kv`` is ``expand(...).reshape(...)``: with one key/value head the reshape is a view (stride 0 over
    the heads) and nothing is copied, unless autocast then casts the expanded view (``key_cast``: a key that
    left the rotary product in the residual's dtype, cos and sin being cast to it)."""
    nkv = spec.num_kv_heads

    def kv_term(name: str, cast: bool) -> None:
        if gqa and (nkv > 1 or cast):
            add(name, a * q, f"{a}·q")
        else:
            add(name, a * kv, f"{a}·kv")

    add("attn.query", a * q, f"{a}·q")
    kv_term("attn.key", key_cast)
    if fused_view and not gqa:
        add("attn.value_fused_qkv", a * (q + 2 * kv), f"{a}·(q + 2·kv)")  # see _attention_core
    else:
        kv_term("attn.value", False)
    add("attn.output", a * q, f"{a}·q")
    add("attn.logsumexp", 4 * nh, "4·nh")
    s_pad = -(-s // 8) * 8  # preprocess_mask pads the last dimension to a multiple of 8
    add("attn.mask_bias", a * s_pad, f"{a}·s")


def _math_attention_core(
    add, q: int, kv: int, nh: int, s: int, batch: int, gqa_repeat: bool = False, dropout: float = 0.0
) -> None:
    """What PyTorch's math SDPA kernel saves (``_scaled_dot_product_attention_math``, aten/src/ATen/native/
    transformers/attention.cpp, torch 2.13): fp32 copies of q (scaled), k and v, and the fp32 softmax.

    With fewer kv heads than query heads and no ``enable_gqa`` (Falcon's multi-query call), k and v reach
    ``at::matmul`` as (b, kv_heads, s, d) against (b, nh, s, d): ``_matmul_impl`` (aten/src/ATen/native/
    LinearAlgebra.cpp) broadcasts the batch dimensions with ``expand(...).reshape(...)``, which copies, and
    ``BmmBackward0`` saves the copies: k and v are kept at the query's width, 4·q each (the trace of falcon-7b
    lists two fp32 (b·71)×1024×64 clones per layer). With batch 1 the reshape merges a size-1 dimension
    with the stride-0 head dimension, a view: k and v stay 4·kv (the trace shows the kv-wide tensors).

    ``gqa_repeat``: the call had ``enable_gqa`` (:func:`sdpa_gqa_math`); the kernel starts with
    ``key.repeat_interleave(nh / kv_heads, -3)`` and the same for value, copies at the query's width, and
    the matmuls save the scaled key and that value: 4·q each at any batch.

    ``dropout``: the kernel drops the probabilities itself (``at::dropout(attn, dropout_p, true)`` after
    ``_safe_softmax``): ``native_dropout`` saves its 1-byte mask and the second matmul saves its fp32 output
    (starcoderbase-1b, attn_pdrop 0.1, QLoRA without autocast: −30.5% without them)."""
    broadcast = kv < q and (batch > 1 or gqa_repeat)
    wide = q if broadcast else kv
    sym = "q" if broadcast else "kv"
    add("attn.query_fp32_scaled", 4 * q, "4·q")
    add("attn.key_fp32", 4 * wide, f"4·{sym}")
    add("attn.value_fp32", 4 * wide, f"4·{sym}")
    add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
    if dropout > 0:
        add("attn.dropout", (1 + 4) * nh * s, "(1+4)·nh·s")


def eager_backward_workspace(layer: LayerState, attn: str, a: int, nh: int, s: int) -> int:
    """Eager attention's backward beside all the layer saved (less its MLP's), per token. Autograd runs, in turn:

    - ``BmmBackward0`` of ``probs @ v``: the gradient of the probabilities (a·nh·s), then releases the saved
      16-bit probabilities (the ``.to(query.dtype)`` cast, when the softmax ran in fp32);
    - ``ToCopyBackward0`` of that cast: an fp32 copy of the gradient (4·nh·s), the 16-bit one freed after;
    - ``_softmax_backward_data``: its output in the softmax INPUT's dtype. ``softmax(x, dtype=float32)`` of an
      fp16 CUDA tensor runs ``_softmax(x, half_to_float=True)`` with no conversion (aten/src/ATen/native/
      SoftMax.cpp, torch 2.13, ``softmax(const Tensor&, int64_t, optional<ScalarType>)``: only for
      ``ScalarType::Half``), so the gradient comes back fp16 (a); a bf16 input is converted first
      (``input_.toType(dtype)``), so the gradient is fp32 (4) and ``ToCopyBackward0`` casts it after.
      Autocast's softmax (``fp32_set_opt_dtype``: the dtype argument set to fp32, the input left as it is)
      takes the same path: GPT-2's and Falcon's softmax under fp16 autocast too.

    So the workspace is a (the probabilities' gradient) beside everything saved; then 4 + 4 − a (fp16:
    4 + a − a) with the probabilities gone; without a cast (fp32 queries, or a softmax in the compute dtype)
    the gradient and softmax's backward output, 2a. pythia-6.9b LoRA fp16 eager: 2a + 4 counted the
    probabilities' gradient, their fp32 copy and a backward output all beside the saved probabilities, +6.3%
    against the trace; llama-2-7b bf16: +1.4%. gpt-oss's sink attention (softmax in the sinks' promoted dtype,
    sliced before the cast) keeps the bound 2a + 4 of an fp32 softmax."""
    if attn != "eager":
        return 0
    spec = layer.facts.spec
    if spec.attention_sinks:
        return (2 * a + (4 if a != 4 else 0)) * nh * s
    softmax = 4 if spec.eager_softmax_fp32 or layer.facts.autocast else a
    if softmax == a:
        return 2 * a * nh * s
    # the scores are fp16 when matmul's output is and, in the families whose eager attention adds a float causal
    # mask made in the embeddings' dtype (masking_utils.py ``eager_mask``: ``torch.where(mask, 0.0,
    # min_dtype).to(dtype)``), that mask is fp16 too; any other pair promotes them to fp32 before the softmax
    fp16 = _compute_dtype(layer) == "fp16"
    if spec.eager_softmax_fp32:
        # the mask is made in the embeddings' dtype: QLoRA without k-bit preparation loads them in the compute
        # dtype, not ``dtype`` (pythia-1.4b QLoRA fp32 / compute fp16 eager: +13.4% otherwise; seed 1450312958)
        fp16 = fp16 and layer.facts.loaded_dtype == "fp16" and layer.facts.rho == 2
    return max(a, 4, 4 if fp16 else 8 - a) * nh * s


def _compute_dtype(layer: LayerState) -> str:
    """The name of the matmuls' output dtype (``Dtypes.compute`` as a dtype): autocast's, an engine's gathered
    parameter dtype, or the weights' own."""
    setup = layer.facts.setup
    if layer.facts.a == 4:
        return "fp32"
    if layer.facts.autocast:
        return setup.autocast
    if setup.param_dtype != "none":
        return setup.param_dtype
    return layer.facts.loaded_dtype


def math_backward_workspace(attn: str, nh: int, s: int) -> int:
    """PyTorch's math SDPA kernel (``_scaled_dot_product_attention_math``, aten/src/ATen/native/transformers/
    attention.cpp, torch 2.13) computes in fp32 on CUDA. Its backward first makes the gradient of the
    probabilities (``BmmBackward0``: grad_out @ vᵀ, fp32 nh·s per token), then ``_safe_softmax``'s backward
    (tools/autograd/derivatives.yaml: ``_softmax_backward_data(grad, result, ...)``) writes the gradient of
    the scores, fp32 again, while the first is still alive: two fp32 s×s tensors beside the saved softmax."""
    return 2 * 4 * nh * s if attn == "math" else 0


def _sink_attention_core(
    add, a: int, q: int, kv: int, nh: int, s: int, gqa: bool, sink_bytes: int, dropout: float
) -> None:
    """Eager attention with learned sinks (``attention_sinks``; transformers 5.24,
    models/gpt_oss/modeling_gpt_oss.py, ``eager_attention_forward``): ``repeat_kv`` copies k and v to every
    query head (``expand(...).reshape(...)``); the scores get the sink logits as one more column
    (``torch.cat([attn_weights, sinks])``), minus their row maximum (``max(dim=-1)`` saves its int64 indices),
    and ``softmax(..., dtype=combined_logits.dtype)`` saves its output with that column: s + 1 values per
    head, in the wider of the scores' and the sinks' dtypes: ``cat`` promotes (autocast's promote list, and
    ``torch.cat``'s own type promotion without it), so 16-bit scores become fp32 with fp32 sinks (fp32 weights
    under autocast, or QLoRA's k-bit preparation) and stay 16-bit with 16-bit sinks (bf16 weights under
    autocast: gpt-oss-20b prompt tuning, ``--dtype auto --autocast bf16``, was +12.6% when this was read as
    fp32 under any autocast). ``sink_bytes`` is the sinks' parameter dtype. The second matmul saves the probabilities without the sink column: a view
    of the softmax output, or, under autocast, the ``.to(value_states.dtype)`` cast of it (a·nh·s)."""
    kv_saved, sym = (q, "q") if gqa else (kv, "kv")
    add("attn.query", a * q, f"{a}·q")
    add("attn.key", a * kv_saved, f"{a}·{sym}")
    add("attn.value", a * kv_saved, f"{a}·{sym}")
    add("attn.sink_max_indices", 8 * nh, "8·nh")
    sm = max(a, sink_bytes)
    add("attn.softmax_with_sink", sm * nh * (s + 1), f"{sm}·nh·(s+1)")
    if dropout > 0:  # dropout(probs[..., :-1]).to(v's dtype): the mask, and the matmul's input
        add("attn.dropout", (1 + a) * nh * s, f"(1+{a})·nh·s")
    elif sm != a:
        add("attn.probs", a * nh * s, f"{a}·nh·s")
