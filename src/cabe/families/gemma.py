"""Gemma 1, 2 and 3 (text): a Llama-like layer whose RMSNorm computes x · (1 + w) in fp32, a GeGLU
MLP, tied embeddings. Gemma 2 and 3 wrap attention and MLP in pre- and post-norms (4 per layer);
Gemma 2 soft-caps attention logits (so transformers has no SDPA path for it: ``sdpa`` runs eager)
and final logits; Gemma 3 normalises q and k per head. Sliding-window layers: Gemma 2 alternates
sliding and global (starting with sliding), Gemma 3 has 5 local layers for every global one.
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

# gemma3: the multimodal config, whose text_config cabe.families.from_config reads as gemma3_text
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")


def sliding_layers(r: Reader, layers: int) -> int:
    listed = listed_sliding_layers(r)
    if listed is not None:
        return listed
    if r.model_type == "gemma2":  # NOTE: Gemma 2 alternates sliding / global, starting with sliding
        return (layers + 1) // 2
    if r.model_type == "gemma3_text":  # NOTE: Gemma 3: 5 local layers for every global one
        return layers - layers // r.int("sliding_window_pattern", default=6)
    return 0


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    mt = r.model_type
    bias = r.bool("attention_bias", False)
    win = window(r)
    sandwich = mt != "gemma"  # NOTE: Gemma 2 and 3 wrap attention and MLP in pre- and post-norms
    return decoder(
        r,
        name,
        "gemma",
        (h, nh, nkv, d),
        f,
        tied=True,
        norms_per_layer=4 if sandwich else 2,
        norm_placement="sandwich" if sandwich else "pre",
        norm_weight_fp32=True,
        norm_plus_one=True,
        qk_norm="head" if mt == "gemma3_text" else "none",
        activation=r.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=8192),
        layer_groups=groups(
            layers,
            qkvo(h, nh, nkv, d, bias, bias) + gated_mlp(h, f, False),
            "gated",
            win,
            sliding_layers(r, layers) if win else 0,
        ),
        # NOTE: transformers 5 has no SDPA path for Gemma 2 (logit soft-capping): sdpa runs eager
        sdpa_fallback="eager" if mt == "gemma2" else "",
        attn_logit_softcapping=r.float("attn_logit_softcapping", None),
        final_logit_softcapping=r.float("final_logit_softcapping", None),
        attention_dropout=r.dropout("attention_dropout"),
    )
