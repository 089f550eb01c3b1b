"""Qwen MoE (Qwen 2 MoE and Qwen 3 MoE): a Qwen layer whose MLP is, in most layers, a mixture of
``num_experts`` SwiGLU experts of width ``moe_intermediate_size``, ``num_experts_per_tok`` of them per
token, behind a bare router weight. A layer is dense (a SwiGLU MLP of ``intermediate_size``) when its
index is in ``mlp_only_layers`` or when ``(index + 1) % decoder_sparse_step`` is not 0 (transformers 5,
models/qwen3_moe/modeling_qwen3_moe.py and models/qwen2_moe/modeling_qwen2_moe.py, the decoder layer's
``__init__``): such a model is runs of dense and MoE layers, bottom first.

As in Mixtral, transformers 5 stores the experts as two 3-D parameters (gate_up_proj, down_proj) and the
router as a bare weight: none of them is an nn.Linear that LoRA or bitsandbytes would replace; the dense
layers' gate_proj, up_proj and down_proj are.

What differs: Qwen 3 MoE normalises q and k per head and has no biases; Qwen 2 MoE has biases on q, k, v
(``qkv_bias``), no q / k norms, sliding layers listed in ``layer_types``, and beside the routed experts a
shared expert (a SwiGLU MLP of ``shared_expert_intermediate_size`` over every token, scaled by
``sigmoid(shared_expert_gate(x))``, both nn.Linear).
"""

from __future__ import annotations

from dataclasses import replace

from cabe.architecture import ModelSpec
from cabe.families._common import QWEN2_MOE_PEFT_PARAMETERS, Reader, attention_shape, decoder, gated_mlp, qkvo, window
from cabe.layers import LayerGroup, Linear

MODEL_TYPES = ("qwen2_moe", "qwen3_moe")

# transformers 5's defaults where a config leaves a key out (Qwen2MoeConfig, Qwen3MoeConfig)
_DEFAULTS = {
    "qwen2_moe": dict(experts=60, per_token=4, moe_size=1408, positions=32768),
    "qwen3_moe": dict(experts=128, per_token=8, moe_size=768, positions=32768),
}


def is_moe(r: Reader, index: int, experts: int) -> bool:
    """The decoder layer's test for a sparse MLP in layer ``index``."""
    only = r.c.get("mlp_only_layers") or []
    step = r.int("decoder_sparse_step", default=1)
    return index not in only and experts > 0 and (index + 1) % step == 0


def _moe_linears(r: Reader, h: int, experts: int, fe: int) -> tuple[Linear, ...]:
    routed = (
        Linear("gate", h, experts, False, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * fe, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", fe, h, False, experts, is_module=False, role="expert", slot="experts"),
    )
    if r.model_type != "qwen2_moe":
        return routed
    fs = r.int("shared_expert_intermediate_size", default=5632)
    return routed + (
        Linear("gate_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("up_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("down_proj", fs, h, role="mlp", slot="shared_down"),
        Linear("shared_expert_gate", h, 1, role="mlp", slot="shared_gate"),
    )


def _sliding(r: Reader, layers: int) -> list[int | None]:
    """Each layer's window, or None for full attention."""
    if r.model_type == "qwen2_moe":
        # NOTE: layer_types when the config lists them, else Qwen2MoeConfig.__post_init__'s rule
        win = window(r) if r.bool("use_sliding_window", False) else None
        types = r.c.get("layer_types")
        if isinstance(types, list) and len(types) == layers:
            return [window(r) if t == "sliding_attention" else None for t in types]
        mwl = r.int("max_window_layers", default=28, minimum=0)
        return [win if (i + 1) % 2 and i < mwl else None for i in range(layers)]
    # NOTE: Qwen 3 MoE keeps sliding_window only with use_sliding_window, and then every layer slides
    # (configuration_qwen3_moe.py, __post_init__; the model picks one mask for all layers)
    win = window(r) if r.bool("use_sliding_window", False) else None
    return [win] * layers


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    qwen2 = r.model_type == "qwen2_moe"
    dflt = _DEFAULTS[r.model_type]
    f = r.int("intermediate_size")
    # transformers 5 writes num_experts back as num_local_experts (its attribute_map)
    experts = r.int("num_experts", "num_local_experts", default=dflt["experts"], minimum=0)
    fe = r.int("moe_intermediate_size", default=dflt["moe_size"])
    layers = r.int("num_hidden_layers")
    if qwen2:
        attn = qkvo(h, nh, nkv, d, r.bool("qkv_bias", True), False)
    else:
        bias = r.bool("attention_bias", False)
        attn = qkvo(h, nh, nkv, d, bias, bias)
    moe = LayerGroup(1, attn + _moe_linears(r, h, experts, fe), "moe", intermediate_size=fe)
    dense = LayerGroup(1, attn + gated_mlp(h, f, False), "gated")
    groups: list[LayerGroup] = []
    for i, win in enumerate(_sliding(r, layers)):
        g = moe if is_moe(r, i, experts) else dense
        if win:
            g = replace(g, attention="sliding", window=win)
        if groups and replace(groups[-1], count=1) == g:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    return decoder(
        r,
        name,
        "qwen_moe",
        (h, nh, nkv, d),
        f,
        tied=False,
        qk_norm="none" if qwen2 else "head",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=dflt["positions"]),
        layer_groups=tuple(groups),
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=dflt["per_token"]),
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: PEFT has no default target_modules for these model types (peft/utils/constants.py): all-linear
        peft_default_targets=("all-linear",),
        # transformers 5.24 maps qwen3_moe to qwen2_moe's conversion pattern (conversion_mapping.py), and PEFT 0.22.0
        # adds qwen2_moe itself to its copy of that table (utils/transformers_weight_conversion.py:46; 0.21.2 had no
        # such key and left Qwen2-MoE's names on its nn.Linear modules): both move the expert and router names onto
        # the fused experts and the router; Qwen2-MoE's shared expert keeps its LoRA (cabe.method.kept_targets)
        peft_parameter_targets=QWEN2_MOE_PEFT_PARAMETERS,
    )
