"""Multi-head latent attention (DeepSeek-V2 / V3) and DeepSeek-V3.2's lightning indexer: the low-rank query and
key-value paths with their norms, ``expand_kv``'s key and value, the kernel's saved tensors, and the indexer's
no-grad scoring transient (transformers 5.24 models/deepseek_v3/modeling_deepseek_v3.py,
models/deepseek_v32/modeling_deepseek_v32.py). Proved by tests/trace/test_deepseek_trace.py (fake CUDA) and
tests/core_torch/test_saved_tensors.py."""

from __future__ import annotations

from cabe.activations import adapters, attention_block, norms
from cabe.activations.state import LayerState

#: saved terms of a DeepSeek-V3.2 layer counted after the indexer's point but made before it ran: expand_kv's value
#: (kv_b_proj's output, or flash's padded copy of it) exists when ``DeepseekV32Attention.forward`` calls the indexer
BEFORE_INDEXER = frozenset(("attn.kv_b_output", "attn.value", "attn.value_padded"))


def latent_attention(layer: LayerState) -> None:
    """Multi-head latent attention (transformers 5.24, models/deepseek_v3/modeling_deepseek_v3.py,
    ``DeepseekV3Attention.forward`` and ``expand_kv``), checked against the fake-CUDA trace:

    * ``q_a_proj`` and ``kv_a_proj_with_mqa`` read the normed input (one tensor); ``q_a_layernorm`` and
      ``kv_a_layernorm`` are RMSNorms over the ranks (their fp32 upcast, rsqrt, normalised tensor), and
      their outputs are what ``q_b_proj`` and ``kv_b_proj`` save.
    * rotary multiplies slices of q and of the shared rotary key by cos and sin, which saves only cos and
      sin (the model's, made once); ``torch.cat((q_pass, q_rot))`` makes the query anew.
    * ``expand_kv``: the key is a new tensor (``new_empty`` + two ``copy_``), heads × (nope + rope); the
      value is a split view of ``kv_b_proj``'s output, so the kernel that saves it keeps that whole
      output alive: heads × (nope + v_head_dim).
    * SDPA: query / key heads (nope + rope) differ from value heads (v_head_dim), which flash refuses
      (``can_use_flash_attention`` checks equal head dims, aten/src/ATen/native/transformers/cuda/
      sdp_utils.cpp); with no mask (causal) CUDA runs the memory-efficient kernel, which saves q, k, v,
      its output (heads × v_head_dim, already laid out as o_proj reads it) and the fp32 logsumexp.
      Eager saves the fp32 softmax and its cast, a copy of the value (``bmm`` reshapes the strided view)
      and o_proj a contiguous copy of the output (tests/core_torch/test_saved_tensors.py).
    """
    spec, h, nh, s, a, rho = (
        layer.facts.spec,
        layer.facts.h,
        layer.facts.nh,
        layer.facts.s,
        layer.facts.a,
        layer.facts.rho,
    )
    la = spec.latent_attention
    assert la is not None
    bt, names = layer.facts.base_trainable, layer.facts.qkv_names
    # In the bottom layer of LoRA's path (``live`` false on entry) the query's path requires grad from an adapted
    # q_a_proj / q_proj / q_b_proj on, the key and value's from an adapted kv_a_proj_with_mqa / kv_b_proj on;
    # each op saves only for the inputs that require grad (eager's q @ kᵀ the key for the query's gradient and
    # the query for the key's, probs @ v the probabilities for v's); the fused kernels save all they read
    entry, targets = layer.live, layer.facts.targets
    q_live = entry or any(n in targets for n in ("q_a_proj", "q_proj", "q_b_proj"))
    kv_live = entry or any(n in targets for n in ("kv_a_proj_with_mqa", "kv_b_proj"))
    norms.rms_norm(layer, "input_norm", h, "h", bt, spec.norm_weight_fp32)
    readers = [n for n in names if n in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa")]
    adapters.linear_inputs(layer, "attn", [(n, h) for n in readers], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, readers)
    for norm, rank, sym, proj, first in (
        ("q_a_layernorm", la.q_lora_rank, "r_q", "q_b_proj", "q_a_proj"),
        ("kv_a_layernorm", la.kv_lora_rank, "r_kv", "kv_b_proj", "kv_a_proj_with_mqa"),
    ):
        if not rank:
            continue
        layer.live = entry or first in targets
        norms.rms_norm(layer, f"attn.{norm}", rank, sym, bt, False, in_bytes=a)
        adapters.linear_inputs(layer, f"attn.{proj}", [(proj, rank)], a * rank, f"{a}·{sym}")
        adapters.lora_mid(layer, [proj])
    layer.live = q_live or kv_live
    eager = layer.facts.attn == "eager" and layer.facts.setup_attention != "flash"
    a_attn = layer.facts.a_attn
    qk, kvb, vo = nh * la.qk_head_dim, nh * (la.nope_dim + la.v_head_dim), nh * la.v_head_dim
    if kv_live or not eager:
        layer.add("attn.query", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
    if q_live or not eager:
        layer.add("attn.key", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
    if la.index_heads:
        _indexer_transient(layer)
    if la.index_heads and layer.facts.attn != "eager":
        # DeepseekV32Attention.forward folds the indexer's top-k into a boolean mask for SDPA; PyTorch's CUDA
        # branch turns it into an additive one of the query's dtype (convert_boolean_attn_mask), which the
        # memory-efficient kernel saves, padded to a multiple of 8 (see _efficient_attention_core)
        layer.add("attn.mask_bias", a_attn * (-(-s // 8) * 8), f"{a_attn}·s")
    if layer.facts.setup_attention == "flash":
        # flash_attention_2 (integrations/flash_attention.py, 5.24) pads v to the q / k head dim and crops the
        # kernel's output, which reshape then copies for o_proj (counted by _o_proj_input)
        layer.add("attn.value_padded", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
        layer.add("attn.output_padded", a_attn * qk, f"{a_attn}·nh·(d_nope + d_rope)")
        layer.add("attn.logsumexp", 4 * nh, "4·nh")
    elif layer.facts.attn == "eager":
        # matmul(probs, v) reshapes the strided value view for bmm: a copy, saved in its place
        layer.add("attn.value", a * vo, f"{a}·nh·d_v")
        layer.add("attn.softmax_fp32", 4 * nh * s, "4·nh·s")
        if a != 4 and kv_live:
            layer.add("attn.probs", a * nh * s, f"{a}·nh·s")
    elif layer.facts.quantized and layer.facts.autocast:
        # QLoRA under autocast: kv_b_proj's 4-bit layer returns fp32, and autocast casts q, k and v to 16 bits
        # for SDPA: the kernel saves the value's contiguous cast, not kv_b_proj's output
        layer.add("attn.value_cast", a_attn * vo, f"{a_attn}·nh·d_v")
        layer.add("attn.output", a_attn * vo, f"{a_attn}·nh·d_v")
        layer.add("attn.logsumexp", 4 * nh, "4·nh")
    else:
        # the fused kernels take the strided value view: kv_b_proj's whole output stays alive
        layer.add("attn.kv_b_output", a * kvb, f"{a}·nh·(d_nope + d_v)")
        layer.add("attn.output", a_attn * vo, f"{a_attn}·nh·d_v")
        layer.add("attn.logsumexp", 4 * nh, "4·nh")
    layer.q = vo  # what o_proj reads, for its LoRA terms
    if layer.facts.setup_attention == "flash" and (bt or layer.facts.o_name in layer.facts.targets):
        layer.add("attn.output_for_o_proj", a_attn * vo, f"{a_attn}·nh·d_v")  # the cropped output, copied
    attention_block.o_proj_input(layer)
    adapters.lora_mid(layer, [layer.facts.o_name])


def _indexer_transient(layer: LayerState) -> None:
    """DeepSeek-V3.2's lightning indexer (transformers 5.24 models/deepseek_v32/modeling_deepseek_v32.py,
    ``DeepseekV32Indexer.forward``, under ``torch.no_grad``: nothing saved) scores every query against every key
    with ``torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1))``: q is (b, s, H_I, D_I), k
    (b, 1, D_I, s). ``at::matmul`` broadcasts the batch dimensions with ``expand(...).reshape(...)``
    (``_matmul_impl``, aten/src/ATen/native/LinearAlgebra.cpp), which copies k once per query: a (b·s, D_I, s)
    tensor, beside the (b·s, H_I, s) scores ``bmm`` writes. The matmul runs in fp32 (the ``.float()`` casts) or,
    under autocast, in 16 bits (matmul is on autocast's lower-precision list: it casts both again). Per token,
    at that moment: the rotated q and k (the compute dtype), their ``.float()`` copies (none when already fp32),
    autocast's 16-bit casts, the broadcast copy of k and the scores; then the scaled scores beside the scores.
    Traced on fake CUDA
    (tests/trace/test_deepseek_trace.py): a 2 × 512-token tiny V3.2 shows the 128 MiB clone at the forward peak.
    """
    la = layer.facts.spec.latent_attention
    assert la is not None
    a, s, hi, di = layer.facts.a, layer.facts.s, la.index_heads, la.index_head_dim
    mm = 2 if layer.facts.autocast else 4  # the dtype the scoring matmul runs in
    # the rotated q and k, torch.cat'd (locals until the end): rotary multiplies by cos and sin in the residual's
    # dtype, so an fp32 residual promotes them to fp32
    qd = max(a, layer.facts.rho)
    qk = qd * (hi * di + di)
    casts = (4 * (hi * di + di) if qd != 4 else 0) + (mm * (hi * di + di) if mm != 4 else 0)
    # with one sequence the expanded k reshapes to a view (a size-1 dimension merges with the stride-0 one):
    # bmm reads it as it is, nothing is copied (as in _math_attention_core)
    broadcast = mm * di * s if layer.facts.batch > 1 else 0
    # the matmul's moment (its operands' casts, the broadcast k, the scores), or the next one: the scores
    # times softmax_scale beside the scores (then relu's output beside those: the same two)
    layer.indexer_transient = qk + max(casts + broadcast + mm * hi * s, 2 * mm * hi * s)
    # the attention's query is still the torch.cat of the rotated halves there (promoted to the residual's
    # dtype): autocast casts it to 16 bits for SDPA only after the indexer, and SDPA saves that cast (which is
    # then counted after the indexer)
    qm = layer.facts.nh * la.qk_head_dim
    layer.indexer_from = len(layer.terms)
    if qd > layer.facts.a_attn:
        layer.indexer_transient += qd * qm
        layer.indexer_from -= 2  # attn.query, attn.key: made before the indexer, but the query's cast after it
        layer.indexer_transient += layer.terms[-1].bytes_per_token  # the key (no cast) exists already
        if layer.facts.quantized:  # ... built in kv_b_proj's fp32 output dtype (``kv_nope.new_empty``): 4 bytes, not a
            layer.indexer_transient += (4 - layer.facts.a_attn) * qm
    # DeepseekV32Attention.forward's locals while the indexer runs (modeling_deepseek_v32.py:416-441, 5.24):
    # q_b_proj's output (q_pass and q_rot are views of it), in its output dtype — fp32 from a 4-bit layer, which
    # returns its (fp32) input's dtype, with the LoRA sum —; under QLoRA also kv_b_proj's fp32 output (k_nope and
    # value_states are views of it: the kernel later saves the value's 16-bit cast, made after the indexer)
    qb = 4 if layer.facts.quantized else a
    layer.indexer_transient += qb * qm
    if layer.facts.quantized:
        layer.indexer_transient += 4 * layer.facts.nh * (la.nope_dim + la.v_head_dim)
