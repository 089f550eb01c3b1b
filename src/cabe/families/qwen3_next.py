"""Qwen3-Next and Qwen3.5 (text): hybrid layers of gated DeltaNet linear attention and gated full attention.

transformers 5.24, models/qwen3_next/modeling_qwen3_next.py (and models/qwen3_5{,_moe}/modeling_qwen3_5*.py, made
from the same modular file):

* **Layer types**: ``config.layer_types`` lists ``"linear_attention"`` / ``"full_attention"`` per layer; when the config
  leaves it out, ``Qwen3NextConfig.__post_init__`` makes every ``full_attention_interval``-th layer (default 4)
  full attention and the others linear (configuration_qwen3_next.py). Qwen3-Next-80B-A3B: 36 linear, 12 full.
* **Gated DeltaNet** (``Qwen3NextGatedDeltaNet``): ``in_proj_qkvz`` (hidden -> 2·key_dim + 2·value_dim) and
  ``in_proj_ba`` (hidden -> 2·num_v_heads) — Qwen3.5 splits them into ``in_proj_qkv``, ``in_proj_z``,
  ``in_proj_b``, ``in_proj_a`` of the same total —, a depthwise ``conv1d`` over q, k, v (conv_dim × kernel
  weights, no bias), ``dt_bias`` and ``A_log`` (num_v_heads each), a gated RMSNorm over head_v_dim
  (``Qwen3NextRMSNormGated``, one weight) and ``out_proj`` (value_dim -> hidden). No q / k norms, no rotary.
* **Gated attention** (``Qwen3NextAttention``): ``q_proj`` makes the queries and a per-channel gate
  (hidden -> 2·heads·head_dim), ``o_proj(attn · sigmoid(gate))``; q / k RMSNorms over head_dim; partial rotary
  (``partial_rotary_factor`` 0.25: 64 of 256 dims, applied with ``torch.cat``).
* **Norms**: ``Qwen3NextRMSNorm`` multiplies by ``1 + weight`` in fp32 (zero-centred, like Gemma's).
* **MLP**: Qwen3-Next's layer ``i`` is a sparse MoE unless ``i`` is in ``mlp_only_layers`` or ``(i + 1) %
  decoder_sparse_step`` (as Qwen2-MoE): ``num_experts`` fused SwiGLU experts of ``moe_intermediate_size``,
  top-``num_experts_per_tok`` (softmax router, a bare weight), and a shared SwiGLU expert of
  ``shared_expert_intermediate_size`` scaled by ``sigmoid(shared_expert_gate(x))``. Qwen3.5 (``qwen3_5_text``)
  is dense (a SwiGLU MLP in every layer); Qwen3.5-MoE (``qwen3_5_moe_text``) is MoE in every layer.

The multi-token-prediction layer of the checkpoints (``mtp.*`` weights) is not built by transformers
(``_keys_to_ignore_on_load_unexpected``): not counted. The vision-language checkpoints ``qwen3_5`` / ``qwen3_5_moe``
(a vision tower around this text model, as Qwen3.5 is published) are read by :mod:`cabe.families.qwen3_5`.
"""

from __future__ import annotations

from dataclasses import replace

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import QWEN2_MOE_PEFT_PARAMETERS, Reader, attention_shape, decoder, gated_mlp
from cabe.families.qwen_moe import is_moe
from cabe.layers import LayerGroup, Linear
from cabe.mixers import GatedDeltaNet

MODEL_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

#: transformers 5.24's defaults where a config leaves a key out (Qwen3NextConfig, Qwen3_5TextConfig,
#: Qwen3_5MoeTextConfig)
_DEFAULTS = {
    "qwen3_next": dict(vocab=151936, experts=512, per_token=10, f=5632),
    "qwen3_5_text": dict(vocab=248320, experts=0, per_token=0, f=12288),
    "qwen3_5_moe_text": dict(vocab=248320, experts=256, per_token=8, f=0),
}


def deltanet(r: Reader) -> GatedDeltaNet:
    dn = GatedDeltaNet(
        num_k_heads=r.int("linear_num_key_heads", default=16),
        num_v_heads=r.int("linear_num_value_heads", default=32),
        head_k_dim=r.int("linear_key_head_dim", default=128),
        head_v_dim=r.int("linear_value_head_dim", default=128),
        conv_kernel=r.int("linear_conv_kernel_dim", default=4),
    )
    if dn.num_v_heads % dn.num_k_heads:
        detail = f"{dn.num_v_heads} % {dn.num_k_heads} != 0"
        raise ConfigError("config_bad_value", "model", key="linear_num_value_heads", detail=detail)
    return dn


def deltanet_linears(r: Reader, h: int, dn: GatedDeltaNet) -> tuple[Linear, ...]:
    """The linear-attention layer's weights: its projections (nn.Linear) and its bare parameters."""
    nv = dn.num_v_heads
    projections: tuple[Linear, ...]
    if r.model_type == "qwen3_next":
        projections = (
            Linear("in_proj_qkvz", h, 2 * dn.key_dim + 2 * dn.value_dim),
            Linear("in_proj_ba", h, 2 * nv),
        )
    else:
        projections = (
            Linear("in_proj_qkv", h, dn.conv_dim),
            Linear("in_proj_z", h, dn.value_dim),
            Linear("in_proj_b", h, nv),
            Linear("in_proj_a", h, nv),
        )

    def bare(name: str, rows: int, cols: int) -> Linear:
        return Linear(name, rows, cols, is_module=False, quantizable=False, slot="mixer")

    return projections + (
        # nn.Conv1d(conv_dim, conv_dim, kernel, groups=conv_dim, bias=False): a (conv_dim, 1, kernel) weight
        bare("conv1d", dn.conv_kernel, dn.conv_dim),
        bare("dt_bias", 1, nv),
        bare("A_log", 1, nv),
        bare("norm", 1, dn.head_v_dim),  # the gated RMSNorm's weight
        Linear("out_proj", dn.value_dim, h, slot="o"),
    )


def _mlp(r: Reader, h: int, f: int, experts: int, fe: int) -> tuple[tuple[Linear, ...], tuple[Linear, ...]]:
    """(MoE layer's MLP linears, dense layer's)."""
    fs = r.int("shared_expert_intermediate_size", default=512)
    moe = (
        Linear("gate", h, experts, False, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * fe, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", fe, h, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("gate_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("up_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("down_proj", fs, h, role="mlp", slot="shared_down"),
        Linear("shared_expert_gate", h, 1, role="mlp", slot="shared_gate"),
    )
    return moe, gated_mlp(h, f, False) if f else ()


def layer_types(r: Reader, layers: int) -> list[str]:
    """Each layer's token mixer, as ``config.layer_types`` or the interval rule of ``__post_init__``."""
    types = r.c.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != layers or any(t not in ("linear_attention", "full_attention") for t in types):
            raise ConfigError("config_bad_value", "model", key="layer_types", detail=repr(types))
        return list(types)
    every = r.int("full_attention_interval", default=4)
    return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]


def _rotary_dim(r: Reader, d: int) -> int:
    rope = r.c.get("rope_parameters") or r.c.get("rope_scaling") or {}
    factor = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        factor = r.float("partial_rotary_factor", 0.25) or 0.25
    return int(d * factor)


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    dflt = _DEFAULTS[r.model_type]
    dn = deltanet(r)
    layers = r.int("num_hidden_layers")
    # Qwen3.5 (dense) has no MoE whatever its config says (Qwen3_5DecoderLayer builds Qwen3_5MLP)
    experts = r.int("num_experts", "num_local_experts", default=dflt["experts"], minimum=0) if dflt["experts"] else 0
    fe = r.int("moe_intermediate_size", default=512)
    f = r.int("intermediate_size", default=dflt["f"], minimum=0)
    bias = r.bool("attention_bias", False)
    attn = (
        Linear("q_proj", h, 2 * nh * d, bias),  # queries and the output gate
        Linear("k_proj", h, nkv * d, bias),
        Linear("v_proj", h, nkv * d, bias),
        Linear("o_proj", nh * d, h, bias, slot="o"),
    )
    mixers = {"full_attention": attn, "linear_attention": deltanet_linears(r, h, dn)}
    moe_mlp, dense_mlp = _mlp(r, h, f, experts, fe)
    groups: list[LayerGroup] = []
    for i, kind in enumerate(layer_types(r, layers)):
        moe = experts > 0 and (r.model_type == "qwen3_5_moe_text" or is_moe(r, i, experts))
        if not moe and not dense_mlp:
            raise ConfigError("config_missing_field", "model", key="intermediate_size")
        g = LayerGroup(
            1,
            mixers[kind] + (moe_mlp if moe else dense_mlp),
            "moe" if moe else "gated",
            intermediate_size=fe if moe else 0,
            mixer="attention" if kind == "full_attention" else "gated_deltanet",
        )
        if groups and replace(groups[-1], count=1) == g:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    rotary = _rotary_dim(r, d)
    return decoder(
        r,
        name,
        "qwen3_next",
        (h, nh, nkv, d),
        f,
        tied=False,
        qk_norm="head",
        norm_weight_fp32=True,
        norm_plus_one=True,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=rotary,
        rotary_by_cat=rotary != d,
        max_positions=r.int("max_position_embeddings", default=32768),
        layer_groups=tuple(groups),
        gated_deltanet=dn,
        attention_output_gate=True,
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=dflt["per_token"]) if experts else 0,
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: PEFT 0.21 has no default target_modules for these model types (peft/utils/constants.py): all-linear
        peft_default_targets=("all-linear",),
        # transformers 5.24 conversion_mapping.py maps qwen3_next to qwen2_moe's pattern: PEFT 0.22.0 adds the fused
        # experts to gate_proj / up_proj / down_proj and keeps the shared expert's linears of those names
        # (cabe.method.kept_targets; 0.21.2 moved the names off them); qwen3_5_moe_text's pattern is qwen3_5_text's
        # plus qwen2_moe's, not looked up by PEFT under that key: left as nn.Linear targets
        peft_parameter_targets=QWEN2_MOE_PEFT_PARAMETERS if r.model_type == "qwen3_next" and experts else (),
    )
