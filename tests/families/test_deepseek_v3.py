"""DeepSeek-V3 / R1 (``deepseek_v3``): multi-head latent attention, dense then MoE layers, grouped sigmoid routing,
the latent KV cache. Hand-checked breakdowns with the arithmetic written out; the per-layer saved bytes against
PyTorch are in tests/core_torch/test_saved_tensors.py, the estimate against the trace in
tests/trace/test_deepseek_trace.py, parameter counts against transformers' meta build in tests/test_presets.py."""

from __future__ import annotations

import json
from pathlib import Path

from cabe import families
from cabe.activations import layer_activations
from cabe.kv_cache import kv_bytes_per_token, kv_cache_bytes
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

#: a tiny DeepSeek-V3, shared with tests/trace/configs.py DEEPSEEK_V3 (traced in tests/trace/test_deepseek_trace.py)
TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/deepseek_v3_tiny_config.json").read_text())


def test_deepseek_v3_parameters_by_hand():
    spec = preset("deepseek-v3").spec
    h, nh, v = 7168, 128, 129280
    # attention: q_a 7168×1536, q_b 1536×128·(128+64), kv_a 7168×(512+64), kv_b 512×128·(128+128), o 128·128×7168
    attn = h * 1536 + 1536 * nh * 192 + h * 576 + 512 * nh * 256 + nh * 128 * h
    assert attn == 11_010_048 + 37_748_736 + 4_128_768 + 16_777_216 + 117_440_512 == 187_105_280
    norms = 2 * h + 1536 + 512  # input / post-attention norms, q_a_layernorm, kv_a_layernorm
    dense = 3 * h * 18432  # gate, up, down of the 3 dense layers
    # MoE: the router (256 × h; e_score_correction_bias is a buffer), 256 experts of 3 × h × 2048, one shared
    moe = 256 * h + 256 * 3 * h * 2048 + 3 * h * 2048
    assert moe == 1_835_008 + 11_274_289_152 + 44_040_192
    total = 2 * v * h + h + 61 * (attn + norms) + 3 * dense + 58 * moe
    assert total == spec.parameter_count == 671_026_404_352
    # the published 685B adds the multi-token-prediction module transformers does not build: one more MoE layer
    # with its attention (11.51B), eh_proj (2h × h) and its own embedding and head copies (2 × 0.93B)
    mtp = attn + norms + moe + 2 * h * h + 2 * v * h + 3 * h
    assert round((total + mtp) / 1e9) == 684  # the Hub rounds 684.5B to 685B
    assert [(r.count, r.mlp) for r in spec.runs] == [(3, "gated"), (58, "moe")]
    assert spec.expert_groups == (8, 4) and spec.router == "sigmoid_groups"
    assert preset("deepseek-r1").spec.parameter_count == total


def test_latent_kv_cache_is_the_latent_and_the_rotary_key():
    spec = preset("deepseek-v3").spec
    # transformers 5.24 caches kv_nope (512) and k_rot (64) per token and layer, not the expanded k and v
    assert kv_bytes_per_token(spec, "bf16") == 61 * (512 + 64) * 2 == 70_272
    assert kv_cache_bytes(spec, 32768, 2, "fp8") == 2 * 32768 * 61 * 576 * 1


def test_tiny_dense_layer_saved_bytes_by_hand():
    """Layer 0 (dense) of TINY in pure bf16 with SDPA, batch 2 × 512 tokens: 17,612,800 B, which is the fake-CUDA
    trace's 17,679,360 B of layer 0 activations (``cabe trace --inventory``) less the model's cos and sin
    (2 × 32,768 B, first saved in layer 0) and the kernel's philox seed and offset (2 × 512 B)."""
    spec = families.from_config(TINY)
    setup = TrainingSetup(precision="bf16", batch=2, seq=512, attention="sdpa")
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=spec.runs[0])
    h, nh, rq, rkv, f = 256, 8, 96, 64, 704
    norm = 4 * h + 4 + 2 * h  # fp32 upcast, rsqrt, normalised (bf16)
    per_token = (
        norm  # input_layernorm
        + 2 * h  # q_a_proj and kv_a_proj_with_mqa read one tensor
        + (4 * rq + 4 + 2 * rq)
        + 2 * rq  # q_a_layernorm, q_b_proj's input
        + (4 * rkv + 4 + 2 * rkv)
        + 2 * rkv  # kv_a_layernorm, kv_b_proj's input
        + 2 * nh * (64 + 32)  # query: cat(q_nope, q_rope)
        + 2 * nh * (64 + 32)  # key: new_empty + copy_ of k_nope and the shared k_rope
        + 2 * nh * (64 + 64)  # kv_b_proj's whole output, kept alive by the value (a strided view of it)
        + 2 * nh * 64  # the memory-efficient kernel's output (o_proj's input)
        + 4 * nh  # its fp32 logsumexp
        + norm  # post_attention_layernorm
        + 2 * h  # gate_proj and up_proj read one tensor
        + 4 * 2 * f  # gate, silu, up, their product
    )
    assert per_token == 17_200
    assert la.bytes_per_token * 2 * 512 == per_token * 1024 == 17_612_800
    assert la.flash_rng_bytes == 2 * 512


def test_q_without_low_rank_is_one_q_proj():
    spec = families.from_config(dict(TINY, q_lora_rank=None))
    names = spec.runs[0].slot_names("qkv")
    assert names == ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj"]
    la = spec.latent_attention
    assert la is not None and la.q_lora_rank == 0 and la.norm_count == 64  # kv_a_layernorm only


def test_latent_attention_flops_use_the_qk_and_v_head_dims():
    from cabe.flops import attention_flops_forward_per_token

    spec = preset("deepseek-v3").spec
    # per layer and token: 2 · s · heads · (nope + rope) for QKᵀ and 2 · s · heads · v_head_dim for A·V
    assert attention_flops_forward_per_token(spec, 4096) == 61 * 2 * 4096 * 128 * (192 + 128)
