"""The attention block around the kernel: its norms (pre, post, sandwich; per-head and full q / k norms, Llama 4's L2
norm), the q / k / v projections' saved inputs and their adapters, the kernel (:mod:`cabe.activations.attention`),
the output's contiguous copy and casts before the output projection, Qwen3-Next's sigmoid output gate, and the
LayerNorm blocks' attention half (GPT-2, GPT-NeoX, Falcon: norm statistics, parallel blocks, residual dropout).

Sources: transformers 5.24 models/llama/modeling_llama.py (``LlamaAttention.forward``), models/gpt2 and
models/gpt_neox, models/qwen3_next (``Qwen3NextAttention.forward``). Proved by tests/core_torch/test_saved_tensors.py,
test_saved_tensors_gated_deltanet.py (the gated attention layer), tests/trace/test_lora_saved.py,
test_bottom_layer.py."""

from __future__ import annotations

from cabe import fp8
from cabe.activations import adapters, attention, norms
from cabe.activations.state import LayerState


def rms_attention(layer: LayerState) -> None:
    spec, h, q, kv, nh = layer.facts.spec, layer.facts.h, layer.q, layer.facts.kv, layer.facts.nh
    a, rho = layer.facts.a, layer.facts.rho
    base_trainable, qkv_names, o_name = layer.facts.base_trainable, layer.facts.qkv_names, layer.facts.o_name
    wf = spec.norm_weight_fp32
    post_norm_only = spec.norm_placement == "post"
    sandwich = spec.norm_placement == "sandwich"
    # ---- attention block -----------------------------------------------------------------
    if post_norm_only:
        attn_in_bytes, attn_in_formula = rho * h, f"{rho}·h"  # the residual itself feeds q, k, v
    else:
        norms.rms_norm(layer, "input_norm", h, "h", base_trainable, wf)
        attn_in_bytes, attn_in_formula = rho * h, f"{rho}·h"
        if rho == 4:
            # RMSNorm's ``hidden_states.to(torch.float32)`` returns an fp32 input itself (models/llama/
            # modeling_llama.py:66, transformers 5.24), and the multiply saves it: the layer's input. A
            # recomputed layer (checkpointing) re-saves the checkpoint's input tensor, no new memory.
            layer.input_alias = 4 * h
    adapters.linear_inputs(layer, "attn", [(n, h) for n in qkv_names], attn_in_bytes, attn_in_formula)
    adapters.lora_mid(layer, qkv_names)
    if spec.qk_norm == "l2" and layer.facts.group.rope:
        # Llama 4's Llama4TextL2Norm (no weight) after rotary: the fp32 q and k and one rsqrt per head
        norms.rms_norm(layer, "q_l2_norm", q, "q", False, False, nh, "nh", in_bytes=a)
        norms.rms_norm(layer, "k_l2_norm", kv, "kv", False, False, spec.num_kv_heads, "nkv", in_bytes=a)
    if spec.nope_temperature_tuning and not layer.facts.group.rope:
        # Llama4TextAttention.forward: query * attn_scales, an fp32 (s,) vector made in each NoPE layer and
        # saved by the multiply (an expanded view of it); the product is cast back to the query's dtype
        layer.constant += 4 * layer.facts.s
    if spec.qk_norm == "head":
        # per-head norms: one rsqrt per head
        norms.rms_norm(layer, "q_norm", q, "q", base_trainable, wf, nh, "nh", in_bytes=a)
        norms.rms_norm(layer, "k_norm", kv, "kv", base_trainable, wf, spec.num_kv_heads, "nkv", in_bytes=a)
    elif spec.qk_norm == "full":
        norms.rms_norm(layer, "q_norm", q, "q", base_trainable, True)
        norms.rms_norm(layer, "k_norm", kv, "kv", base_trainable, True)
    attention.core(layer)
    o_proj_input(layer)
    adapters.lora_mid(layer, [o_name])
    if sandwich:
        norms.rms_norm(layer, "post_attention_norm", h, "h", base_trainable, True)
    if post_norm_only:
        norms.rms_norm(layer, "post_attention_norm", h, "h", base_trainable, True)


def _attention_output_copied(layer: LayerState) -> bool:
    """Whether ``attn_output.transpose(1, 2).contiguous()`` copies the kernel's output before the output
    projection. Eager and math outputs are (b, heads, s, d) matmul results: always. Flash writes its
    output like its query (``empty_like``, which keeps the strides of a query that ``torch.cat`` made
    (b, heads, s, d): partial rotary, GPT-NeoX and Phi-3), so it copies after such a rotary. The
    memory-efficient kernel (fp32 queries) always allocates (b, s, heads, d) (aten/src/ATen/native/
    transformers/cuda/attention.cpp, ``_efficient_attention_forward``): the transpose is a view
    (pythia-1.4b QLoRA without autocast: +6.3% with a copy counted)."""
    if layer.facts.attn in ("eager", "math"):
        return True
    return layer.facts.spec.rotary_by_cat and layer.facts.attn == "flash" and layer.facts.a_attn == 2


def o_proj_input(layer: LayerState) -> None:
    """What the output projection's input leaves saved (its LoRA, a contiguous copy, casts)."""
    with layer.adapter_owned():
        _o_proj_saved(layer)


def _o_proj_saved(layer: LayerState) -> None:
    a, q, targets = layer.facts.a, layer.q, layer.facts.targets
    o_name, adapter_cast, base_trainable = layer.facts.o_name, layer.facts.adapter_cast, layer.facts.base_trainable
    # eager, and flash after a rotary written with torch.cat (Phi-3): the kernel's output is laid out
    # (b, heads, s, d), so transpose(1, 2).contiguous() copies it before o_proj. (Under autocast with
    # an fp32 residual the attention output is already 16-bit: o_proj saves it without a cast; QLoRA's
    # bitsandbytes lora_A saves the 16-bit attention output itself, counted as attn.output.)
    # (the math kernel's output is a (b, heads, s, d) matmul result too)
    if (
        layer.facts.setup.fp8 != "none"
        and adapters.te_saves_fp8(layer, o_name)
        and not layer.facts.spec.attention_output_gate
    ):
        # te.Linear keeps an fp8 copy of its input (cabe.fp8.te_input_bytes); a contiguous copy is freed after it
        layer.add(f"attn.{o_name}.input_fp8", fp8.te_input_bytes(layer.facts.setup.fp8, q), "1·q")
        return
    copies_output = _attention_output_copied(layer)
    output_counted = copies_output and (base_trainable or (o_name in targets and not adapter_cast))
    if output_counted:
        layer.add("attn.output_for_o_proj", a * q, f"{a}·q")
    if layer.facts.spec.attention_output_gate:  # o_proj(attn · sigmoid(gate)): Qwen3-Next (cabe.linear_attention)
        add_output_gate(layer, copies_output, output_counted)
    _dropout_copy(layer, o_name, copies_output)
    if layer.facts.a_attn != a and not copies_output and cast_back_saved(layer, o_name):
        layer.add("attn.output_cast_back", a * q, f"{a}·q")  # flash_attention_2's output, back to fp32
    if adapter_cast and o_name in targets:
        adapters.lora_input_copy(layer, "attn", o_name, q, "q")
    if adapters.auto_cast_input(layer) and o_name in targets and not copies_output:
        # PEFT's Linear casts lora_A's input to fp32 even under autocast (_cast_input_dtype; only its
        # bitsandbytes layers skip it), and autocast casts that back: lora_A saves a new 16-bit copy
        layer.add(f"attn.{o_name}.lora_input_cast", 2 * q, "2·q")


def cast_back_saved(layer: LayerState, name: str) -> bool:
    """Whether the output projection ``name`` saves the attention kernel's output cast back to the compute dtype: its
    trained base does (mm saves its input only for its weight's gradient: torch's autograd codegen, derivatives.yaml
    ``mm``), or its lora_A reading it as it is; not a lora_A that reads PEFT's copy in the adapters' dtype
    (``adapter_cast``: TRL's bf16 adapters on QLoRA's fp32 residual; gpt2 QLoRA DPO without autocast, flash: the
    trace keeps no fp32 copy, +0.5% with it)."""
    return layer.facts.base_trainable or (name in layer.facts.targets and not layer.facts.adapter_cast)


def _dropout_copy(layer: LayerState, name: str, copies_output: bool) -> None:
    """Dropout's output before an output projection whose lora_A would read attention's own saved
    output (flash keeps it; no cast, no autocast): a copy of lora_A's own."""
    plain = not layer.facts.adapter_cast and not layer.facts.autocast
    if (
        layer.facts.dropout
        and name in layer.facts.targets
        and not copies_output
        and (plain or adapters.bnb_direct(layer, name, layer.facts.a))
    ):
        layer.add(f"attn.{name}.lora_dropout_output", layer.facts.a * layer.q, f"{layer.facts.a}·q")


def ln_attention(layer: LayerState) -> None:
    spec, h, rho, qkv_names = layer.facts.spec, layer.facts.h, layer.facts.rho, layer.facts.qkv_names
    ln_stats = 8  # mean and rstd, fp32 per token
    parallel = spec.parallel_block
    n_ln = spec.norms_per_layer
    if not layer.live:  # the lowest layer of the gradient's path: no norm reading its input saves anything
        layer.ln2_pending = not parallel and n_ln == 2  # the MLP's norm reads the residual after attention
    elif layer.facts.autocast and rho != 4:
        # layer_norm is on autocast's fp32 list: each norm saves its own fp32 cast of a 16-bit input
        layer.add_stream("ln.input_fp32", 4 * h * n_ln, f"{n_ln}·4·h" if n_ln > 1 else "4·h")
    else:
        formula = f"{rho}·h" if parallel or n_ln == 1 else f"{n_ln}·{rho}·h"
        layer.add_stream("ln.input", rho * h * (1 if parallel else n_ln), formula)
    layer.add_stream("ln.mean_rstd", ln_stats * n_ln, f"{n_ln}·8")
    layer.input_live = layer.live
    # one fused projection (GPT-2's c_attn), or separate q, k, v reading the same norm output (SigLIP's)
    adapters.linear_inputs(layer, "attn", [(n, h) for n in qkv_names], rho * h, f"{rho}·h")
    adapters.lora_mid(layer, list(qkv_names))
    attention.core(layer)
    _dense_input(layer)
    if spec.hidden_dropout > 0:
        layer.add_stream("attn.resid_dropout_mask", h, "1·h")


def _dense_input(layer: LayerState) -> None:
    """What the LayerNorm blocks' output projection (dense / c_proj) leaves saved."""
    with layer.adapter_owned():
        _dense_saved(layer)


def _dense_saved(layer: LayerState) -> None:
    a, q, targets = layer.facts.a, layer.q, layer.facts.targets
    base_trainable, adapter_cast = layer.facts.base_trainable, layer.facts.adapter_cast
    out_name = layer.facts.o_name
    # eager, and flash after GPT-NeoX's partial rotary (torch.cat): the output is copied before dense
    copies_output = _attention_output_copied(layer)
    if copies_output and (base_trainable or (out_name in targets and not adapter_cast)):
        layer.add("attn.output_for_dense", a * q, f"{a}·q")  # (an fp32 LoRA saves its own cast instead)
    _dropout_copy(layer, out_name, copies_output)
    if layer.facts.a_attn != a and not copies_output and cast_back_saved(layer, out_name):
        layer.add("attn.output_cast_back", a * q, f"{a}·q")  # flash_attention_2's output, back to fp32
    if adapters.auto_cast_input(layer) and out_name in targets and not copies_output:
        layer.add(f"attn.{out_name}.lora_input_cast", 2 * q, "2·q")  # PEFT's fp32 cast, cast back
    if adapter_cast and out_name in targets:
        adapters.lora_input_copy(layer, "attn", out_name, q, "q")
    adapters.lora_mid(layer, [out_name])  # lora_A's output, saved by lora_B (peft tuners/lora/layer.py Linear.forward)


def add_output_gate(layer: LayerState, copies_output: bool, output_counted: bool) -> None:
    """Gated attention's extra saved tensors (transformers 5.24 ``Qwen3NextAttention.forward``:
    ``attn_output = attn_output.reshape(...).contiguous() * torch.sigmoid(gate)``, then ``o_proj``): the sigmoid's
    output (a·q), the attention output the product saves (a contiguous copy when the kernel's output is laid out
    (b, heads, s, d); already counted when o_proj would have saved it), and the product o_proj saves when it trains
    or is adapted. ``output_counted``: the copy was counted as o_proj's input (``attention_block.o_proj_input``)."""
    a, q = layer.facts.a, layer.q
    layer.add("attn.gate_sigmoid", a * q, f"{a}·q")
    if copies_output and not output_counted:
        layer.add("attn.output_for_gate", a * q, f"{a}·q")
    if layer.facts.base_trainable or layer.facts.o_name in layer.facts.targets:
        layer.add("attn.gated_output", a * q, f"{a}·q")
