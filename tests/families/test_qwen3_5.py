"""Qwen3.5 as published (``qwen3_5``, ``qwen3_5_moe``): the hybrid gated-DeltaNet text model nested in
``text_config`` and Qwen3-VL's vision tower without DeepStack, counted as transformers 5.24 builds
``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` (the MTP layer dropped), and a traced
step with images through the real class."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cabe import families, models
from cabe.training import TrainingSetup

TINY = json.loads((Path(__file__).parent.parent / "configs" / "files" / "qwen3_5_tiny_config.json").read_text())


def _preset(name: str) -> dict:
    return {k: v for k, v in models.preset(name).config.items() if k != "_cabe"}


def _tiny_moe() -> dict:
    """The tiny config as Qwen3.5-MoE: 8 experts of 64, top-2, a shared expert of 128."""
    cfg = copy.deepcopy(TINY)
    cfg["model_type"], cfg["architectures"] = "qwen3_5_moe", ["Qwen3_5MoeForConditionalGeneration"]
    text = cfg["text_config"]
    del text["intermediate_size"]
    text.update(model_type="qwen3_5_moe_text", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64)
    text["shared_expert_intermediate_size"] = 128
    cfg["vision_config"]["model_type"] = "qwen3_5_moe_vision"
    return cfg


def test_0_8b_by_hand():
    """Qwen3.5-0.8B, term by term as transformers 5.24 builds Qwen3_5ForConditionalGeneration:
    tower (12 blocks of 768, MLP 3072, 12 heads, patch 16 x 16 x 2 frames, 2 x 2 merge, 2,304 positions, out 1024):
      Conv3d 3·2·16·16·768 = 1,179,648 + bias 768; positions 2,304·768 = 1,769,472
      per block: qkv 768·2304 + 2304 = 1,771,776; proj 768² + 768 = 590,592; linear_fc1 768·3072 + 3072 =
      2,362,368; linear_fc2 3072·768 + 768 = 2,360,064; two LayerNorms 4·768 = 3,072 -> 7,087,872 × 12 = 85,054,464
      merger (no DeepStack ones): LayerNorm 2·768 = 1,536; fc1 3072² + 3072 = 9,440,256; fc2 3072·1024 + 1024 =
      3,146,752 -> 12,588,544
      -> 100,592,896
    text (hidden 1024, 24 layers: 18 gated DeltaNet, 6 gated attention; vocab 248,320, head tied):
      embedding 248,320·1,024 = 254,279,680 (the head shares it)
      DeltaNet (16 / 16 heads of 128: key 2,048, value 2,048, conv 6,144): in_proj_qkv 1024·6144 = 6,291,456;
      in_proj_z 1024·2048 = 2,097,152; in_proj_b, in_proj_a 1024·16 = 16,384 each; conv1d 6,144·4 = 24,576;
      dt_bias, A_log 16 each; norm 128; out_proj 2048·1024 = 2,097,152 -> 10,543,264
      attention (8 / 2 heads of 256; q_proj makes the gate too): q 1024·4096 = 4,194,304; k, v 1024·512 = 524,288
      each; o 2048·1024 = 2,097,152; q / k norms 256 each -> 7,340,544
      SwiGLU 3·1024·3584 = 11,010,048; two RMSNorms 2,048
      -> 18 · 21,555,360 + 6 · 18,352,640 + final norm 1,024 + 254,279,680 = 752,393,024
    -> 852,985,920 (the name says 0.8B: its text model, 0.75B, rounds to it; the whole does not)."""
    spec = families.from_config(_preset("qwen3.5-0.8b"))
    block = 1_771_776 + 590_592 + 2_362_368 + 2_360_064 + 3_072
    assert block == 7_087_872
    tower = 1_179_648 + 768 + 1_769_472 + 12 * block + 1_536 + 9_440_256 + 3_146_752
    assert spec.vision is not None and spec.vision.parameter_count == tower == 100_592_896
    assert spec.vision.deepstack_indexes == () and spec.vision.kind == "qwen3_vl"
    deltanet = 6_291_456 + 2_097_152 + 2 * 16_384 + 24_576 + 2 * 16 + 128 + 2_097_152
    attention = 4_194_304 + 2 * 524_288 + 2_097_152 + 2 * 256
    mlp_norms = 3 * 1024 * 3584 + 2 * 1024
    text = 18 * (deltanet + mlp_norms) + 6 * (attention + mlp_norms) + 1024 + 248_320 * 1024
    assert (deltanet, attention, text) == (10_543_264, 7_340_544, 752_393_024)
    assert spec.vision_parameters == tower and spec.parameter_count == text + tower == 852_985_920
    assert spec.tie_word_embeddings


def test_tower_is_qwen3_vl_without_deepstack():
    # Qwen3_5VisionModel builds one merger whatever deepstack_visual_indexes says (the checkpoints write [])
    cfg = copy.deepcopy(TINY)
    cfg["vision_config"]["deepstack_visual_indexes"] = [0, 1]
    assert families.from_config(cfg).vision.deepstack_indexes == ()  # type: ignore[union-attr]
    assert families.from_config(copy.deepcopy(TINY)).vision.mergers == 1  # type: ignore[union-attr]


def test_only_the_top_level_key_ties_the_head():
    # a meta build of transformers 5.24: text_config.tie_word_embeddings alone leaves lm_head untied
    cfg = copy.deepcopy(TINY)
    cfg["text_config"]["tie_word_embeddings"] = True
    assert not families.from_config(cfg).tie_word_embeddings
    cfg["tie_word_embeddings"] = True
    assert families.from_config(cfg).tie_word_embeddings


def test_moe_preset_is_the_published_model():
    # Qwen3.5-35B-A3B with its tower (27 blocks of 1152, out 2048): 34,660,610,688 + 446,571,248
    spec = families.from_config(_preset("qwen3.5-35b-a3b"))
    assert spec.model_type == "qwen3_5_moe" and (spec.num_experts, spec.experts_per_token) == (256, 8)
    assert spec.vision_parameters == 446_571_248 and spec.parameter_count == 35_107_181_936


@pytest.mark.trace
def test_transformers_counts_tiny_and_default_configs():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    configs = (TINY, _tiny_moe(), {"model_type": "qwen3_5", "text_config": {"num_hidden_layers": 2}})
    for cfg in configs + ({"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 2}},):
        fields = copy.deepcopy(cfg)
        model_type = fields.pop("model_type")
        config = transformers.AutoConfig.for_model(model_type, **fields)
        cls = {"qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
        with torch.device("meta"):
            model = getattr(transformers, cls[model_type])(config)
        assert sum(p.numel() for p in model.parameters()) == families.from_config(copy.deepcopy(cfg)).parameter_count


IMAGES = dict(batch=2, seq=1024, images=2, image_size="256x256")  # 4 images of 256 patches, 256 image tokens
SLOW = pytest.mark.slow
SAMPLE = [
    pytest.param(TINY, dict(precision="bf16", **IMAGES), id="dense-full-bf16"),
    pytest.param(TINY, dict(method="lora", precision="bf16", lora_targets=("all-linear",), **IMAGES), id="dense-lora"),
    pytest.param(TINY, dict(precision="bf16-amp", checkpointing=True, **IMAGES), id="dense-amp-ckpt", marks=SLOW),
    # QLoRA on the prepared model: fp32 in_proj outputs through conv and the kernel (-6.4% before
    # cabe.linear_attention read them as fp32; the same on the text config alone)
    pytest.param(TINY, dict(method="qlora", **IMAGES), id="dense-qlora"),
    pytest.param(_tiny_moe(), dict(precision="bf16", **IMAGES), id="moe-full-bf16"),
    pytest.param(_tiny_moe(), dict(method="lora", precision="bf16", **IMAGES), id="moe-lora", marks=SLOW),
]


@pytest.mark.trace
@pytest.mark.parametrize(("cfg", "kw"), SAMPLE)
def test_estimate_within_3_percent_of_trace(cfg, kw):
    pytest.importorskip("torch")
    from cabe.analytic import estimate_model
    from cabe.trace import trace_step

    spec = families.from_config(copy.deepcopy(cfg))
    setup = TrainingSetup(**kw)
    traced = trace_step(copy.deepcopy(cfg), setup)
    estimated = estimate_model(spec, setup)
    if setup.method == "full":  # the traced model is the published class, the tower included
        assert traced.parameters == spec.parameter_count
    assert abs(estimated.total_bytes - traced.peak_bytes) / traced.peak_bytes <= 0.03, (
        estimated.total_bytes,
        traced.peak_bytes,
    )
