"""Llama and the families that share its layer: Mistral, Qwen 2, Qwen 3.

Pre-norm RMSNorm blocks, rotary attention with separate q, k, v, o (GQA through
``num_key_value_heads``), a SwiGLU MLP. Qwen 2 has biases on q, k, v only; Qwen 3 normalises q and
k per head. PEFT targets q_proj and v_proj by default.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import (
    Reader,
    attention_shape,
    decoder,
    gated_mlp,
    groups,
    listed_sliding_layers,
    qkvo,
    window,
)

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def sliding_layers(r: Reader, layers: int) -> int:
    listed = listed_sliding_layers(r)
    if listed is not None:
        return listed
    if r.model_type == "mistral":  # every layer slides when a window is set
        return layers
    if r.model_type in ("qwen2", "qwen3") and r.bool("use_sliding_window", False):
        return layers
    return 0  # Llama's config has no sliding window


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    mt = r.model_type
    if mt == "qwen2":  # NOTE: Qwen2 has biases on q, k, v only
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = r.bool("attention_bias", False)
    linears = qkvo(h, nh, nkv, d, qkv_bias, o_bias) + gated_mlp(h, f, r.bool("mlp_bias", False))
    win = window(r)
    return decoder(
        r,
        name,
        "llama",
        (h, nh, nkv, d),
        f,
        tied=False,
        qk_norm="head" if mt == "qwen3" else "none",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_groups=groups(layers, linears, "gated", win, sliding_layers(r, layers) if win else 0),
        attention_dropout=r.dropout("attention_dropout"),
    )
