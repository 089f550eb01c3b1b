"""GPT-NeoX (Pythia): LayerNorm blocks with attention and MLP in parallel, fused query_key_value,
partial rotary written with torch.cat (output copied before dense, cos and sin cast per layer), v a
view of the fused qkv output. PEFT targets query_key_value by default.
"""

from __future__ import annotations

from collections.abc import Mapping

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, attention_shape, decoder, groups
from cabe.layers import Linear

MODEL_TYPES = ("gpt_neox",)


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, _, d = attention_shape(r)
    f = r.int("intermediate_size", default=4 * h)
    bias = r.bool("attention_bias", True)
    rotary_pct = r.float("rotary_pct", None)
    if rotary_pct is None:
        rope = r.c.get("rope_parameters") or {}
        rotary_pct = float(rope.get("partial_rotary_factor", 0.25)) if isinstance(rope, Mapping) else 0.25
    linears = (
        Linear("query_key_value", h, 3 * h, bias),
        Linear("dense", h, h, bias, slot="o"),
        Linear("dense_h_to_4h", h, f, True, role="mlp", slot="up"),
        Linear("dense_4h_to_h", f, h, True, role="mlp", slot="down"),
    )
    return decoder(
        r,
        name,
        "gpt_neox",
        (h, nh, nh, d),
        f,
        tied=False,
        norm="layernorm",
        norm_bias=True,
        activation=r.str("hidden_act", default="gelu"),
        parallel_block=r.bool("use_parallel_residual", True),
        rotary_dim=int(d * rotary_pct),
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_groups=groups(r.int("num_hidden_layers"), linears, "plain", None, 0),
        rotary_by_cat=True,
        value_is_qkv_view=True,
        attention_dropout=r.dropout("attention_dropout"),
        hidden_dropout=r.dropout("hidden_dropout"),
        peft_default_targets=("query_key_value",),
        module_prefixes=(("attn", "attention."), ("mlp", "mlp.")),  # GPTNeoXLayer: self.attention, self.mlp
        embedding_name="embed_in",  # the module PEFT targets (transformers' modeling_gpt_neox.py)
    )
