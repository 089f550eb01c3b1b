"""The MLP block: its norms, then a gated MLP (SwiGLU / GeGLU: gate output, activation output, up output and their
product, saved by ``down_proj`` when it trains: 4·a·f), a plain GELU MLP (2·a·f; 5·a·f for GPT-2's tanh-approximated
``gelu_new``, a chain of element-wise ops), or routed experts (:mod:`cabe.activations.moe`). Sources: transformers
5.24 models/llama/modeling_llama.py ``LlamaMLP``, models/gpt2 ``GPT2MLP``, activations.py ``NewGELUActivation``.
Proved by tests/core_torch/test_saved_tensors.py and tests/trace/test_lora_saved.py."""

from __future__ import annotations

from cabe import fp8
from cabe.activations import adapters, moe, norms
from cabe.activations.state import LayerState


def rms_mlp(layer: LayerState) -> None:
    """The MLP block of the RMSNorm lineage: its norms (pre, post or sandwich), then a gated MLP or an MoE block."""
    spec, h, rho, base_trainable = layer.facts.spec, layer.facts.h, layer.facts.rho, layer.facts.base_trainable
    wf = spec.norm_weight_fp32
    post_norm_only = spec.norm_placement == "post"
    sandwich = spec.norm_placement == "sandwich"
    # ---- MLP block -------------------------------------------------------------------------
    if post_norm_only:
        mlp_in_bytes = rho * h
    else:
        norms.rms_norm(layer, "mlp_norm", h, "h", base_trainable, wf)
        mlp_in_bytes = rho * h
    if layer.facts.group.mlp == "moe":
        moe.add_block(layer)
    else:
        _gated(layer, mlp_in_bytes)
    if sandwich or post_norm_only:
        norms.rms_norm(layer, "post_mlp_norm", h, "h", base_trainable, True)


def _gated(layer: LayerState, mlp_in_bytes: int) -> None:
    """A gated MLP (SwiGLU / GeGLU): gate, activation and up outputs, and the product down_proj saves."""
    h, f, a, rho, quantized = layer.facts.h, layer.facts.f, layer.facts.a, layer.facts.rho, layer.facts.quantized
    base_trainable, targets, adapter_cast = layer.facts.base_trainable, layer.facts.targets, layer.facts.adapter_cast
    up_names, down_name = layer.facts.up_names, layer.facts.down_name
    adapters.linear_inputs(layer, "mlp", [(n, h) for n in up_names], mlp_in_bytes, f"{rho}·h")
    adapters.lora_mid(layer, up_names)
    m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
    layer.add("mlp.gate_output", m * f, f"{m}·f")
    layer.add("mlp.act_output", m * f, f"{m}·f")
    layer.add("mlp.up_output", m * f, f"{m}·f")
    with layer.adapter_owned():  # what down_proj (or its lora_A) saves: its input
        if quantized and layer.facts.autocast:
            if down_name in targets:
                layer.add(f"mlp.{down_name}.input_cast", 2 * f, "2·f")
        elif layer.facts.setup.fp8 != "none" and adapters.te_saves_fp8(
            layer, down_name
        ):  # te.Linear keeps an fp8 copy; the product is freed
            layer.add(f"mlp.{down_name}.input_fp8", fp8.te_input_bytes(layer.facts.setup.fp8, f), "1·f")
        elif base_trainable or (down_name in targets and not adapter_cast):
            layer.add("mlp.product", a * f, f"{a}·f")
            layer.product_saved = (not layer.facts.autocast or layer.facts.adapter_native) and not layer.facts.dropout
        if adapter_cast and down_name in targets:
            adapters.lora_input_copy(layer, "mlp", down_name, f, "f")
    adapters.note_lora_input(layer, down_name, f, m)  # the product, in the MLP outputs' dtype
    adapters.lora_mid(layer, [down_name])


def ln_mlp(layer: LayerState) -> None:
    spec, h, f, a, rho, quantized = (
        layer.facts.spec,
        layer.facts.h,
        layer.facts.f,
        layer.facts.a,
        layer.facts.rho,
        layer.facts.quantized,
    )
    base_trainable, targets, adapter_cast = layer.facts.base_trainable, layer.facts.targets, layer.facts.adapter_cast
    up_names, down_name = layer.facts.up_names, layer.facts.down_name
    parallel, n_ln = spec.parallel_block, spec.norms_per_layer
    fc_name = up_names[0]
    if parallel:  # the MLP reads the layer's input through its norm, beside attention: not what attention made
        layer.live = layer.input_live
    elif layer.ln2_pending and layer.live:  # GPT-2's ln_2 on the residual attention made
        layer.add_stream(
            "ln2.input",
            (4 if layer.facts.autocast and rho != 4 else rho) * h,
            "4·h" if layer.facts.autocast else f"{rho}·h",
        )
        layer.add_stream("ln2.mean_rstd", 8, "8")
    if not parallel or n_ln == 2:
        adapters.linear_inputs(layer, "mlp", [(fc_name, h)], rho * h if n_ln == 2 else 0, f"{rho}·h")
    else:
        adapters.linear_inputs(layer, "mlp", [(fc_name, h)], 0, "")  # shares the attention block's LN output
    adapters.lora_mid(layer, [fc_name])
    chain = 4 if spec.activation in ("gelu_new", "gelu_fast") else 1
    down = down_name
    if chain > 1 and layer.facts.autocast:
        # NOTE: under autocast gelu_new's pow runs in fp32: x, tanh and the sum are fp32 copies; the
        # product is 16-bit, or fp32 when x itself is fp32 (QLoRA's Linear4bit output)
        layer.add("mlp.gelu_tanh_chain_fp32", 3 * 4 * f, "3·4·f")
        pb = 4 if quantized else 2
        layer.add("mlp.gelu_product", pb * f, f"{pb}·f")
        if base_trainable or down in targets:
            with layer.adapter_owned():
                layer.add(f"mlp.{down}.input_cast", 2 * f, "2·f")
                layer.down_input += 2 * f
    else:
        m = 4 if quantized else a  # Linear4bit returns its output in the input's dtype (fp32 here)
        layer.add("mlp.fc_output", m * f, f"{m}·f")
        if chain > 1:
            layer.add("mlp.gelu_tanh_chain", (chain - 1) * a * f, f"{chain - 1}·{a}·f")
        if base_trainable or (down in targets and not adapter_cast):
            with layer.adapter_owned():  # the input down (or its lora_A) saves
                layer.add("mlp.act_output", a * f, f"{a}·f")
                layer.down_input += a * f
    if adapter_cast and down in targets:
        with layer.adapter_owned():
            adapters.lora_input_copy(layer, "mlp", down, f, "f")
            layer.down_input += layer.facts.ad * f
    adapters.lora_mid(layer, [down])  # lora_A's output, saved by lora_B, as for every other adapted module
    if spec.hidden_dropout > 0:
        layer.add_stream("mlp.dropout_mask", h, "1·h")
