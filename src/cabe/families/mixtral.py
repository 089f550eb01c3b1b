"""Mixtral: a Mistral layer whose MLP is a mixture of experts (``num_local_experts`` SwiGLU experts,
``num_experts_per_tok`` of them per token, a linear router). transformers 5 stores the experts as
two 3-D parameters (gate_up_proj, down_proj) and the router as a bare weight: none of them is an
nn.Linear that LoRA or bitsandbytes would replace.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import (
    MIXTRAL_PEFT_PARAMETERS,
    Reader,
    attention_shape,
    decoder,
    groups,
    listed_sliding_layers,
    qkvo,
    window,
)
from cabe.layers import Linear

MODEL_TYPES = ("mixtral",)


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    experts = r.int("num_local_experts")
    moe = (
        Linear("router", h, experts, False, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * f, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", f, h, False, experts, is_module=False, role="expert", slot="experts"),
    )
    win = window(r)
    listed = listed_sliding_layers(r)
    sliding = (layers if listed is None else listed) if win else 0
    return decoder(
        r,
        name,
        "mixtral",
        (h, nh, nkv, d),
        f,
        tied=False,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=32768),
        layer_groups=groups(layers, qkvo(h, nh, nkv, d, False, False) + moe, "moe", win, sliding),
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=2),
        attention_dropout=r.dropout("attention_dropout"),
        # all-linear reaches the experts and the router through PEFT's mixtral conversion (names w1 / w2 / w3)
        peft_parameter_targets=MIXTRAL_PEFT_PARAMETERS,
    )
