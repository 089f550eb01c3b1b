"""Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5_text``, ``qwen3_5_moe_text``): gated DeltaNet layers among gated
attention layers, MoE with a shared expert. Hand-checked counts and saved bytes with the arithmetic written out;
parameter counts against transformers' meta build here (tiny configs) and in tests/test_presets.py (the preset);
the estimate against the fake-CUDA trace in benchmarks/differential (``--models qwen3-next-80b-a3b``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import families
from cabe.activations import layer_activations
from cabe.cli.models import kinds
from cabe.errors import ConfigError
from cabe.kv_cache import kv_bytes_per_token, kv_cache_bytes
from cabe.linear_attention import state_bytes
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/qwen3_next_tiny_config.json").read_text())


def test_qwen3_next_80b_parameters_by_hand():
    spec = preset("qwen3-next-80b-a3b").spec
    h, v = 2048, 151936
    # gated attention: q_proj makes queries and the gate (2 × 16 × 256), k / v 2 × 256, o 16 × 256 -> h
    attn = h * 8192 + 2 * h * 512 + 4096 * h
    # gated DeltaNet: key_dim 16 × 128, value_dim 32 × 128; in_proj_qkvz h -> 2·2048 + 2·4096, in_proj_ba h -> 2·32,
    # conv1d (2·2048 + 4096) channels × 4 taps, dt_bias and A_log 32 each, the gated norm 128, out_proj 4096 -> h
    deltanet = h * 12288 + h * 64 + 8192 * 4 + 32 + 32 + 128 + 4096 * h
    assert (attn, deltanet) == (27_262_976, 33_718_464)
    # MoE: the router 512 × h, 512 experts of 3 × 512 × h, the shared expert 3 × 512 × h and its gate h -> 1
    moe = 512 * h + 512 * 3 * 512 * h + 3 * 512 * h + h
    # 12 full-attention layers (q / k norms of 256 each), 36 linear ones, 2 norms of h per layer, every layer MoE
    total = 2 * v * h + h + 12 * (attn + 2 * 256 + 2 * h) + 36 * (deltanet + 2 * h) + 48 * moe
    assert total == spec.parameter_count == 79_674_391_296  # "80B total" (the authors)
    # active per token: the 10 routed experts of 512, not the other 502; 3.25B without the embedding and lm_head
    # ("3B active", Qwen blog; NVIDIA's model card says 3.9B with them)
    active = total - 48 * 502 * 3 * 512 * h
    assert (active, active - 2 * v * h) == (3_874_929_408, 3_252_599_552)
    assert [(g.count, g.mixer) for g in spec.layer_groups[:2]] == [(3, "gated_deltanet"), (1, "attention")]
    assert sum(g.count for g in spec.layer_groups if g.mixer == "gated_deltanet") == 36


def test_models_lists_the_linear_attention_layers():
    spec = preset("qwen3-next-80b-a3b").spec
    assert kinds(spec) == {"attention": "gqa+gated+gated_deltanetx36", "mlp": "moe512x10+shared"}


def test_serving_keeps_kv_in_attention_layers_and_a_fixed_state_in_linear_ones():
    spec = preset("qwen3-next-80b-a3b").spec
    # only the 12 attention layers cache tokens: 2 (k, v) × 2 kv heads × 256 × 2 B each
    assert kv_bytes_per_token(spec, "bf16") == 12 * 2 * 2 * 256 * 2 == 24_576
    # each linear layer keeps conv state (2·2048 + 4096 channels × 4 taps, 16-bit) and the fp32 recurrent state
    # (32 value heads × 128 × 128), whatever the context
    per_sequence = 36 * (8192 * 4 * 2 + 32 * 128 * 128 * 4)
    assert state_bytes(spec) == per_sequence == 77_856_768
    assert kv_cache_bytes(spec, 32768, 4, "bf16") == 4 * (32768 * 24_576 + per_sequence)
    assert kv_cache_bytes(spec, 1, 1, "bf16") - kv_cache_bytes(spec, 0, 1, "bf16") == 24_576


def test_gated_deltanet_layer_saved_bytes_by_hand():
    """One linear layer of Qwen3-Next-80B in pure bf16 (a = ρ = 2), full fine-tuning: the mixer's saved tensors per
    token. The tiny config's layer 2 measured with saved-tensor hooks on CPU (fla's / causal-conv1d's allocations
    patched in, cabe.trace.linear_attention), LoRA bf16: 2,566,704 B against 2,568,704 estimated (2 × 128 tokens)."""
    spec = preset("qwen3-next-80b-a3b").spec
    setup = TrainingSetup(precision="bf16", batch=1, seq=4096, attention="sdpa")
    run = spec.runs[0]
    assert run.mixer == "gated_deltanet"
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=run)
    got = {t.name: t.bytes_per_token for t in la.terms if not t.name.startswith(("mlp", "moe", "shared"))}
    h, hk, hv, kd, vd = 2048, 16, 32, 2048, 4096
    assert got == {
        "input_norm.fp32_input": 4 * h,
        "input_norm.rsqrt": 4,
        "input_norm.normalized": 4 * h,  # (1 + w) in fp32: the normalised tensor is fp32
        "attn.input": 2 * h,  # in_proj_qkvz and in_proj_ba read the normed input
        "gdn.beta": 2 * hv,  # sigmoid's output, which the kernel saves too
        "gdn.softplus_input": 4 * hv,
        "gdn.softplus_output": 4 * hv,  # saved by the product with -exp(A_log), which trains
        "gdn.conv_input": 2 * (2 * kd + vd),  # CausalConv1dFn saves x
        "gdn.q_k_normalized": 2 * 2 * kd,  # fla's l2norm_fwd outputs
        "gdn.q_k_rstd": 2 * 4 * hk,
        "gdn.value": 2 * vd,
        "gdn.g_cumsum": 4 * hv,
        "gdn.A": 2 * 64 * hv,  # the solved (B, T, Hv, 64) in k's dtype
        "gdn.norm.fp32_input": 4 * vd,
        "gdn.norm.rsqrt": 4 * hv,
        "gdn.norm.normalized": 2 * vd,
        "gdn.norm_weighted": 2 * vd,
        "gdn.gate_silu": 2 * 4 * vd,  # silu's fp32 input and output
        "attn.out.input": 2 * vd,  # out_proj's input
    }
    assert sum(got.values()) == 8192 + 4 + 8192 + 4096 + 64 + 128 + 128 + 16384 + 8192 + 128 + 8192 + 128 + 4096 + (
        16384 + 128 + 8192 + 8192 + 32768 + 8192
    )
    assert la.flash_rng_bytes == 0  # no attention kernel in this layer


def test_layer_types_from_the_interval_or_the_list():
    spec = families.from_config(TINY)  # 4 layers, full_attention_interval 2
    assert [g.mixer for g in spec.layer_groups] == ["gated_deltanet", "attention"] * 2
    listed = dict(TINY, layer_types=["full_attention"] * 3 + ["linear_attention"])
    assert [(g.count, g.mixer) for g in families.from_config(listed).layer_groups] == [
        (3, "attention"),
        (1, "gated_deltanet"),
    ]
    with pytest.raises(ConfigError):
        families.from_config(dict(TINY, layer_types=["full_attention"]))
    with pytest.raises(ConfigError):
        families.from_config(dict(TINY, linear_num_value_heads=3))


QWEN3_5 = {
    "qwen3_5_text": {"intermediate_size": 1024},
    "qwen3_5_moe_text": {"moe_intermediate_size": 128, "shared_expert_intermediate_size": 256},
    "qwen3_next": {"decoder_sparse_step": 2, "mlp_only_layers": [3], "tie_word_embeddings": True},
}


@pytest.mark.trace
@pytest.mark.parametrize("model_type", list(QWEN3_5))
def test_parameter_count_equals_transformers_meta_build(model_type):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in TINY.items() if k not in ("intermediate_size", "decoder_sparse_step")}
    cfg.update(QWEN3_5[model_type], model_type=model_type, num_hidden_layers=5, linear_value_head_dim=48)
    if model_type == "qwen3_next":
        cfg["intermediate_size"] = 768
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    assert families.from_config(cfg).parameter_count == sum(p.numel() for p in model.parameters())
