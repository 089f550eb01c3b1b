"""DeepSeek-V4 (``deepseek_v4``): compressed attention per ``layer_types`` (sliding, CSA with its indexer, HCA),
hash-routed and top-k MoE per ``mlp_layer_types``, hyper-connections. Parameter counts against transformers' meta
build (measured once, below; tests/test_presets.py rebuilds the preset), one layer's saved tensors by hand, the
serving cache, the refusals; the estimate against the trace in tests/trace/test_deepseek_v4_trace.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import families
from cabe.activations import layer_activations
from cabe.analytic import estimate_model
from cabe.cli.models import kinds
from cabe.compressed_attention import kv_cache_elements
from cabe.errors import ConfigError, InvalidValueError
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/deepseek_v4_tiny_config.json").read_text())


def test_parameters_equal_transformers_meta_build():
    # transformers 5.24 AutoModelForCausalLM.from_config on meta, sum(p.numel()): the default DeepseekV4Config (vocab
    # 129280), TINY, and a second tiny config (hc_mult 3, partial_rotary_factor, other rates, hash layers 0 and 2)
    assert families.from_config({"model_type": "deepseek_v4", "vocab_size": 129280}).parameter_count == 284_325_869_015
    assert families.from_config(TINY).parameter_count == 9_868_157
    other = {
        "model_type": "deepseek_v4",
        **dict(hidden_size=192, num_hidden_layers=5, num_attention_heads=4, head_dim=96, q_lora_rank=64),
        **dict(o_groups=2, o_lora_rank=40, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=80),
        **dict(vocab_size=1000, index_n_heads=2, index_head_dim=48, hc_mult=3, partial_rotary_factor=0.25),
        "compress_rates": {"compressed_sparse_attention": 8, "heavily_compressed_attention": 16},
        "mlp_layer_types": ["hash_moe", "moe", "hash_moe", "moe", "moe"],
    }
    assert families.from_config(other).parameter_count == 3_260_156
    assert preset("deepseek-v4-flash").spec.parameter_count == 284_325_869_015


def test_tiny_parameters_by_hand():
    h, n, nh, d, rq, g, ro, e, f, hi, di, v = 256, 4, 8, 64, 96, 4, 48, 16, 128, 4, 32, 4000
    hc = 2 * ((2 + n) * n * n * h + (2 + n) * n + 3)  # attn_hc and ffn_hc: fn, base, scale
    attn = h * rq + rq + rq * nh * d + h * d + d + nh + (nh * d // g) * (g * ro) + g * ro * h  # + sinks
    csa = 2 * h * 2 * d + 4 * 2 * d + d  # compressor kv_proj, gate_proj (2 series), position_bias (4 x 2d), kv_norm
    csa += 2 * h * 2 * di + 4 * 2 * di + di + rq * hi * di + h * hi  # its indexer
    hca = 2 * h * d + 32 * d + d  # compressor over disjoint windows of 32
    moe = e * h + e * 2 * f * h + e * h * f + 3 * h * f  # gate, experts, shared expert
    layer = hc + attn + moe + 2 * h  # + input and post-attention norms
    top = 2 * v * h + h + n * n * h + n + 1  # embeddings, lm_head, final norm, hc_head
    assert 4 * layer + 2 * csa + hca + top == 9_868_157


def test_layers_follow_layer_types_and_mlp_layer_types():
    spec = families.from_config(TINY)
    assert [(g.attention, g.router) for g in spec.runs] == [
        ("sliding", "hash"),
        ("compressed_sparse", ""),
        ("heavily_compressed", ""),
        ("compressed_sparse", ""),
    ]
    assert kinds(spec) == {
        "attention": "mqa+sliding64+sinks+csa4x2+hca32x1+indexer64",
        "mlp": "hash-moe16x4(swiglu_clamp)+shared+moe16x4(swiglu_clamp)+shared",
    }
    # DeepseekV4Config's default schedule: two HCA layers, then CSA / HCA alternating; 3 hash layers
    default = families.from_config({"model_type": "deepseek_v4", "vocab_size": 129280})
    assert [g.attention for g in default.layer_groups for _ in range(g.count)][:5] == ["heavily_compressed"] * 3 + [
        "compressed_sparse",
        "heavily_compressed",
    ]
    assert sum(g.count for g in default.layer_groups if g.router == "hash") == 3
    with pytest.raises(ConfigError):
        families.from_config({**TINY, "layer_types": ["full_attention"] * 4})


def test_one_sliding_hash_layer_saved_tensors_by_hand():
    """Layer 0 of TINY (sliding window, hash-routed MoE), pure bf16, batch 2 × 512: the trace's inventory of the same
    layer (``cabe trace --inventory``) lists 81,111,552 B."""
    spec = families.from_config(TINY)
    setup = TrainingSetup(precision="bf16", batch=2, seq=512, attention="eager")
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=spec.runs[0])
    h, n, m, nh, d, rq, s, e, k, f, a = 256, 4, 24, 8, 64, 96, 512, 16, 4, 128, 2
    q = nh * d
    # a hyper-connection: the streams (a·n·h), their fp32 flattening (4·n·h), rsqrt, the normalised streams for fn
    # (4·n·h), the mixes (4·m), pre / post sigmoids, comb's softmax, 39 Sinkhorn divisions (numerator n², denominator
    # n, fp32), pre + eps
    hc = a * n * h + 4 * n * h + 4 + 4 * n * h + 4 * m + 8 * n + 4 * n * n + 39 * 4 * (n * n + n) + 4 * n
    assert hc == 13_572
    norm = 4 * h + 4 + 4 * h  # fp32 input, rsqrt, fp32 normalised (the weight is fp32)
    attn = (
        a * h  # q_a_proj's and kv_proj's input
        + (4 * rq + 4 + 4 * rq)  # q_a_norm
        + a * rq  # q_b_proj's input
        + (4 * q + a * nh + 4 * nh + a * q)  # q_b_norm: fp32 copy, rsqrt's cast, rsqrt, q_b_proj's output
        + (4 * d + 4 + 4 * d)  # kv_norm
        + a * q  # the rotated query
        + 8 * nh  # the row max's indices
        + 4 * nh * (s + 1)  # the fp32 softmax with the sink column
        + a * nh * s  # its cast for the value matmul
        + a * q  # o_a_proj's bmm input
        + a * 4 * 48  # o_b_proj's input (groups × o_lora_rank)
    )
    mix = a * n + a * h + a * n * n  # post, the block's output, comb's cast
    moe = (
        a * h  # the normed input (shared expert, gate)
        + 2 * a * e  # softplus's input, sqrt's output
        + 8 * k
        + a * (1 + k)  # tid2eid's indices, the weights' sum and gather
        + 24 * k  # grouped_mm's index vectors
        + k * a * h
        + 2 * k * a * f
        + 3 * k * a * f
        + k * a * f
        + k * a
        + k * a * h  # routed experts
        + 2 * a * f
        + 3 * a * f
        + a * f  # shared expert: gate / up, clamps and silu, product
    )
    per_token = 2 * hc + 2 * norm + attn + moe + 2 * mix
    assert per_token == 77_066
    constant = 3 * 2 * 16_384 + 2 * (a * 2 * nh * s * d) + 512  # rotary cos / sin, repeat_kv's k and v, offsets
    assert la.bytes_per_token == per_token
    assert 1024 * per_token + la.constant_bytes == 1024 * per_token + constant == 81_111_552


def test_kv_cache_by_layer_kind():
    spec = families.from_config(TINY)
    sliding, csa, hca = spec.runs[0], spec.runs[1], spec.runs[2]
    # 1000 tokens: sliding keeps its 64-token window as k and v; CSA the window (k = v), 250 entries of 64 + 32
    # (indexer), no open window (1000 = 250 × 4), the last window's overlap (2 × 4 × (64 + 32)); HCA 31 entries of
    # 64 and the 8 open tokens' kv and gate
    assert kv_cache_elements(spec, sliding, 1000) == 2 * 64 * 64
    assert kv_cache_elements(spec, csa, 1000) == 64 * 64 + 250 * 96 + 2 * 4 * 96
    assert kv_cache_elements(spec, hca, 1000) == 64 * 64 + 31 * 64 + 8 * 2 * 64


def test_refusals_say_why():
    spec = families.from_config(TINY)
    with pytest.raises(InvalidValueError) as err:
        estimate_model(spec, TrainingSetup(method="prompt-tuning"))
    assert err.value.code == "prompt_tuning_hash_routing"
    for targets in (("all-linear",), ("o_a_proj",)):
        with pytest.raises(InvalidValueError) as err:
            estimate_model(spec, TrainingSetup(method="lora", lora_targets=targets))
        assert err.value.code == "lora_target_breaks"
    # cabe's default LoRA targets: every nn.Linear PEFT can run (not o_a_proj); QLoRA leaves o_a_proj 16-bit
    assert estimate_model(spec, TrainingSetup(method="qlora")).total_bytes > 0
    assert "o_a_proj" not in spec.peft_default_targets
    assert not next(lin for lin in spec.runs[0].linears if lin.name == "o_a_proj").quantized_by_bnb
