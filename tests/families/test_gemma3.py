"""Gemma 3's multimodal config.json: a nested ``text_config`` relying on transformers' defaults, and the
SigLIP vision tower counted (held as frozen weights on text-only batches; images: tests/families/
test_gemma3_images.py)."""

from __future__ import annotations

import copy

import pytest

from cabe import api, families, models

#: google/gemma-3-4b-it's config.json as published: five keys of text_config, the rest defaults.
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}

#: SigLIP so400m/14 at 896 px, term by term (transformers' SiglipVisionModel, no pooling head):
#:   patch conv 3·14·14·1152 + 1152 = 678,528; positions (896/14)² · 1152 = 4,096 · 1152 = 4,718,592
#:   per layer: q/k/v/out 4·(1152² + 1152) = 5,313,024; fc1 1152·4304 + 4304 = 4,962,512;
#:   fc2 4304·1152 + 1152 = 4,959,360; two LayerNorms 4·1152 = 4,608  -> 15,239,504 × 27 = 411,466,608
#:   post-LayerNorm 2·1152 = 2,304                         -> tower 416,866,032
#: projector 1152 · 2560 + 1152 (RMSNorm) = 2,950,272     -> vision 419,816,304
VISION = 678_528 + 4_718_592 + 27 * (5_313_024 + 4_962_512 + 4_959_360 + 4_608) + 2_304 + 2_950_272
#: the text decoder is the gemma-3-4b preset (the Hub's text_config with defaults filled): 3,880,263,168;
#: Gemma3ForConditionalGeneration on the meta device: 4,300,079,472, the published 4.3B
TOTAL = 4_300_079_472


def test_vision_arithmetic():
    assert VISION == 419_816_304
    assert models.preset("gemma-3-4b").meta["parameters"] + VISION == TOTAL


def test_nested_text_config_reads_with_defaults():
    spec = families.from_config(copy.deepcopy(GEMMA3_4B))
    text = families.from_config(dict(models.preset("gemma-3-4b").config))
    # Gemma3TextConfig's defaults: 8 heads, 4 KV heads, head_dim 256, vocabulary 262,208, tied
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size) == (8, 4, 256, 262_208)
    assert spec.tie_word_embeddings and spec.qk_norm == "head" and spec.norm_plus_one
    assert spec.layer_groups == text.layer_groups  # 34 layers: 29 sliding (window 1024), 5 global
    assert spec.sliding_layers == 29 and spec.sliding_window == 1024
    assert spec.vision_parameters == VISION
    assert spec.parameter_count == TOTAL
    assert spec.parameter_breakdown()["vision_tower"] == VISION
    assert spec.dtype == "bf16"


def test_defaults_alone():
    # Gemma3Config() with a 2-layer text_config: the SigLIP defaults (224 px, patch 16, 12 layers of
    # 768, pooling head) - transformers builds 854,516,992 parameters on the meta device
    spec = families.from_config({"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}})
    assert spec.parameter_count == 854_516_992
    # a flat gemma3_text config with nothing but its type: Gemma3ForCausalLM(Gemma3TextConfig()) = 2,628,658,432
    assert families.from_config({"model_type": "gemma3_text"}).parameter_count == 2_628_658_432


def test_estimate_holds_the_tower_as_frozen_weights():
    body = {"config": copy.deepcopy(GEMMA3_4B), "method": "full"}
    report = api.build(body)
    text = api.build({"model": "gemma-3-4b", "method": "full"})
    assert report.parameters == TOTAL
    assert report.trainable_parameters == text.trainable_parameters  # no gradient, no AdamW state
    # the weights grow by the tower in bf16 (2 bytes each), nothing else does; each of its tensors is rounded to
    # the allocator's 512 bytes: 27 blocks of 6 weights, 6 biases and 2 LayerNorms (weight, bias), and 8 more
    grew = report.components["weights"] - text.components["weights"]
    assert 2 * VISION <= grew <= 2 * VISION + 512 * (27 * 16 + 8)


def test_bad_sections_are_config_errors():
    from cabe.errors import ConfigError

    with pytest.raises(ConfigError):
        families.from_config({"model_type": "gemma3", "text_config": [1, 2]})
    with pytest.raises(ConfigError):
        families.from_config({"model_type": "gemma3", "vision_config": {"hidden_size": -1}})


@pytest.mark.trace
def test_transformers_counts_the_same():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for cfg in (GEMMA3_4B, {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}}):
        fields = copy.deepcopy(cfg)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        with torch.device("meta"):
            model = transformers.Gemma3ForConditionalGeneration(config)
        assert sum(p.numel() for p in model.parameters()) == families.from_config(copy.deepcopy(cfg)).parameter_count


#: a tiny multimodal Gemma 3 (2 text layers of 256, a 2-layer SigLIP of 128 at 224 px / patch 14)
TINY = {
    "model_type": "gemma3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 4096,
        "sliding_window": 64,
    },
    "vision_config": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 224,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


@pytest.mark.trace
def test_tiny_gemma3_against_the_trace():
    # the trace builds Gemma3ForConditionalGeneration (the tower's weights in bf16, never run on text):
    # cabe trace --model tiny.json --seq 128 measured 25,679,360 bytes, the estimate 25,598,464 (-0.32%)
    pytest.importorskip("torch")
    from cabe.analytic import estimate_model
    from cabe.trace.engine import trace_step
    from cabe.training import TrainingSetup

    setup = TrainingSetup(batch=1, seq=128)
    traced = trace_step(copy.deepcopy(TINY), setup)
    est = estimate_model(families.from_config(copy.deepcopy(TINY)), setup)
    assert traced.parameters == est.parameters == 2_637_056
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.01
