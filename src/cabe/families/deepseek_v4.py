"""DeepSeek-V4 (``deepseek_v4``; transformers 5.24, models/deepseek_v4/modeling_deepseek_v4.py and
configuration_deepseek_v4.py): compressed attention, hash-routed and top-k MoE, hyper-connections.

Every layer (``DeepseekV4DecoderLayer``) is an attention block and a MoE block, each between two
manifold-constrained hyper-connections (``attn_hc`` / ``ffn_hc``: ``fn`` ((2 + n) n × n h), ``base`` ((2 + n) n),
``scale`` (3), n = ``hc_mult`` residual streams of h) and fp32 RMSNorms. The attention
(:class:`~cabe.mixers.CompressedAttention`) follows ``layer_types``: ``sliding_attention`` (the window alone),
``compressed_sparse_attention`` (CSA: a compressor of overlapping windows of ``compress_rates[...]`` tokens and a
lightning indexer) or ``heavily_compressed_attention`` (HCA: a compressor of disjoint windows). The MoE
(``DeepseekV4SparseMoeBlock``) follows ``mlp_layer_types``: ``hash_moe`` (``DeepseekV4HashRouter``: the experts
of a token come from a frozen ``tid2eid`` buffer, vocab × k int64; the gate weighs them) or ``moe``
(``DeepseekV4TopKRouter``: top-k of sqrt-softplus scores); both have a gate (E × h), the fused experts
(gate_up_proj, down_proj) and one shared expert of ``moe_intermediate_size`` (``DeepseekV4MLP`` reads
``intermediate_size``, which the config maps to ``moe_intermediate_size``; ``n_shared_experts`` is not read).
On top: ``hc_head`` (hc_fn n × n h, hc_base n, hc_scale 1), the final norm and an untied lm_head.

NOTE: fp32 whatever the load dtype (``_keep_in_fp32_modules_strict`` and the modules' ``.to(torch.float32)``):
the hyper-connections, ``sinks``, ``position_bias``, every RMSNorm weight (input / post-attention, q_a_norm,
kv_norm, the compressors' and the indexer's, the final norm) and hc_head. The indexer's weights get no gradient
(its output is integer top-k indices): the optimizer never makes their state. Only eager attention is supported
(``_supports_sdpa = _supports_flash_attn = False``: head_dim 512 and the sinks): an sdpa request runs eager.
``o_a_proj`` (``DeepseekV4GroupedLinear``) is an ``nn.Linear`` subclass whose forward is a block-diagonal
``bmm`` returning (…, groups, o_lora_rank): PEFT wraps it under its name or all-linear and its LoRA output
(…, groups, groups × o_lora_rank) cannot be added to that (lora_breaks); bitsandbytes leaves it 16-bit
(``replace_with_bnb_linear`` replaces ``type(m) is nn.Linear`` only). The multi-token-prediction layer
(``num_nextn_predict_layers``) is not built (``_keys_to_ignore_on_load_unexpected = [r"(^|\\.)mtp\\..*"]``).
"""

from __future__ import annotations

from dataclasses import replace

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, decoder
from cabe.layers import LayerGroup, Linear
from cabe.mixers import CompressedAttention
from cabe.units import round_alloc

MODEL_TYPES = ("deepseek_v4",)

#: ``layer_types`` -> cabe's LayerGroup.attention
ATTENTION_KINDS = {
    "sliding_attention": "sliding",
    "compressed_sparse_attention": "compressed_sparse",
    "heavily_compressed_attention": "heavily_compressed",
}
#: the legacy ``compress_ratios`` per layer (DeepseekV4Config.__post_init__ ``_COMPRESS_RATIO_TO_LAYER_TYPE``)
_RATIO_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def compressed_attention(r: Reader) -> CompressedAttention:
    """The attention's widths, DeepseekV4Config's defaults where the config is silent."""
    d = r.int("head_dim", default=512)
    rates = r.c.get("compress_rates") or {}
    if not isinstance(rates, dict):
        raise ConfigError("config_bad_value", "model", key="compress_rates", detail=repr(rates)[:80])
    csa = rates.get("compressed_sparse_attention", r.c.get("compress_rate_csa", 4))
    hca = rates.get("heavily_compressed_attention", r.c.get("compress_rate_hca", 128))
    # partial_rotary_factor, or the legacy qk_rope_head_dim, or 64 / 512 (DeepseekV4Config.__post_init__)
    factor = r.c.get("partial_rotary_factor")
    if factor is None:
        legacy = r.c.get("qk_rope_head_dim")
        factor = legacy / d if legacy is not None else 64 / 512
    return CompressedAttention(
        head_dim=d,
        q_lora_rank=r.int("q_lora_rank", default=1024),
        rope_dim=int(d * factor),
        o_groups=r.int("o_groups", default=8),
        o_lora_rank=r.int("o_lora_rank", default=1024),
        window=r.int("sliding_window", default=128),
        csa_rate=int(csa),
        hca_rate=int(hca),
        index_heads=r.int("index_n_heads", default=64),
        index_head_dim=r.int("index_head_dim", default=128),
        index_topk=r.int("index_topk", default=512),
    )


def layer_types(r: Reader, layers: int) -> list[str]:
    """``layer_types``, the legacy ``compress_ratios``, or the default: two HCA layers, then CSA / HCA alternating."""
    listed = r.c.get("layer_types")
    if listed is None and isinstance(r.c.get("compress_ratios"), list):
        listed = [_RATIO_KINDS.get(x, "?") for x in r.c["compress_ratios"]]
    if listed is None:
        tail = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(layers - 2)]
        return (["heavily_compressed_attention"] * min(layers, 2) + tail)[:layers]
    if not isinstance(listed, list) or len(listed) < layers or any(t not in ATTENTION_KINDS for t in listed):
        raise ConfigError("config_bad_value", "model", key="layer_types", detail=repr(listed)[:80])
    return list(listed[:layers])


def mlp_layer_types(r: Reader, layers: int) -> list[str]:
    """``mlp_layer_types``, or ``num_hash_layers`` (default 3) ``hash_moe`` layers then ``moe``."""
    listed = r.c.get("mlp_layer_types")
    if listed is None:
        hashed = min(layers, r.int("num_hash_layers", default=3, minimum=0))
        return ["hash_moe"] * hashed + ["moe"] * (layers - hashed)
    if not isinstance(listed, list) or len(listed) < layers or any(t not in ("hash_moe", "moe") for t in listed):
        raise ConfigError("config_bad_value", "model", key="mlp_layer_types", detail=repr(listed)[:80])
    return list(listed[:layers])


def attention_linears(h: int, nh: int, ca: CompressedAttention, kind: str) -> tuple[Linear, ...]:
    """``DeepseekV4Attention``'s tensors, in the order its forward runs them, with its compressor's."""
    d, rq = ca.head_dim, ca.q_lora_rank
    out: tuple[Linear, ...] = (
        Linear("q_a_proj", h, rq),
        Linear("q_a_norm", 1, rq, is_module=False, slot="vector", fp32=True),
        Linear("q_b_proj", rq, nh * d),
        Linear("kv_proj", h, d),
        Linear("kv_norm", 1, d, is_module=False, slot="vector", fp32=True),
    )
    rate = ca.rate(kind)
    if rate:
        width = 2 * d if kind == "compressed_sparse" else d  # CSA: two overlapping series Ca, Cb
        out += (
            Linear("kv_proj", h, width),
            Linear("gate_proj", h, width),
            Linear("position_bias", rate, width, is_module=False, slot="vector", fp32=True),
            Linear("kv_norm", 1, d, is_module=False, slot="vector", fp32=True),
        )
    if kind == "compressed_sparse":  # DeepseekV4Indexer: integer indices out, no gradient reaches its weights
        di, hi = ca.index_head_dim, ca.index_heads
        out += (
            Linear("kv_proj", h, 2 * di, slot="indexer"),
            Linear("gate_proj", h, 2 * di, slot="indexer"),
            Linear("position_bias", rate, 2 * di, is_module=False, slot="indexer", fp32=True),
            Linear("kv_norm", 1, di, is_module=False, slot="indexer", fp32=True),
            Linear("q_b_proj", rq, hi * di, slot="indexer"),
            Linear("weights_proj", h, hi, slot="indexer"),
        )
    g = ca.o_groups
    return out + (
        Linear("sinks", 1, nh, is_module=False, slot="sinks", fp32=True),
        # DeepseekV4GroupedLinear(nh·d / g -> g·o_lora_rank): an nn.Linear subclass, left 16-bit by bitsandbytes
        Linear("o_a_proj", nh * d // g, g * ca.o_lora_rank, quantizable=False, slot="o_group"),
        Linear("o_b_proj", g * ca.o_lora_rank, h, slot="o"),
    )


def hyper_connection(name: str, h: int, n: int, role: str) -> tuple[Linear, ...]:
    """``DeepseekV4HyperConnection``'s fp32 parameters: fn ((2 + n)·n × n·h), base ((2 + n)·n), scale (3)."""
    m = (2 + n) * n
    return (
        Linear(f"{name}.fn", n * h, m, is_module=False, role=role, slot="hc", fp32=True),
        Linear(f"{name}.base", 1, m, is_module=False, role=role, slot="vector", fp32=True),
        Linear(f"{name}.scale", 1, 3, is_module=False, role=role, slot="vector", fp32=True),
    )


def moe_linears(h: int, experts: int, fe: int) -> tuple[Linear, ...]:
    """``DeepseekV4SparseMoeBlock``: the gate (a bare E × h weight), the fused experts, one shared SwiGLU expert."""
    return (
        Linear("gate", h, experts, is_module=False, role="router", slot="router"),
        Linear("experts.gate_up_proj", h, 2 * fe, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("experts.down_proj", fe, h, False, experts, is_module=False, role="expert", slot="experts"),
        Linear("gate_proj", h, fe, role="mlp", slot="shared_up"),
        Linear("up_proj", h, fe, role="mlp", slot="shared_up"),
        Linear("down_proj", fe, h, role="mlp", slot="shared_down"),
    )


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size", default=4096)
    nh = r.int("num_attention_heads", default=64)
    ca = compressed_attention(r)
    fe = r.int("moe_intermediate_size", default=2048)
    layers = r.int("num_hidden_layers", default=43)
    experts = r.int("n_routed_experts", "num_local_experts", default=256)
    n = r.int("hc_mult", default=4)
    mlp = moe_linears(h, experts, fe)
    groups: list[LayerGroup] = []
    for kind, mlp_kind in zip(layer_types(r, layers), mlp_layer_types(r, layers), strict=True):
        attention = ATTENTION_KINDS[kind]
        linears = hyper_connection("attn_hc", h, n, "attn") + attention_linears(h, nh, ca, attention)
        linears += hyper_connection("ffn_hc", h, n, "mlp") + mlp
        g = LayerGroup(
            1,
            linears,
            "moe",
            attention=attention,
            window=ca.window if attention == "sliding" else None,  # (every kind slides: CompressedAttention.window)
            intermediate_size=fe,
            router="hash" if mlp_kind == "hash_moe" else "",
        )
        if groups and groups[-1].same_tensors(g) and groups[-1].attention == attention:
            groups[-1] = replace(g, count=groups[-1].count + 1)
        else:
            groups.append(g)
    hashed = sum(g.count for g in groups if g.router == "hash")
    compressors = sum(g.count for g in groups if g.attention != "sliding")
    indexers = sum(g.count for g in groups if g.attention == "compressed_sparse")
    # DeepseekV4RotaryEmbedding's buffers (main / compress inv_freq and original_inv_freq, rope_dim / 2 fp32 each):
    # the model's, and one more set in every compressor and every indexer
    rotary = 4 * (1 + compressors + indexers) * round_alloc(4 * (ca.rope_dim // 2))
    k = r.int("num_experts_per_tok", default=6)
    return decoder(
        r,
        name,
        "deepseek_v4",
        (h, nh, 1, ca.head_dim),  # one key = value head, shared by every query head
        fe,
        tied=False,
        activation="swiglu_clamp",  # gate clamped to swiglu_limit, up to ± swiglu_limit (shared expert too)
        rotary_dim=ca.rope_dim,
        max_positions=r.int("max_position_embeddings", default=1048576),
        layer_groups=tuple(groups),
        compressed_attention=ca,
        hyper_connections=n,
        fp32_head_parameters=n * n * h + n + 1,  # hc_head: hc_fn, hc_base, hc_scale
        fp32_norms=True,
        # tid2eid (vocab × k, int64) in each hash layer; e_score_correction_bias (E, fp32) in each top-k layer
        buffer_bytes=rotary
        + hashed * round_alloc(r.int("vocab_size") * k * 8)
        + (layers - hashed) * round_alloc(experts * 4),
        num_experts=experts,
        experts_per_token=k,
        router="sqrtsoftplus",
        expert_gate="swiglu_clamp",
        attention_sinks=True,
        sdpa_fallback="eager",  # DeepseekV4PreTrainedModel._supports_sdpa = False
        flash_attention=False,  # _supports_flash_attn = False (and head_dim 512 > flash's 256)
        lora_breaks=("o_a_proj",),
        # NOTE: PEFT has no default target_modules for deepseek_v4 (peft/utils/constants.py), and all-linear takes
        # o_a_proj, whose forward LoRA cannot run: cabe's default is every other nn.Linear of the layers
        peft_default_targets=(
            "q_a_proj",
            "q_b_proj",
            "kv_proj",
            "o_b_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
            "weights_proj",
        ),
        attention_dropout=r.dropout("attention_dropout"),
    )
