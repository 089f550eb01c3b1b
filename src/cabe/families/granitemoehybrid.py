"""Granite-4.0-H (``granitemoehybrid``): Mamba-2 layers and attention layers, each followed by a mixture of
experts with a shared expert (or, with no experts, the shared MLP alone: H-Micro, H-1B, H-350M).

transformers 5.24, models/granitemoehybrid/modeling_granitemoehybrid.py:

* ``GraniteMoeHybridDecoderLayer``: ``input_layernorm``, the mixer (``mamba`` when ``layer_types[i]`` is
  ``linear_attention`` — the Hub's configs write ``mamba`` / ``attention``, which the config turns into
  ``linear_attention`` / ``full_attention`` — else ``self_attn``), ``post_attention_layernorm``, then
  ``block_sparse_moe(x) + shared_mlp(x)`` (``num_local_experts > 0``) or ``shared_mlp(x)``; both residual adds
  scale the branch by ``residual_multiplier``.
* ``GraniteMoeHybridMambaLayer``: ``in_proj`` (h -> d_inner + conv_dim + heads, bias ``mamba_proj_bias``), a
  depthwise ``conv1d`` over ``conv_dim = d_inner + 2·groups·state`` channels (``mamba_d_conv`` taps, bias
  ``mamba_conv_bias``), ``dt_bias``, ``A_log``, ``D`` (heads each), a gated RMSNorm (``norm.weight``, d_inner)
  and ``out_proj`` (d_inner -> h). ``d_inner = mamba_expand · h = mamba_n_heads · mamba_d_head``.
* ``GraniteMoeHybridAttention``: q, k, v, o projections (bias ``attention_bias``); rotary only when
  ``position_embedding_type == "rope"`` (Granite 4.0 ships ``nope``: no position embedding at all).
* ``GraniteMoeHybridMoE``: a bare router weight (E × h; ``F.linear(x, w).float()``, top-k of the logits, softmax
  over the k in fp32), the experts as two 3-D parameters (gate_up_proj E × 2f × h, down_proj E × h × f, f =
  ``intermediate_size``); ``GraniteMoeHybridMLP``: ``input_linear`` (h -> 2·fs, chunked into gate and up) and
  ``output_linear`` (fs -> h), fs = ``shared_intermediate_size``.

NOTE: the logits are divided by ``logits_scaling`` (a second vocabulary-wide tensor) and the embeddings multiplied
by ``embedding_multiplier``; neither saves a tensor for backward.
"""

from __future__ import annotations

from dataclasses import replace

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, attention_shape, decoder, qkvo
from cabe.layers import LayerGroup, Linear
from cabe.mixers import Mamba2

MODEL_TYPES = ("granitemoehybrid",)

#: what a ``layer_types`` entry says the mixer is (the Hub's spellings and transformers 5's)
_MAMBA, _ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def mamba2(r: Reader, h: int) -> Mamba2:
    """The Mamba-2 mixer's shape (GraniteMoeHybridConfig's defaults where the config is silent; ``mamba_d_head``
    "auto" is d_inner / heads, as ``__post_init__`` sets it)."""
    heads = r.int("mamba_n_heads", default=128)
    d_inner = r.int("mamba_expand", default=2) * h
    head = r.c.get("mamba_d_head", "auto")
    head_dim = d_inner // heads if head in (None, "auto") else r.int("mamba_d_head")
    if heads * head_dim != d_inner:  # GraniteMoeHybridConfig.validate_architecture refuses it too
        raise ConfigError("config_bad_value", "model", key="mamba_d_head", detail=f"{heads} × {head_dim} != {d_inner}")
    groups = r.int("mamba_n_groups", default=1)
    if heads % groups:
        raise ConfigError("config_bad_value", "model", key="mamba_n_groups", detail=f"{heads} % {groups} != 0")
    return Mamba2(
        heads=heads,
        head_dim=head_dim,
        state=r.int("mamba_d_state", default=256),
        groups=groups,
        conv_kernel=r.int("mamba_d_conv", default=4),
        chunk=r.int("mamba_chunk_size", default=256),
    )


def mamba_linears(h: int, m: Mamba2, proj_bias: bool, conv_bias: bool) -> tuple[Linear, ...]:
    """The mixer's tensors in the order the forward reads them: in_proj, the convolution, the scan's
    dt_bias / A_log / D, the gated norm's weight, out_proj (``nn.Conv1d`` and bare parameters: no LoRA or
    4-bit module)."""

    def small(name: str, rows: int, cols: int, bias: bool = False) -> Linear:
        return Linear(name, rows, cols, bias, is_module=False, quantizable=False, slot="ssm", role="ssm")

    return (
        Linear("in_proj", h, m.in_proj_width, proj_bias, role="ssm"),
        small("conv1d", m.conv_kernel, m.conv_dim, conv_bias),  # weight conv_dim × 1 × kernel
        small("dt_bias", 1, m.heads),
        small("A_log", 1, m.heads),
        small("D", 1, m.heads),
        small("norm", 1, m.d_inner),
        Linear("out_proj", m.d_inner, h, proj_bias, role="ssm", slot="o"),
    )


def mlp_linears(h: int, experts: int, f: int, fs: int) -> tuple[Linear, ...]:
    """The block after the mixer: the routed experts (when any) and the shared MLP."""
    if not experts:
        return (
            Linear("input_linear", h, 2 * fs, role="mlp", slot="up"),
            Linear("output_linear", fs, h, role="mlp", slot="down"),
        )
    return (
        Linear("router", h, experts, False, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * f, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", f, h, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("input_linear", h, 2 * fs, role="mlp", slot="shared_up"),
        Linear("output_linear", fs, h, role="mlp", slot="shared_down"),
    )


def layer_mixers(r: Reader, layers: int) -> list[str]:
    """Each layer's mixer, bottom first: ``layer_types`` (or its old name ``layers_block_type``); every layer a
    Mamba-2 one when the config lists none (GraniteMoeHybridConfig.__post_init__)."""
    types = r.c.get("layer_types") or r.c.get("layers_block_type")
    if types is None:
        return ["mamba2"] * layers
    if not isinstance(types, list) or len(types) != layers:
        raise ConfigError("config_bad_value", "model", key="layer_types", detail=f"{layers} entries expected")
    out = []
    for t in types:
        if t not in _MAMBA + _ATTENTION:
            raise ConfigError("config_bad_value", "model", key="layer_types", detail=repr(t))
        out.append("mamba2" if t in _MAMBA else "attention")
    return out


def read(r: Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = attention_shape(r)
    m = mamba2(r, h)
    layers = r.int("num_hidden_layers")
    experts = r.int("num_local_experts", default=8, minimum=0)
    f = r.int("intermediate_size")
    fs = r.int("shared_intermediate_size", default=1024)
    bias = r.bool("attention_bias", False)
    mlp = mlp_linears(h, experts, f, fs)
    rope = r.str("position_embedding_type", default="") == "rope"
    kind, width = ("moe", f) if experts else ("gated", fs)
    mixers = {
        "mamba2": LayerGroup(
            1,
            mamba_linears(h, m, r.bool("mamba_proj_bias", False), r.bool("mamba_conv_bias", True)) + mlp,
            kind,
            intermediate_size=width,
            rope=False,
            mixer="mamba2",
        ),
        "attention": LayerGroup(1, qkvo(h, nh, nkv, d, bias, bias) + mlp, kind, intermediate_size=width, rope=rope),
    }
    groups: list[LayerGroup] = []
    for mixer in layer_mixers(r, layers):
        g = mixers[mixer]
        if groups and replace(groups[-1], count=1) == g:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    return decoder(
        r,
        name,
        "granitemoehybrid",
        (h, nh, nkv, d),
        width,
        tied=False,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d if rope else 0,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_groups=tuple(groups),
        mamba2=m if "mamba2" in (g.mixer for g in groups) else None,
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=2, minimum=0) if experts else 0,
        router="topk_softmax_fp32",
        position="rotary" if rope else "none",
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: PEFT 0.21 has no default target_modules for granitemoehybrid (peft/utils/constants.py): all-linear
        peft_default_targets=("all-linear",),
        # NOTE: transformers 5.24 conversion_mapping.py maps granitemoehybrid to no MoE pattern PEFT reads
        # (``_MODEL_TO_CONVERSION_PATTERN``): LoRA stays on the nn.Linear modules
        peft_parameter_targets=(),
        module_prefixes=(
            ("attn", "self_attn."),
            ("ssm", "mamba."),
            ("mlp", "shared_mlp."),
            ("router", "block_sparse_moe."),
            ("expert", "block_sparse_moe."),
        ),
    )
