"""Qwen 3 MoE: a Qwen 3 layer (q and k normalised per head, no biases) whose MLP is, in most layers, a
mixture of ``num_experts`` SwiGLU experts of width ``moe_intermediate_size``, ``num_experts_per_tok`` of
them per token, behind a bare router weight. A layer is dense (a SwiGLU MLP of ``intermediate_size``)
when its index is in ``mlp_only_layers`` or when ``(index + 1) % decoder_sparse_step`` is not 0
(transformers 5, models/qwen3_moe/modeling_qwen3_moe.py, Qwen3MoeDecoderLayer.__init__): such a model is
runs of dense and MoE layers, bottom first. As in Mixtral, transformers 5 stores the experts as two 3-D
parameters (gate_up_proj, down_proj) and the router as a bare weight: none of them is an nn.Linear that
LoRA or bitsandbytes would replace; the dense layers' gate_proj, up_proj and down_proj are.
"""

from __future__ import annotations

from cabe.architecture import LayerGroup, Linear, ModelSpec
from cabe.families._common import Reader, attention_shape, decoder, gated_mlp, qkvo, window

MODEL_TYPES = ("qwen3_moe",)


def is_moe(r: Reader, index: int, experts: int) -> bool:
    """Qwen3MoeDecoderLayer's test for a sparse MLP in layer ``index``."""
    only = r.c.get("mlp_only_layers") or []
    step = r.int("decoder_sparse_step", default=1)
    return index not in only and experts > 0 and (index + 1) % step == 0


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    # defaults: transformers 5's Qwen3MoeConfig, which writes num_experts back as num_local_experts
    fe = r.int("moe_intermediate_size", default=768)
    layers = r.int("num_hidden_layers")
    experts = r.int("num_experts", "num_local_experts", default=128, minimum=0)
    bias = r.bool("attention_bias", False)
    attn = qkvo(h, nh, nkv, d, bias, bias)
    moe = LayerGroup(
        1,
        attn
        + (
            Linear("gate", h, experts, False, is_module=False, role="router", slot="router"),
            Linear("experts.gate_up_proj", h, 2 * fe, False, experts, is_module=False, role="expert", slot="experts"),
            Linear("experts.down_proj", fe, h, False, experts, is_module=False, role="expert", slot="experts"),
        ),
        "moe",
        intermediate_size=fe,
    )
    dense = LayerGroup(1, attn + gated_mlp(h, f, False), "gated")
    # NOTE: transformers 5 keeps sliding_window only with use_sliding_window, and then every layer slides
    # (configuration_qwen3_moe.py, __post_init__; the model picks one mask for all layers)
    win = window(r) if r.bool("use_sliding_window", False) else None
    runs: list[LayerGroup] = []
    for i in range(layers):
        g = moe if is_moe(r, i, experts) else dense
        if runs and runs[-1].same_tensors(g):
            runs[-1] = LayerGroup(runs[-1].count + 1, g.linears, g.mlp, intermediate_size=g.intermediate_size)
        else:
            runs.append(g)
    if win:
        runs = [LayerGroup(g.count, g.linears, g.mlp, "sliding", win, g.intermediate_size) for g in runs]
    return decoder(
        r,
        name,
        "qwen3_moe",
        (h, nh, nkv, d),
        f,
        tied=False,
        qk_norm="head",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=32768),
        layer_groups=tuple(runs),
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=8),
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: PEFT has no default target_modules for qwen3_moe (peft/utils/constants.py): all-linear
        peft_default_targets=("all-linear",),
    )
