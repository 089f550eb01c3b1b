"""OLMo 2: a Llama layer with the norms after attention and MLP, and q / k normalised over the
whole projection. Its RMSNorm multiplies by the weight in fp32. PEFT has no default targets for it
(it asks for ``target_modules``): cabe adapts every linear layer, and says so.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, attention_shape, decoder, gated_mlp, groups, qkvo

MODEL_TYPES = ("olmo2",)


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    bias = r.bool("attention_bias", False)
    return decoder(
        r,
        name,
        "olmo2",
        (h, nh, nkv, d),
        f,
        tied=False,
        norm_placement="post",
        norm_weight_fp32=True,
        qk_norm="full",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_groups=groups(
            r.int("num_hidden_layers"), qkvo(h, nh, nkv, d, bias, bias) + gated_mlp(h, f, False), "gated", None, 0
        ),
        attention_dropout=r.dropout("attention_dropout"),
        peft_default_targets=("all-linear",),
    )
