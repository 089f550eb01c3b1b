"""Mistral Small 3.1 / 3.2 (``mistral3``): the Mistral decoder of ``text_config`` and the Pixtral tower with its
projector counted as vision parameters. By hand; the preset's count against transformers' meta build of
Mistral3ForConditionalGeneration in tests/test_presets.py."""

from __future__ import annotations

from cabe import families
from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.training import TrainingSetup


def test_mistral_small_3_1_parameters_by_hand():
    spec = preset("mistral-small-3.1-24b").spec
    assert spec.parameter_count - spec.vision_parameters == preset("mistral-small-24b").spec.parameter_count
    vh, vi, th = 1024, 4096, 5120
    # Pixtral: patch_conv 3 × 14² × 1024, ln_pre, 24 layers of q, k, v, o, gate, up, down and two norms
    tower = 3 * 14 * 14 * vh + vh + 24 * (4 * vh * vh + 3 * vh * vi + 2 * vh)
    assert tower == 403_305_472
    # projector: norm, patch merger (1024·2² -> 1024), linear_1 (1024 -> 5120), linear_2 (5120 -> 5120)
    projector = vh + 4 * vh * vh + vh * th + th * th
    assert projector == 35_652_608
    assert spec.vision_parameters == tower + projector
    assert spec.vision_linear_parameters == 24 * (4 * vh * vh + 3 * vh * vi) + 4 * vh * vh + vh * th + th * th
    assert spec.parameter_count == 23_572_403_200 + tower + projector == 24_011_361_280
    assert not spec.tie_word_embeddings


def test_missing_sub_configs_are_mistral_small_and_the_top_level_ties():
    # Mistral3Config builds Mistral Small 3.1's text and vision configs when they are missing, and ties the lm_head
    # by its own tie_word_embeddings (True by default)
    spec = families.from_config({"model_type": "mistral3"})
    ref = preset("mistral-small-3.1-24b").spec
    assert spec.tie_word_embeddings and spec.parameter_count == ref.parameter_count - ref.lm_head_count


def test_qlora_quantizes_the_towers_linear_layers():
    spec = preset("mistral-small-3.1-24b").spec
    full = estimate_model(spec, TrainingSetup(method="qlora", precision="bf16-amp", batch=1, seq=128))
    assert full.total_bytes < estimate_model(spec, TrainingSetup(method="lora", batch=1, seq=128)).total_bytes
