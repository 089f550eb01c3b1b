"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the saved tensors of a training step and the fixed
state a served sequence keeps.

**Training.** transformers 5.24 (models/qwen3_next/modeling_qwen3_next.py, ``Qwen3NextGatedDeltaNet.forward``)
calls ``causal_conv1d_fn`` and ``chunk_gated_delta_rule`` through ``use_kernel_func_from_hub_with_fallback``
(integrations/hub_kernels.py): the causal-conv1d CUDA kernel and flash-linear-attention's Triton kernels when they
are installed — what users training on GPUs run —, a PyTorch fallback otherwise. The estimate follows the kernels,
read from their source (cited in :mod:`cabe.trace.linear_attention`, which makes the trace allocate the same
tensors: neither package runs on a CPU, so this part is modelled from the kernels' source, not traced — note
``gated_deltanet_kernels_modelled``). Per token of one layer, with a the compute dtype's bytes, ρ the residual's,
K = linear_key_head_dim, V = linear_value_head_dim, Hk / Hv the key / value heads, kd = Hk·K, vd = Hv·V and
C = 2·kd + vd the conv channels:

* the input RMSNorm (as every layer), and what ``in_proj_qkvz`` / ``in_proj_ba`` save of its output;
* ``beta = b.sigmoid()``: its output (a·Hv), which the kernel saves too; ``g = -exp(A_log) · softplus(a + dt_bias)``
  in fp32: softplus's input (4·Hv) and, when ``A_log`` trains, its output (4·Hv);
* ``CausalConv1dFn`` saves its input, the concatenated q, k, v (a·C);
* ``ChunkGatedDeltaRuleFunction`` saves the l2-normalised q and k (a·kd each) with one fp32 rstd per head
  (4·Hk each), a contiguous copy of v (a·vd), the chunk-local cumsum of g (4·Hv), beta, and the solved
  ``A`` (B, T, Hv, 64) in k's dtype (a·64·Hv);
* the gated RMSNorm (``Qwen3NextRMSNormGated``): its fp32 input (4·vd), one rsqrt per head (4·Hv), the normalised
  tensor cast back (a·vd, when its weight trains), the weighted tensor and the fp32 silu of the gate (a·vd — 4·vd
  with fp32 weights under autocast — + 4·vd, saved by the product), silu's fp32 input (4·vd); ``out_proj`` saves the a-dtype output (a·vd) when it trains.

Forward, the kernel's ``w``, ``u``, ``v_new`` (a·(Hv·K + 2·vd)) and the chunk states ``h`` (a·Hv·K·V/64) live
until it returns; backward recomputes them beside dv, dh, dq, dk, dw, dg, then ``prepare_wy_repr_bwd``'s
gradients (the workspace below).

The PyTorch fallback the trace would otherwise run (``torch_chunk_gated_delta_rule``) saves far more: q, k, v in
fp32, the chunk-padded copies, the fp32 64 × 64 decay and attention matrices of every chunk, and the recurrent
state once per chunk (``CABE_TRACE_GDN_FALLBACK=1 cabe trace ...`` shows it).

**Serving.** A linear-attention layer caches no token: each sequence keeps a conv state of C × kernel values in
the model's dtype (transformers 5.24 cache_utils.py ``LinearAttentionLayer.lazy_initialization``: the last
``conv_kernel_size`` inputs) and a recurrent state of Hv × K × V in fp32 (``torch_chunk_gated_delta_rule`` returns
it in fp32, and fla's ``chunk_gated_delta_rule_fwd_h`` makes ``final_state`` fp32: fla/ops/common/chunk_delta_h.py
:716), whatever the context length.
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import GatedDeltaNet, ModelSpec
from cabe.units import round_alloc

#: flash-linear-attention's chunk (``chunk_gated_delta_rule(chunk_size=64)``): the solved A is 64 wide
CHUNK = 64
#: bytes of the recurrent state's elements (fp32: see the module docstring)
RECURRENT_STATE_BYTES = 4
#: bytes of the conv state's elements: the projections' output dtype, 16-bit for a served checkpoint
CONV_STATE_BYTES = 2
#: the note a report carries when some layers are gated DeltaNet ones
NOTE = "gated_deltanet_kernels_modelled"


def linear_layers(spec: ModelSpec) -> int:
    """Layers whose token mixer is a gated DeltaNet."""
    return sum(g.count for g in spec.layer_groups if g.mixer == "gated_deltanet")


def state_bytes(spec: ModelSpec) -> int:
    """The fixed state one served sequence keeps in every linear-attention layer: conv + recurrent state."""
    dn = spec.gated_deltanet
    if dn is None:
        return 0
    per_layer = dn.conv_state_elements * CONV_STATE_BYTES + dn.recurrent_state_elements * RECURRENT_STATE_BYTES
    return linear_layers(spec) * per_layer


def state_breakdown(spec: ModelSpec, batch: int) -> dict[str, object]:
    """The serving state's figures, for the KV cache's breakdown."""
    dn = spec.gated_deltanet
    assert dn is not None
    return {
        "linear_attention_layers": linear_layers(spec),
        "conv_state_bytes_per_sequence": linear_layers(spec) * dn.conv_state_elements * CONV_STATE_BYTES,
        "recurrent_state_bytes_per_sequence": linear_layers(spec) * dn.recurrent_state_elements * RECURRENT_STATE_BYTES,
        "linear_state_bytes": batch * state_bytes(spec),
    }


def forward_workspace(dn: GatedDeltaNet, a: int, s: int) -> int:
    """Per token: the kernel's ``w``, ``u``, ``v_new`` and chunk states ``h`` while its forward runs."""
    nt = -(-s // CHUNK)
    return a * (dn.num_v_heads * dn.head_k_dim + 2 * dn.value_dim) + round_alloc(
        a * nt * dn.num_v_heads * dn.head_k_dim * dn.head_v_dim
    ) // max(s, 1)


def backward_workspace(dn: GatedDeltaNet, a: int, s: int) -> int:
    """Per token, the kernel's backward at its widest (``chunk_gated_delta_rule_bwd`` before its locals go): the
    recomputed w, u, v_new and h, dh, dv (twice), dq and dk over the value heads (and their sums over the key
    heads when Hv > Hk), dg (fp32, twice), dw, then dk2, dv3, dg2, db; beside it the incoming gradient of o."""
    hv, k, v = dn.num_v_heads, dn.head_k_dim, dn.value_dim
    nt = -(-s // CHUNK)
    states = 2 * round_alloc(a * nt * hv * k * dn.head_v_dim) // max(s, 1)  # h and dh
    grouped = dn.num_v_heads != dn.num_k_heads
    per = a * (hv * k + v + v)  # w, u, v_new
    per += 2 * a * v  # dv (chunk_bwd_dv_local) and dv2
    per += a * 3 * hv * k  # dq, dk, dw
    per += 2 * a * dn.key_dim if grouped else 0  # dq, dk summed over the key heads
    per += 2 * 4 * hv  # dg (one K block) and its sum
    per += a * (hv * k + v) + 4 * hv + a * hv  # dk2, dv3, dg2, db
    per += a * dn.key_dim if grouped else 0  # dk2 summed
    return per + states


def add_block(layer: Any) -> None:
    """The gated DeltaNet block's saved tensors, added to ``layer`` (a ``cabe.activations._Layer``): the input
    norm, the projections, conv, kernel, gated norm and output projection, as the module docstring lists them."""
    spec = layer.spec
    dn: GatedDeltaNet = spec.gated_deltanet
    h, a, rho, bt = layer.h, layer.a, layer.rho, layer.base_trainable
    if layer.quantized:
        # QLoRA on the prepared model: the 4-bit in_proj_* return their fp32 input's dtype (bitsandbytes 0.50
        # nn/modules.py Linear4bit.forward, ``out.to(inp_dtype)``; autocast does not reach that custom function), so
        # conv, q, k, v, beta, the kernel's saved tensors and the gated norm's input are fp32 (traced: a 4-layer
        # Qwen3.5-0.8B text model under QLoRA, activations -14.6% against the trace with a = 2 here)
        a = 4
    kd, vd, hv, hk = dn.key_dim, dn.value_dim, dn.num_v_heads, dn.num_k_heads
    layer.rms_norm("input_norm", h, "h", bt, spec.norm_weight_fp32)
    if rho == 4:
        layer.input_alias = 4 * h  # the fp32 residual itself (see _Layer._rms_attention)
    names = layer.qkv_names
    layer.linear_inputs("attn", [(n, h) for n in names], rho * h, f"{rho}·h")
    layer.lora_mid(names)
    # in the bottom layer of LoRA's path (``layer.live`` false until an adapted in_proj joins) the mixer saves
    # nothing: the kernel is an autograd Function whose inputs need no grad
    mixer_live = layer.live
    layer.add("gdn.beta", a * hv, f"{a}·Hv")
    layer.add("gdn.softplus_input", 4 * hv, "4·Hv")
    if bt:
        layer.add("gdn.softplus_output", 4 * hv, "4·Hv")
    layer.add("gdn.conv_input", a * dn.conv_dim, f"{a}·(2·kd + vd)")
    layer.add("gdn.q_k_normalized", 2 * a * kd, f"2·{a}·kd")
    layer.add("gdn.q_k_rstd", 2 * 4 * hk, "2·4·Hk")
    layer.add("gdn.value", a * vd, f"{a}·vd")
    layer.add("gdn.g_cumsum", 4 * hv, "4·Hv")
    layer.add("gdn.A", a * CHUNK * hv, f"{a}·64·Hv")
    layer.rms_norm("gdn.norm", vd, "vd", bt, False, hv, "Hv", in_bytes=a)
    # ``self.weight * x.to(input_dtype)``: type promotion to the weight's dtype when it is wider (fp32 weights under
    # autocast: ``mul`` is on no autocast list), saved by the product with the gate
    w = max(a, layer.dt_weight if bt else layer.dt_frozen)
    layer.add("gdn.norm_weighted", w * vd, f"{w}·vd")
    layer.add("gdn.gate_silu", 2 * 4 * vd, "2·4·vd")
    out = layer.o_name
    layer.q = vd  # what out_proj reads, for its LoRA terms
    layer.linear_inputs("attn.out", [(out, vd)], a * vd, f"{a}·vd")
    layer.lora_mid([out])
    layer.mixer_forward = forward_workspace(dn, a, layer.s)
    # (the bottom layer of LoRA's path with no in_proj adapted: the kernel's inputs need no grad, no backward runs)
    layer.mixer_backward = backward_workspace(dn, a, layer.s) if mixer_live else 0


def add_output_gate(layer: Any, copies_output: bool, output_counted: bool) -> None:
    """Gated attention's extra saved tensors (transformers 5.24 ``Qwen3NextAttention.forward``:
    ``attn_output = attn_output.reshape(...).contiguous() * torch.sigmoid(gate)``, then ``o_proj``): the sigmoid's
    output (a·q), the attention output the product saves (a contiguous copy when the kernel's output is laid out
    (b, heads, s, d); already counted when o_proj would have saved it), and the product o_proj saves when it trains
    or is adapted. ``output_counted``: the copy was counted as o_proj's input (``_Layer._o_proj_input``)."""
    a, q = layer.a, layer.q
    layer.add("attn.gate_sigmoid", a * q, f"{a}·q")
    if copies_output and not output_counted:
        layer.add("attn.output_for_gate", a * q, f"{a}·q")
    if layer.base_trainable or layer.o_name in layer.targets:
        layer.add("attn.gated_output", a * q, f"{a}·q")
