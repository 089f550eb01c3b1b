"""DeepSeek-V3.2 (``deepseek_v32``): DeepSeek-V3 plus DeepSeek Sparse Attention (transformers 5.24,
models/deepseek_v32/modular_deepseek_v32.py). Every layer is an ``indexed_attention`` layer: V3's multi-head latent
attention (always with a low-rank query: "Qlora rank formulation is dropped") and a lightning indexer
(``DeepseekV32Indexer``) with its own projections — ``wq_b`` (q_lora_rank -> index_n_heads × index_head_dim, reading
the attention's normalised query latent), ``wk`` (h -> index_head_dim), ``k_norm`` (``nn.LayerNorm``, weight and
bias) and ``weights_proj`` (h -> index_n_heads). The MLP of each layer follows ``mlp_layer_types`` (``dense``: a
SwiGLU MLP of ``intermediate_size``; ``sparse``: V3's MoE with routed and shared experts), by default
``first_k_dense_replace`` dense layers then sparse ones (``DeepseekV32Config.__post_init__``).

The indexer runs under ``torch.no_grad`` (``DeepseekV32Indexer.forward``): it saves nothing for backward and its
weights get no gradient; what it costs in training is a transient — its fp32 (b, s, index_n_heads, s) scores, made
in the forward and again in a checkpointed layer's recompute — and the additive mask it folds into the attention
mask, which SDPA's memory-efficient kernel saves in every layer (see :mod:`cabe.activations`). Serving caches the
indexer's key beside the latent (``DynamicIndexedLayer``, cache_utils.py), and its prefill makes the same
scores over every cached key (:func:`cabe.inference.indexer_moments`).

NOTE: ``_supports_flash_attn = False``; ``indexer.weights_proj`` is in ``_keep_in_fp32_modules``, which
``from_pretrained`` honours only when loading in fp16 (modeling_utils.py ``_get_dtype_plan``): cabe counts it in
the model's dtype, as ``from_config`` builds it. The multi-token-prediction layer (layer 61) is not built
(``_keys_to_ignore_on_load_unexpected``), as for DeepSeek-V3.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, gated_mlp
from cabe.families.deepseek_v3 import deepseek_decoder, latent_attention, mla_linears, moe_linears
from cabe.layers import LayerGroup, Linear
from cabe.mixers import LatentAttention

MODEL_TYPES = ("deepseek_v32",)


def indexed_attention(r: Reader) -> LatentAttention:
    """V3's latent attention (a low-rank query always) with the indexer's heads, width and top-k."""
    la = latent_attention(r)
    return LatentAttention(
        q_lora_rank=r.int("q_lora_rank", default=1536),
        kv_lora_rank=la.kv_lora_rank,
        rope_dim=la.rope_dim,
        nope_dim=la.nope_dim,
        v_head_dim=la.v_head_dim,
        index_heads=r.int("index_n_heads", default=64),
        index_head_dim=r.int("index_head_dim", default=128),
        index_topk=r.int("index_topk", default=2048),
    )


def indexer_linears(h: int, la: LatentAttention) -> tuple[Linear, ...]:
    """``DeepseekV32Indexer``'s projections (nn.Linear, no bias), in the order its forward runs them."""
    return (
        Linear("wq_b", la.q_lora_rank, la.index_heads * la.index_head_dim, slot="indexer"),
        Linear("wk", h, la.index_head_dim, slot="indexer"),
        Linear("weights_proj", h, la.index_heads, slot="indexer"),
    )


def mlp_layer_types(r: Reader, layers: int) -> list[str]:
    """``dense`` / ``sparse`` per layer: the config's list, or ``first_k_dense_replace`` dense layers first."""
    listed = r.c.get("mlp_layer_types")
    if listed is None:
        dense = min(layers, r.int("first_k_dense_replace", default=3, minimum=0))
        return ["dense"] * dense + ["sparse"] * (layers - dense)
    if not isinstance(listed, list) or len(listed) < layers or any(t not in ("dense", "sparse") for t in listed):
        raise ConfigError("config_bad_value", "model", key="mlp_layer_types", detail=repr(listed)[:80])
    return list(listed[:layers])


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size", default=7168)
    nh = r.int("num_attention_heads", default=128)
    la = indexed_attention(r)
    f = r.int("intermediate_size", default=18432)
    fe = r.int("moe_intermediate_size", default=2048)
    layers = r.int("num_hidden_layers", default=61)
    experts = r.int("n_routed_experts", "num_local_experts", default=256)
    attn = mla_linears(h, nh, la, r.bool("attention_bias", False)) + indexer_linears(h, la)
    dense = LayerGroup(1, attn + gated_mlp(h, f, False), "gated")
    shared = r.int("n_shared_experts", default=1, minimum=0)
    sparse = LayerGroup(1, attn + moe_linears(h, experts, fe, shared), "moe", intermediate_size=fe)
    groups: list[LayerGroup] = []
    for kind in mlp_layer_types(r, layers):  # consecutive layers of one kind are one group
        g = dense if kind == "dense" else sparse
        if groups and groups[-1].mlp == g.mlp:
            groups[-1] = LayerGroup(groups[-1].count + 1, g.linears, g.mlp, intermediate_size=g.intermediate_size)
        else:
            groups.append(g)
    return deepseek_decoder(
        r,
        name,
        "deepseek_v32",
        h,
        nh,
        la,
        f,
        experts,
        tuple(groups),
        max_positions=163840,
        flash_attention=False,  # DeepseekV32PreTrainedModel._supports_flash_attn = False
    )
