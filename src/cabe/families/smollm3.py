"""SmolLM3 (``smollm3``): Llama's layer (pre-norm RMSNorm, GQA, SwiGLU, tied embeddings by default) with NoPE
layers: ``no_rope_layers[i]`` is 1 where layer ``i`` rotates q and k and 0 where it does not, by default every
``no_rope_layer_interval``-th layer (4: layers 3, 7, 11 ...) is NoPE (transformers 5.24
models/smollm3/configuration_smollm3.py ``__post_init__``; modeling_smollm3.py ``SmolLM3Attention.forward``:
``if self.use_rope: apply_rotary_pos_emb(...)``). A NoPE layer has the same weights; it saves what the rotary
would have made differently (no rotated copies of q and k), so the layers are grouped layer by layer into runs
with :attr:`LayerGroup.rope`. With ``use_sliding_window``, the NoPE layers slide over ``sliding_window``
(``layer_types``).

NOTE: PEFT 0.21 has no default ``target_modules`` for smollm3 (peft/utils/constants.py): all-linear.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, attention_shape, decoder, gated_mlp, qkvo, window
from cabe.layers import LayerGroup

MODEL_TYPES = ("smollm3",)


def rope_layers(r: Reader, layers: int) -> list[bool]:
    """Whether each layer rotates q and k: ``no_rope_layers`` (1 / 0 per layer), or every
    ``no_rope_layer_interval``-th layer without."""
    listed = r.c.get("no_rope_layers")
    if listed is None:
        every = r.int("no_rope_layer_interval", default=4)
        return [(i + 1) % every != 0 for i in range(layers)]
    if not isinstance(listed, list) or len(listed) < layers or any(v not in (0, 1) for v in listed[:layers]):
        raise ConfigError("config_bad_value", "model", key="no_rope_layers", detail=repr(listed)[:80])
    return [bool(v) for v in listed[:layers]]


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size", default=11008)
    layers = r.int("num_hidden_layers", default=36)
    bias = r.bool("attention_bias", False)
    linears = qkvo(h, nh, nkv, d, bias, bias) + gated_mlp(h, f, r.bool("mlp_bias", False))
    win = window(r) if r.bool("use_sliding_window", False) else None
    types = r.c.get("layer_types")
    groups: list[LayerGroup] = []
    for i, rope in enumerate(rope_layers(r, layers)):
        # SmolLM3Config: a NoPE layer slides when use_sliding_window and a window are set (or layer_types says so)
        listed = types[i] if isinstance(types, list) and i < len(types) else None
        slides = win is not None and (listed == "sliding_attention" if listed else not rope)
        attention, w = ("sliding", win) if slides else ("full", None)
        last = groups[-1] if groups else None
        if last and (last.rope, last.attention) == (rope, attention):
            groups[-1] = LayerGroup(last.count + 1, linears, "gated", attention, w, rope=rope)
        else:
            groups.append(LayerGroup(1, linears, "gated", attention, w, rope=rope))
    return decoder(
        r,
        name,
        "smollm3",
        (h, nh, nkv, d),
        f,
        tied=True,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=32768),
        layer_groups=tuple(groups),
        attention_dropout=r.dropout("attention_dropout"),
        peft_default_targets=("all-linear",),
    )
