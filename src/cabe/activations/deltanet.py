"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): the saved tensors and kernel transients of a training
step. (The fixed state a served sequence keeps: :mod:`cabe.linear_attention`.)

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

Proved by tests/core_torch/test_saved_tensors_gated_deltanet.py (saved-tensor hooks on the kernels' stand-ins) and
tests/families/test_qwen3_next.py.
"""

from __future__ import annotations

from cabe.activations import adapters, norms
from cabe.activations.state import LayerState
from cabe.linear_attention import CHUNK
from cabe.mixers import GatedDeltaNet
from cabe.units import round_alloc


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


def add_block(layer: LayerState) -> None:
    """The gated DeltaNet block's saved tensors, added to ``layer`` (a ``cabe.activations.state.LayerState``): the input
    norm, the projections, conv, kernel, gated norm and output projection, as the module docstring lists them."""
    spec = layer.facts.spec
    dn = spec.gated_deltanet
    assert dn is not None
    h, a, rho, bt = layer.facts.h, layer.facts.a, layer.facts.rho, layer.facts.base_trainable
    if layer.facts.quantized:
        # QLoRA on the prepared model: the 4-bit in_proj_* return their fp32 input's dtype (bitsandbytes 0.50
        # nn/modules.py Linear4bit.forward, ``out.to(inp_dtype)``; autocast does not reach that custom function), so
        # conv, q, k, v, beta, the kernel's saved tensors and the gated norm's input are fp32 (traced: a 4-layer
        # Qwen3.5-0.8B text model under QLoRA, activations -14.6% against the trace with a = 2 here)
        a = 4
    kd, vd, hv, hk = dn.key_dim, dn.value_dim, dn.num_v_heads, dn.num_k_heads
    norms.rms_norm(layer, "input_norm", h, "h", bt, spec.norm_weight_fp32)
    if rho == 4:
        layer.input_alias = 4 * h  # the fp32 residual itself (see attention_block.rms_attention)
    names = layer.facts.qkv_names
    adapters.linear_inputs(layer, "attn", [(n, h) for n in names], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, names)
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
    norms.rms_norm(layer, "gdn.norm", vd, "vd", bt, False, hv, "Hv", in_bytes=a)
    # ``self.weight * x.to(input_dtype)``: type promotion to the weight's dtype when it is wider (fp32 weights under
    # autocast: ``mul`` is on no autocast list), saved by the product with the gate
    w = max(a, layer.facts.dt_weight if bt else layer.facts.dt_frozen)
    layer.add("gdn.norm_weighted", w * vd, f"{w}·vd")
    layer.add("gdn.gate_silu", 2 * 4 * vd, "2·4·vd")
    out = layer.facts.o_name
    layer.q = vd  # what out_proj reads, for its LoRA terms
    adapters.linear_inputs(layer, "attn.out", [(out, vd)], a * vd, f"{a}·vd")
    adapters.lora_mid(layer, [out])
    layer.mixer_forward = forward_workspace(dn, a, layer.facts.s)
    # (the bottom layer of LoRA's path with no in_proj adapted: the kernel's inputs need no grad, no backward runs)
    layer.mixer_backward = backward_workspace(dn, a, layer.facts.s) if mixer_live else 0
