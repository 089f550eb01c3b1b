"""Granite-4.0-H (``granitemoehybrid``): Mamba-2 and attention layers, MoE with a shared MLP, the Mamba-2 states of
serving. Hand-checked breakdowns with the arithmetic written out; the estimate against the trace (whose fused
Mamba-2 kernel is cabe.trace.ssm's stand-in) in tests/trace/test_granite_trace.py, parameter counts against
transformers' meta build in tests/test_presets.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import families, ssm
from cabe.activations import layer_activations, mamba
from cabe.analytic import estimate_model
from cabe.errors import ConfigError, InvalidValueError
from cabe.inference import estimate_inference
from cabe.kv_cache import kv_bytes_per_token, kv_cache_bytes
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

#: 4 layers (mamba, mamba, attention, mamba), h 256, 8 Mamba heads of 64, state 32, chunk 64, 4 experts top-2 of
#: width 128 and a shared MLP of 256 (traced in tests/trace/test_granite_trace.py)
TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/granitemoehybrid_tiny_config.json").read_text())


def test_tiny_parameters_by_hand():
    spec = families.from_config(TINY)
    h, v, d_inner, n, heads, e, f, fs = 256, 1000, 512, 32, 8, 4, 128, 256
    conv_dim = d_inner + 2 * 1 * n  # x, B, C
    assert conv_dim == 576
    in_proj = h * (d_inner + conv_dim + heads)  # z, xBC, dt
    mamba = in_proj + conv_dim * 4 + conv_dim + 3 * heads + d_inner + d_inner * h  # conv w + b, dt/A/D, norm, out
    assert mamba == 280_576 + 2_304 + 576 + 24 + 512 + 131_072 == 415_064
    attn = h * 256 + 2 * h * 128 + 256 * h  # 4 heads of 64, 2 kv heads
    mlp = e * h + e * 2 * f * h + e * f * h + h * 2 * fs + fs * h  # router, experts, shared input / output
    assert mlp == 1_024 + 262_144 + 131_072 + 131_072 + 65_536 == 590_848
    total = v * h + 3 * mamba + attn + 4 * (mlp + 2 * h) + h  # tied embedding, 2 norms per layer, final norm
    assert spec.parameter_count == total == 4_063_496
    assert [(r.count, r.mixer) for r in spec.runs] == [(2, "mamba2"), (1, "attention"), (1, "mamba2")]
    assert spec.attention_kind == "gqa+mamba2" and spec.mlp_kinds == "moe+shared"
    assert spec.attention_layers == 1 and spec.position == "none"


def test_published_totals_and_active():
    """IBM's cards: H-Small 32B total / 9B active, H-Tiny 7B / 1B active, H-1B and H-350M dense."""
    for name, total, active in (("granite-4.0-h-small", 32, 9), ("granite-4.0-h-tiny", 7, 1)):
        spec = preset(name).spec
        assert round(spec.parameter_count / 1e9) == total
        # the experts a token does not use: (E - k) of E, in every layer
        idle = (
            spec.num_layers
            * (spec.num_experts - spec.experts_per_token)
            * 3
            * spec.hidden_size
            * spec.ffn_size(spec.runs[0])
        )
        assert round((spec.parameter_count - idle) / 1e9) == active
    assert preset("granite-4.0-h-1b").spec.mlp_kinds == "gated"


def test_models_listing_names_each_mixer_once():
    """``cabe models``: H-Tiny's 40 layers are 36 Mamba-2 and 4 attention layers without rotary (its config's
    layer_types); the Mamba-2 count is written once (it was also appended a second time, as a linear mixer)."""
    from cabe.cli.models import kinds

    assert kinds(preset("granite-4.0-h-tiny").spec) == {"attention": "gqa+nope+mamba2x36", "mlp": "moe64x6+shared"}


def test_layer_types_spellings_and_errors():
    spec = families.from_config({**TINY, "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    assert [(r.count, r.mixer) for r in spec.runs] == [(3, "mamba2"), (1, "attention")]
    old = {k: v for k, v in TINY.items() if k != "layer_types"} | {"layers_block_type": ["attention"] * 4}
    assert families.from_config(old).mamba2 is None  # no Mamba-2 layer: no mixer on the spec
    with pytest.raises(ConfigError):
        families.from_config({**TINY, "layer_types": ["mamba"] * 3})
    with pytest.raises(ConfigError):
        families.from_config({**TINY, "mamba_d_head": 48})  # 8 × 48 != 2 × 256


def test_mamba_layer_saved_bytes_by_hand():
    """Layer 0 (Mamba-2 + MoE) of TINY in pure bf16, full training, batch 2 × 256 tokens: 6,935,552 B, which is the
    fake-CUDA trace's 6,936,064 B of layer 0 activations (``cabe trace -m tests/configs/files/
    granitemoehybrid_tiny_config.json --precision bf16 --batch 2 --seq 256 --attention sdpa --inventory``) less the
    experts' int32 offsets (one 512 B block)."""
    spec = families.from_config(TINY)
    setup = TrainingSetup(precision="bf16", batch=2, seq=256, attention="sdpa")
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=spec.runs[0])
    h, d_inner, width, k, f, fs = 256, 512, 1096, 2, 128, 256
    norm = 4 * h + 4 + 2 * h  # fp32 upcast, rsqrt, normalised (bf16)
    mixer = 2 * h + 2 * width + 2 * d_inner + 4  # in_proj's input, zxbcdt, the scan's y, the gated norm's rstd
    routed = 2 * h + 36 * k + 2 * k + k * (2 * h + 2 * 2 * f + 2 * f + 2 * f + 2 * h)  # router input, routing, experts
    shared = 3 * 2 * fs + 2 * fs  # gate and up (one fused output), silu, the product
    assert la.bytes_per_token == 2 * norm + mixer + routed + shared == 13_544
    assert la.constant_bytes == 2 * 512  # A = -exp(A_log.float()): exp's output and A, one block each
    assert 2 * 256 * la.bytes_per_token + la.constant_bytes == 6_935_552


def test_fused_kernel_workspaces_by_hand():
    """The fused kernel's transients per token (cabe.ssm, from ssd_combined.py), TINY in bf16 at s = 256: 4 chunks
    of 64, the chunk states 8 heads × 64 × 32 = 16,384 values per chunk."""
    spec = families.from_config(TINY)
    x, s, conv, d_inner, width = 2, 256, 576, 512, 1096
    states32, states_x = 4 * 16_384 * 4 // s, 2 * 16_384 * 4 // s  # 1,024 and 512 per token
    da_dt, cb, final = 2 * 4 * 8, 4 * 64, 4 * 16_384 // s  # fp32 each
    held = x * conv + da_dt + states_x + final
    assert mamba.forward_workspace(spec, s, x, 2) == max(held + states32, held + cb, held + x * d_inner + 2 * 256)
    base = x * (d_inner + conv + width + conv)  # out_recompute, xBC, dzxbcdt, dxBC
    scan = base + x * d_inner + x * 8 + da_dt + cb
    assert mamba.backward_workspace(spec, s, x, 2) == max(
        base + 2 * d_inner + x * d_inner,
        scan + 2 * states32 + 2 * states_x,
        scan + 2 * states_x + 4 * 8 + 2 * 4 * 32 + cb,
        base + x * d_inner + x * conv,
    )


def test_serving_states_and_kv_cache_of_attention_layers_only():
    spec = preset("granite-4.0-h-tiny").spec
    # 4 attention layers of 4 kv heads × 128: K and V
    assert kv_bytes_per_token(spec, "bf16") == 2 * 4 * 4 * 128 * 2 == 8_192
    assert kv_cache_bytes(spec, 32_768, 8, "bf16") == 8 * 32_768 * 8_192
    # 36 Mamba-2 layers: conv state (3,072 + 2 × 128) × 4 in bf16, SSM state 48 × 64 × 128 in fp32
    per_seq = 36 * ((3_328 * 4) * 2 + 48 * 64 * 128 * 4)
    assert ssm.state_bytes_per_sequence(spec, 2) == per_seq == 57_581_568
    est = estimate_inference(spec, context=32_768, batch=8)
    assert est["components"]["ssm_state"] == 8 * per_seq
    # the cache at the peak, the prefill of the prompt: 32,768 less the default 256 new tokens (cabe.generation)
    assert est["prompt_tokens"] == 32_512 and est["components"]["kv_cache"] == 8 * 32_512 * 8_192


def test_qlora_refused_and_note():
    spec = preset("granite-4.0-h-1b").spec
    with pytest.raises(InvalidValueError) as exc:
        estimate_model(spec, TrainingSetup(method="qlora"))
    assert exc.value.code == "qlora_mamba2_fused"
    report = estimate_model(spec, TrainingSetup(method="lora", batch=1, seq=512))
    assert "mamba2_kernel_modelled" in report.notes


def test_lora_below_the_first_adapted_layer_keeps_nothing():
    """q_proj / v_proj only in the attention layer (layer 2 of TINY): without checkpointing layers 0 and 1 carry no
    gradient; with it every layer's input requires grad (enable_input_require_grads). out_proj's adapter never runs
    in the fused kernel, so it does not start the gradient either."""
    from cabe.analytic.runs import _below_adapters

    spec = families.from_config(TINY)
    kw = dict(method="lora", precision="bf16", batch=2, seq=256)
    assert _below_adapters(spec, TrainingSetup(**kw, lora_targets=("q_proj", "v_proj"))) == 2
    assert _below_adapters(spec, TrainingSetup(**kw, lora_targets=("out_proj", "o_proj"))) == 2
    assert _below_adapters(spec, TrainingSetup(**kw, lora_targets=("q_proj",), checkpointing=True)) == 0
    assert _below_adapters(spec, TrainingSetup(**kw, lora_targets=("in_proj",))) == 0
    assert _below_adapters(spec, TrainingSetup(**kw)) == 0  # all-linear
