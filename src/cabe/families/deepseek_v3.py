"""DeepSeek-V3 / R1 (``deepseek_v3``): multi-head latent attention, then a SwiGLU MLP in the first
``first_k_dense_replace`` layers and a mixture of experts in the others (transformers 5.24,
models/deepseek_v3/modeling_deepseek_v3.py, ``DeepseekV3DecoderLayer.__init__``: ``layer_idx >=
first_k_dense_replace`` builds ``DeepseekV3MoE``). The config's ``moe_layer_freq`` is not read by transformers.

Attention (``DeepseekV3Attention``): ``q_a_proj`` (h -> q_lora_rank, bias = attention_bias), ``q_a_layernorm``,
``q_b_proj`` (q_lora_rank -> heads × (nope + rope)), or one ``q_proj`` when ``q_lora_rank`` is null;
``kv_a_proj_with_mqa`` (h -> kv_lora_rank + rope), ``kv_a_layernorm`` (kv_lora_rank), ``kv_b_proj``
(kv_lora_rank -> heads × (nope + v_head_dim)), ``o_proj`` (heads × v_head_dim -> h). See
:class:`~cabe.mixers.LatentAttention`.

MoE (``DeepseekV3MoE``): a bare fp32 router weight (``gate.weight``, E × h, in
``_keep_in_fp32_modules_strict``) with the ``e_score_correction_bias`` buffer (E, not a parameter), sigmoid
scores, top-2 sum per group, ``topk_group`` of ``n_group`` groups kept, top-k experts among them; the experts as
two 3-D parameters (gate_up_proj, down_proj); ``n_shared_experts`` shared experts as one SwiGLU MLP of width
``moe_intermediate_size × n_shared_experts`` (nn.Linear, no gate) added to every token's output.

NOTE: the multi-token-prediction layer (``num_nextn_predict_layers``, layer 61 of the checkpoint) is not built:
``DeepseekV3PreTrainedModel._keys_to_ignore_on_load_unexpected = [r"model\\.layers\\.61.*"]``; transformers
builds it only inside ``generate(use_mtp=True)`` (generation/candidate_generator.py ``MTPCandidateGenerator``),
as a separate model. cabe plans the model transformers trains: without it.
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.families._common import QWEN2_MOE_PEFT_PARAMETERS, Reader, decoder, gated_mlp
from cabe.layers import LayerGroup, Linear
from cabe.mixers import LatentAttention

MODEL_TYPES = ("deepseek_v3",)


def latent_attention(r: Reader) -> LatentAttention:
    """The latent attention's ranks and head widths (DeepseekV3Config's defaults where the config is silent)."""
    q_rank = r.c.get("q_lora_rank", 1536)  # null: a plain q_proj
    return LatentAttention(
        q_lora_rank=0 if q_rank is None else r.int("q_lora_rank"),
        kv_lora_rank=r.int("kv_lora_rank", default=512),
        rope_dim=r.int("qk_rope_head_dim", default=64),
        nope_dim=r.int("qk_nope_head_dim", default=128),
        v_head_dim=r.int("v_head_dim", default=128),
    )


def mla_linears(h: int, nh: int, la: LatentAttention, bias: bool) -> tuple[Linear, ...]:
    """The attention's weight matrices, in the order the forward runs them."""
    qd = nh * la.qk_head_dim
    if la.q_lora_rank:
        q: tuple[Linear, ...] = (
            Linear("q_a_proj", h, la.q_lora_rank, bias),
            Linear("q_b_proj", la.q_lora_rank, qd),
        )
    else:
        q = (Linear("q_proj", h, qd),)
    return q + (
        Linear("kv_a_proj_with_mqa", h, la.kv_lora_rank + la.rope_dim, bias),
        Linear("kv_b_proj", la.kv_lora_rank, nh * (la.nope_dim + la.v_head_dim)),
        Linear("o_proj", nh * la.v_head_dim, h, bias, slot="o"),
    )


def moe_linears(h: int, experts: int, fe: int, shared: int) -> tuple[Linear, ...]:
    routed = (
        Linear("gate", h, experts, False, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * fe, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", fe, h, False, experts, is_module=False, role="expert", slot="experts"),
    )
    fs = fe * shared
    if not fs:
        return routed
    return routed + (
        Linear("gate_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("up_proj", h, fs, role="mlp", slot="shared_up"),
        Linear("down_proj", fs, h, role="mlp", slot="shared_down"),
    )


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size", default=7168)
    nh = r.int("num_attention_heads", default=128)
    la = latent_attention(r)
    f = r.int("intermediate_size", default=18432)
    fe = r.int("moe_intermediate_size", default=2048)
    layers = r.int("num_hidden_layers", default=61)
    experts = r.int("n_routed_experts", "num_local_experts", default=256)
    dense_layers = min(layers, r.int("first_k_dense_replace", default=3, minimum=0))
    attn = mla_linears(h, nh, la, r.bool("attention_bias", False))
    groups = []
    if dense_layers:
        groups.append(LayerGroup(dense_layers, attn + gated_mlp(h, f, False), "gated"))
    if layers > dense_layers:
        shared = r.int("n_shared_experts", default=1, minimum=0)
        groups.append(
            LayerGroup(layers - dense_layers, attn + moe_linears(h, experts, fe, shared), "moe", intermediate_size=fe)
        )
    return deepseek_decoder(r, name, "deepseek_v3", h, nh, la, f, experts, tuple(groups), max_positions=4096)


def deepseek_decoder(
    r: Reader,
    name: str,
    family: str,
    h: int,
    nh: int,
    la: LatentAttention,
    f: int,
    experts: int,
    layer_groups: tuple[LayerGroup, ...],
    *,
    max_positions: int,
    **extra: Any,
) -> ModelSpec:
    """The ModelSpec of a DeepSeek decoder (V3, V3.2): MLA, routed experts with group-limited sigmoid routing and
    a shared expert, untied embeddings. ``extra``: what the version adds (V3.2: no flash attention)."""
    return decoder(
        r,
        name,
        family,
        # after kv_b_proj every head has its own key and value: heads = kv heads, head_dim = the q / k head's width
        (h, nh, nh, la.qk_head_dim),
        f,
        tied=False,
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=la.rope_dim,
        max_positions=r.int("max_position_embeddings", default=max_positions),
        layer_groups=layer_groups,
        latent_attention=la,
        num_experts=experts,
        experts_per_token=r.int("num_experts_per_tok", default=8),
        router="sigmoid_groups",
        expert_groups=(r.int("n_group", default=8), r.int("topk_group", default=4)),
        attention_dropout=r.dropout("attention_dropout"),
        # NOTE: PEFT has no default target_modules for deepseek_v3 / deepseek_v32 (peft/utils/constants.py)
        peft_default_targets=("all-linear",),
        # NOTE: transformers 5.24 maps deepseek_v3 and deepseek_v32 to qwen2_moe's conversion pattern
        # (conversion_mapping.py), and PEFT 0.22.0 then turns these targets (and all-linear's) into LoRA on
        # experts.gate_up_proj / down_proj and gate.weight (``_MOE_TARGET_MODULE_MAPPING["qwen2_moe"]``), keeping
        # the dense and shared MLPs' gate/up/down nn.Linear adapters too (transformers_weight_conversion.py:492-503;
        # 0.21.2 dropped them): cabe.method.kept_targets, lora_parameter_targets
        peft_parameter_targets=QWEN2_MOE_PEFT_PARAMETERS,
        **extra,
    )
