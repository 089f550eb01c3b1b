"""Phi-3: a Llama-like layer with fused projections (qkv_proj, gate_up_proj) and partial rotary.

Its rotary is written with torch.cat (the attention output is copied before o_proj, cos and sin are
cast in every layer) and v is a view of the fused qkv output. PEFT has no default targets for it: cabe
adapts every linear layer, and says so.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, attention_shape, decoder, groups, listed_sliding_layers, window
from cabe.layers import Linear

MODEL_TYPES = ("phi3",)


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    # NOTE: Phi-3 fuses q, k, v into qkv_proj and gate, up into gate_up_proj.
    linears = (
        Linear("qkv_proj", h, (nh + 2 * nkv) * d, False),
        Linear("o_proj", nh * d, h, False, slot="o"),
        Linear("gate_up_proj", h, 2 * f, False, role="mlp", slot="up"),
        Linear("down_proj", f, h, False, role="mlp", slot="down"),
    )
    # a sliding window applies only to the layers layer_types lists (Phi-3's own sliding_window is
    # not a per-layer cache cap in transformers)
    listed = listed_sliding_layers(r)
    win = window(r) if listed else None
    return decoder(
        r,
        name,
        "phi3",
        (h, nh, nkv, d),
        f,
        tied=False,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=int(d * (r.float("partial_rotary_factor", 1.0) or 1.0)),
        max_positions=r.int("max_position_embeddings", default=4096),
        layer_groups=groups(layers, linears, "gated", win, listed or 0),
        rotary_by_cat=True,
        # NOTE: transformers/models/phi3/modeling_phi3.py (5.24), Phi3Model.forward: mask_function =
        # create_sliding_window_causal_mask whenever config.sliding_window is not None
        sdpa_mask_window=window(r),
        value_is_qkv_view=True,
        attention_dropout=r.dropout("attention_dropout"),
        hidden_dropout=r.dropout("resid_pdrop"),
        embedding_dropout=r.dropout("embd_pdrop"),
        peft_default_targets=("all-linear",),
    )
