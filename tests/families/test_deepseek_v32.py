"""DeepSeek-V3.2 (``deepseek_v32``): V3's latent attention with a lightning indexer in every layer, MLPs by
``mlp_layer_types``. Hand-checked with the arithmetic written out; parameter counts against transformers' meta
build in tests/test_presets.py, the estimate against the trace in tests/trace/test_deepseek_trace.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe import families
from cabe.activations import layer_activations
from cabe.errors import ConfigError
from cabe.flops import matmul_params
from cabe.kv_cache import kv_bytes_per_token
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

TINY = json.loads((Path(__file__).resolve().parents[1] / "configs/files/deepseek_v32_tiny_config.json").read_text())


def test_v32_exp_parameters_are_v3_plus_the_indexers():
    v3, v32 = preset("deepseek-v3").spec, preset("deepseek-v3.2-exp").spec
    h, q_rank, heads, width = 7168, 1536, 64, 128
    # wq_b (q_rank -> 64·128), wk (h -> 128), k_norm (LayerNorm: weight + bias), weights_proj (h -> 64)
    indexer = q_rank * heads * width + h * width + 2 * width + h * heads
    assert indexer == 12_582_912 + 917_504 + 256 + 458_752 == 13_959_424
    assert v32.parameter_count == v3.parameter_count + 61 * indexer == 671_877_929_216
    # DeepSeek prints V3's "671B": transformers' count is 671.88B (the indexers are 0.85B)
    assert int(v32.parameter_count / 1e9) == 671
    # activated per token: all but the 248 routed experts a token skips in each of the 58 MoE layers
    total, active = matmul_params(v32)
    assert v32.parameter_count - (total - active) == 38_403_807_488  # V3: 37,552,282,624 ("37B")
    assert [(r.count, r.mlp) for r in v32.runs] == [(3, "gated"), (58, "moe")]
    assert v32.flash_attention is False


def test_kv_cache_adds_the_indexer_key():
    spec = preset("deepseek-v3.2-exp").spec
    # per token and layer: the latent (512), the rotary key (64) and the indexer's key (128), bf16
    assert kv_bytes_per_token(spec, "bf16") == 61 * (512 + 64 + 128) * 2 == 85_888


def test_mlp_layer_types_are_read_layer_by_layer():
    spec = families.from_config({**TINY, "mlp_layer_types": ["sparse", "dense", "dense", "sparse"]})
    assert [(g.count, g.mlp) for g in spec.layer_groups] == [(1, "moe"), (2, "gated"), (1, "moe")]
    with pytest.raises(ConfigError):
        families.from_config({**TINY, "mlp_layer_types": ["dense", "moe", "dense", "dense"]})


def test_indexer_transient_and_mask_by_hand():
    """A dense layer of TINY in pure bf16, SDPA, batch 2 × 512: the indexer's matmul broadcasts its key over the
    queries (b·s copies of (64, s)) beside the fp32 scores (4 heads), while the attention's q_b_proj output (8 heads
    of 64 + 32, bf16: 1,536 per token) is still a local of its forward; SDPA saves the additive mask (2·s)."""
    spec = families.from_config(TINY)
    setup = TrainingSetup(precision="bf16", batch=2, seq=512, attention="sdpa")
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=spec.runs[0])
    hi, di, s = 4, 64, 512
    qk = 2 * (hi * di + di) + 4 * (hi * di + di)  # rotated q and k (bf16) and their .float() copies
    q_b = 2 * 8 * (64 + 32)
    assert la.indexer_transient_per_token == qk + 4 * di * s + 4 * hi * s + q_b == 142_720
    assert {t.name: t.bytes_per_token for t in la.terms}["attn.mask_bias"] == 2 * 512
    # with one sequence the broadcast key is a view: the scores and the scaled scores only
    one = TrainingSetup(precision="bf16", batch=1, seq=512, attention="sdpa")
    la1 = layer_activations(spec, one, dtypes_for(one), base_trainable=True, adapters=False, group=spec.runs[0])
    assert (
        la1.indexer_transient_per_token == 2 * (hi * di + di) + max(4 * (hi * di + di) + 4 * hi * s, 8 * hi * s) + q_b
    )


def test_lora_dropout_on_wrapped_parameters_is_refused_as_peft_refuses_it():
    from cabe.analytic import estimate_model
    from cabe.errors import InvalidValueError

    spec = families.from_config(TINY)
    # PEFT's default (all-linear) moves onto the fused experts and the router: ParamWrapper raises
    # "lora.ParamWrapper does not work with lora_dropout != 0" (peft/tuners/lora/layer.py 0.21.2)
    with pytest.raises(InvalidValueError) as e:
        estimate_model(spec, TrainingSetup(method="lora", lora_dropout=0.05))
    assert e.value.code == "lora_dropout_wrapped"
    # attention projections only are plain nn.Linear modules: dropout is fine
    estimate_model(spec, TrainingSetup(method="lora", lora_dropout=0.05, lora_targets=("q_b_proj", "o_proj")))
