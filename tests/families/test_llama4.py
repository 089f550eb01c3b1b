"""Llama 4 (``llama4``, ``llama4_text``): interleaved dense / MoE layers with a shared expert and dense expert
dispatch, chunked local attention and its NoPE layers, the vision tower of the multimodal config. Hand-checked
parameter counts and one layer's saved bytes with the arithmetic written out; the per-layer saved bytes against
PyTorch are in tests/core_torch/test_saved_tensors.py, the estimate against the trace in
tests/trace/test_llama4_trace.py, the presets against transformers' meta build in tests/test_presets.py."""

from __future__ import annotations

import copy

import pytest

from cabe import api, families, models
from cabe.activations import layer_activations
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.flops import matmul_params
from cabe.kv_cache import kv_cache_bytes
from cabe.models import preset
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup

H, V = 5120, 202_048
ATTN = H * H + 2 * H * 1024 + H * H  # q (40 × 128), k and v (8 × 128), o: 62,914,560
MOE = H * 16 + 16 * H * 2 * 8192 + 16 * 8192 * H + 3 * H * 8192  # router, 16 experts' gate_up and down, shared
DENSE = 3 * H * 16384  # gate, up, down of width intermediate_size_mlp
#: Llama4VisionModel (1408 wide, 34 layers, 336 px, patch 14) and the projector, term by term:
#:   patch linear 3·14·14·1408 = 827,904; class embedding 1,408; positions (24² + 1)·1408 = 812,416;
#:   layernorm_pre / post 4·1408 = 5,632
#:   per layer: q/k/v/o 4·(1408² + 1408) = 7,935,488; fc1 1408·5632 + 5632 = 7,935,488;
#:   fc2 5632·1408 + 1408 = 7,931,264; two LayerNorms 4·1408 = 5,632 -> 23,807,872 × 34 = 809,467,648
#:   adapter fc1 5632·4096 = 23,068,672, fc2 4096² = 16,777,216; projector 4096·5120 = 20,971,520
VISION = 827_904 + 1_408 + 812_416 + 5_632 + 34 * 23_807_872 + 23_068_672 + 16_777_216 + 20_971_520


def test_scout_parameters_by_hand():
    spec = preset("llama-4-scout-17b-16e").spec
    assert ATTN == 62_914_560 and MOE == 2_139_176_960 and VISION == 871_932_416
    text = 2 * V * H + H + 48 * (ATTN + 2 * H + MOE)  # embedding and untied head, final norm, 48 MoE layers
    assert text == 107_769_861_120
    assert spec.vision_parameters == VISION
    assert spec.parameter_count == text + VISION == 108_641_793_536  # the model card's "109B"
    # 17B active: the k = 1 picked expert of 16 (and the shared one) per token
    active = 2 * V * H + 48 * (ATTN + H * 16 + 16 * H * 3 * 8192 // 16 + 3 * H * 8192)
    assert round(active / 1e9) == 17
    assert [(r.count, r.rope) for r in spec.runs[:2]] == [(3, True), (1, False)] and len(spec.runs) == 24
    assert spec.attention_kind == "gqa+chunked" and spec.mlp_kinds == "moe+shared" and spec.qk_norm == "l2"


def test_maverick_parameters_by_hand():
    spec = preset("llama-4-maverick-17b-128e").spec
    moe = H * 128 + 128 * H * 3 * 8192 + 3 * H * 8192
    text = 2 * V * H + H + 48 * (ATTN + 2 * H) + 24 * DENSE + 24 * moe  # dense even layers, MoE odd ones
    assert text == 400_711_848_960
    assert spec.parameter_count == text + VISION == 401_583_781_376  # "400B"
    assert [r.mlp for r in spec.runs[:4]] == ["gated", "moe", "gated", "moe"] and spec.qk_norm == "none"
    assert spec.mlp_kinds == "gated+moe+shared"


def test_layer_plan_from_the_config_lists():
    cfg = dict(
        model_type="llama4_text",
        hidden_size=64,
        intermediate_size=96,
        intermediate_size_mlp=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
        moe_layers=[1, 2],
        no_rope_layers=[1, 0, 1, 1, 0, 1, 1],  # longer than the layers: transformers reads the first 6
        attention_chunk_size=32,
    )
    spec = families.from_config(cfg)
    plan = [(g.count, g.mlp, g.rope, g.attention) for g in spec.layer_groups]
    assert plan == [
        (1, "gated", True, "chunked"),
        (1, "moe", False, "full"),
        (1, "moe", True, "chunked"),
        (1, "gated", True, "chunked"),
        (1, "gated", False, "full"),
        (1, "gated", True, "chunked"),
    ]
    # no attention_chunk_size: every layer attends globally (layer_types all full_attention)
    spec = families.from_config({**cfg, "attention_chunk_size": None})
    assert {g.attention for g in spec.layer_groups} == {"full"}


def test_moe_layer_saved_bytes_by_hand():
    """One Scout MoE layer with rotary (chunked, q/k L2 norm), pure bf16, full fine-tuning, SDPA at 4,096 tokens
    (under the 8,192 chunk: no mask, the flash kernel), per token (a = ρ = 2 bytes):
      input norm 4h + 4 + 2h, q/k/v input 2h                       = 20,480 + 4 + 10,240 + 10,240
      L2 norms (fp32 q and k, rsqrt per head) 4q + 4nh + 4kv + 4nkv = 20,480 + 160 + 4,096 + 32
      flash: q, k, v, output, log-sum-exp 2q + 2kv + 2kv + 2q + 4nh = 10,240 + 2,048 + 2,048 + 10,240 + 160
      MLP norm 4h + 4 + 2h, router / shared input 2h              = 20,480 + 4 + 10,240 + 10,240
      router: top-k indices 8k, fp32 sigmoid 4E, scores column 2E = 8 + 64 + 32
      every expert: repeated input and the bmm's input 2·E·2h     = 163,840 × 2
      gate_up E·2·2f, activation E·2f, product E·2f               = 524,288 + 262,144 + 262,144
      shared expert: gate, act, up, product 4·2f                  = 65,536"""
    spec = preset("llama-4-scout-17b-16e").spec
    setup = TrainingSetup(precision="bf16", batch=1, seq=4096, attention="sdpa")
    rope, nope = spec.runs[0], spec.runs[1]
    la = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=rope)
    attn = 20_480 + 4 + 10_240 + 10_240 + 20_480 + 160 + 4_096 + 32 + 10_240 + 2_048 + 2_048 + 10_240 + 160
    mlp = 20_480 + 4 + 10_240 + 10_240 + 8 + 64 + 32 + 2 * 163_840 + 524_288 + 2 * 262_144 + 65_536
    assert la.bytes_per_token == attn + mlp == 1_573_328
    # the routed experts' backward: max(E·2h + E·2f, 3·E·2f - the saved product) = 2·E·2f
    assert la.backward_workspace_per_token == 2 * 16 * 2 * 8192
    # the NoPE layer: no L2 norms (-24,768 B per token); its temperature-tuned queries keep 4·s bytes of scales
    ln = layer_activations(spec, setup, dtypes_for(setup), base_trainable=True, adapters=False, group=nope)
    assert ln.bytes_per_token == la.bytes_per_token - (20_480 + 160 + 4_096 + 32)
    assert ln.per_layer_bytes == 4 * 4096


def test_chunked_layers_cap_the_kv_cache_at_the_chunk():
    spec = preset("llama-4-scout-17b-16e").spec
    per = 2 * 8 * 128 * 2  # k and v, 8 kv heads × 128, bf16
    # 36 chunked layers hold at most 8,192 tokens, the 12 NoPE layers the whole context
    assert kv_cache_bytes(spec, 100_000) == per * (36 * 8192 + 12 * 100_000)
    assert kv_cache_bytes(spec, 4096) == per * 48 * 4096


def test_every_token_goes_through_every_expert_in_the_flops():
    spec = preset("llama-4-scout-17b-16e").spec
    total, computed = matmul_params(spec)
    assert computed == total  # dense dispatch: all 16 experts multiply every token (the card's 17B is k = 1)


def test_flash_and_lora_on_the_router_are_refused():
    spec = preset("llama-4-maverick-17b-128e").spec
    with pytest.raises(InvalidValueError) as e:
        estimate_model(spec, TrainingSetup(attention="flash"))
    assert e.value.code == "flash_unsupported"
    for targets in (("all-linear",), ("q_proj", "router")):
        with pytest.raises(InvalidValueError) as e:
            estimate_model(spec, TrainingSetup(method="lora", lora_targets=targets))
        assert e.value.code == "lora_target_breaks"


def test_hub_ids_resolve_offline_and_kinds_show():
    from cabe.cli.models import kinds

    assert models.preset_for_id("meta-llama/Llama-4-Scout-17B-16E-Instruct") == "llama-4-scout-17b-16e"
    assert models.preset_for_id("meta-llama/llama-4-maverick-17b-128e") == "llama-4-maverick-17b-128e"
    # the Hub id of a gated preset plans offline, as the preset does
    by_id = api.build({"model": "meta-llama/Llama-4-Scout-17B-16E", "method": "qlora"}).total_bytes
    assert by_id == api.build({"model": "llama-4-scout-17b-16e", "method": "qlora"}).total_bytes
    assert kinds(preset("llama-4-scout-17b-16e").spec) == {
        "attention": "gqa+chunked8192+nope",
        "mlp": "moe16x1(every-expert)+shared",
    }
    assert kinds(preset("llama-4-maverick-17b-128e").spec)["mlp"] == "gated+moe128x1(every-expert)+shared"


def test_nested_text_config_reads_with_defaults():
    # a multimodal config whose text_config names only two keys: Llama4TextConfig's defaults fill the rest, and
    # the vision tower is Llama4VisionConfig's defaults (768 wide, 34 layers, 448 px): transformers' meta build
    # of Llama4ForConditionalGeneration is 6,928,358,400 (tests/trace/test_llama4_trace.py builds it)
    spec = families.from_config({"model_type": "llama4", "text_config": {"num_hidden_layers": 2}})
    assert (spec.hidden_size, spec.num_experts, spec.vocab_size) == (5120, 16, 202_048)
    assert spec.parameter_count == 6_928_358_400
    flat = families.from_config({"model_type": "llama4_text", "num_hidden_layers": 2})
    assert spec.parameter_count - spec.vision_parameters == flat.parameter_count
    with pytest.raises(Exception):
        families.from_config(copy.deepcopy({"model_type": "llama4", "text_config": [1]}))


def test_qlora_quantizes_the_vision_linears_by_hand():
    """transformers' bitsandbytes integration makes every exact ``nn.Linear`` 4-bit (integrations/bitsandbytes.py:
    189) but the output embedding (quantizers/base.py:39-63): in Scout's tower that is the patch embedding (an
    nn.Linear over unfolded patches, ``Llama4UnfoldConvolution``, modeling_llama4.py:959), q / k / v / o and fc1 /
    fc2 of each layer, the vision adapter's fc1 / fc2 and the projector; the class embedding, the positions, the
    LayerNorms and the biases stay (fp32 after prepare_model_for_kbit_training)."""
    from cabe.parameters import parameter_tensors, quantized_bytes

    vh, vf = 1408, 5632
    layer = 4 * vh * vh + 2 * vh * vf  # 7,929,856 + 15,859,712
    linear = 3 * 14 * 14 * vh + 34 * layer + 23_068_672 + 16_777_216 + 20_971_520
    assert linear == 870_490_624
    # class embedding, positions, layernorm_pre / post; per layer the biases (4·vh + vf + vh) and two LayerNorms
    rest = vh + 812_416 + 4 * vh + 34 * (4 * vh + vf + vh + 4 * vh)
    assert rest == 1_441_792 and linear + rest == VISION
    spec = preset("llama-4-scout-17b-16e").spec
    assert spec.vision_linear_parameters == linear
    setup = TrainingSetup(method="qlora")
    tower = {t.name: t for t in parameter_tensors(spec, setup) if t.name.startswith("vision_tower")}
    assert tower["vision_tower.linear"].kind == "quantized" and tower["vision_tower.linear"].total == linear
    assert tower["vision_tower"].total == rest
    # its bytes under QLoRA: the 4-bit weights (0.5 B each, a uint8 absmax per 64, an fp32 absmax per 256 of those,
    # the two code books and the offset) and the rest in fp32 -- 3.03 GB less than fp32 throughout
    blocks = linear // 64  # 13,601,416
    four_bit = linear // 2 + blocks + 4 * -(-blocks // 256) + 1024 + 4 + 64
    assert four_bit == quantized_bytes(linear, True) == 449_060_344
    assert 4 * VISION - (four_bit + 4 * rest) == 3_032_902_152
