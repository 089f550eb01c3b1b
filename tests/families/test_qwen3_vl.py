"""Qwen3-VL (``qwen3_vl``): a Qwen3 decoder and a LayerNorm ViT with learned positions and DeepStack mergers, its
parameters counted exactly, images resized as the released processor does, the tower's activations against the
trace (cabe.vision.qwen3; the trace feeds pixel_values and the precomputed bookkeeping through the real
Qwen3VLForConditionalGeneration)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cabe import api, families, models
from cabe.training import TrainingSetup
from cabe.vision.images import image_grid

TINY = json.loads((Path(__file__).parent.parent / "configs" / "files" / "qwen3_vl_tiny_config.json").read_text())


def _preset(name: str) -> dict:
    return {k: v for k, v in models.preset(name).config.items() if k != "_cabe"}


def test_8b_tower_by_hand():
    """Qwen3-VL-8B's tower (27 blocks of 1152, MLP 4304, patch 16, 2 x 2 merge, 2,304 positions, DeepStack after
    blocks 8, 16 and 24), term by term as transformers 5.24 builds it:
      Conv3d 3·2·16·16·1152 = 1,769,472 + bias 1,152; positions 2,304·1,152 = 2,654,208
      per block: qkv 1152·3456 + 3456 = 3,984,768; proj 1152² + 1152 = 1,328,256;
      linear_fc1 1152·4304 + 4304 = 4,962,512; linear_fc2 4304·1152 + 1152 = 4,959,360; two LayerNorms 4·1152 = 4,608
      -> 15,239,504 × 27 = 411,466,608
      merger: LayerNorm 2·1152 = 2,304; fc1 4608² + 4608 = 21,238,272; fc2 4608·4096 + 4096 = 18,878,464
      -> 40,119,040; each DeepStack merger (LayerNorm over 4608: 9,216) 40,125,952 × 3 = 120,377,856
    -> 576,388,336; with the decoder (36 layers of 4096, untied head) 8,767,123,696: the card's "8.77B"."""
    spec = families.from_config(_preset("qwen3-vl-8b-instruct"))
    block = 3_984_768 + 1_328_256 + 4_962_512 + 4_959_360 + 4_608
    assert block == 15_239_504
    tower = 1_769_472 + 1_152 + 2_654_208 + 27 * block + 40_119_040 + 3 * 40_125_952
    assert spec.vision is not None and spec.vision.parameter_count == tower == 576_388_336
    assert spec.vision_parameters == tower and spec.parameter_count == 8_767_123_696
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.qk_norm) == (32, 8, 128, "head")


def test_images_are_resized_to_multiples_of_32():
    tower = families.from_config(_preset("qwen3-vl-4b-instruct")).vision
    # smart_resize with factor 16 · 2: 1280 x 720 -> 1280 x 704 (round(720 / 32) = 22): 80 x 44 patches, 880 tokens
    grid = image_grid(tower, "1280x720")
    assert (grid.height, grid.width, grid.patches, grid.tokens) == (1280, 704, 3520, 880)
    # below 65,536 pixels the image is scaled up: 224 x 224 -> 256 x 256, 256 patches, 64 tokens
    grid = image_grid(tower, "224x224")
    assert (grid.height, grid.width, grid.tokens) == (256, 256, 64)


def test_defaults_alone_match_transformers_defaults():
    # Qwen3VLConfig() with a 2-layer text_config: the vision defaults (27 blocks of 1152, out 3584) over a text
    # default of 4096 wide: the projector's out_hidden_size must equal the text width for images, not for counting
    spec = families.from_config({"model_type": "qwen3_vl", "text_config": {"num_hidden_layers": 2}})
    assert spec.vision is not None and spec.vision.depth == 27 and spec.vision.out_hidden_size == 3584


def test_lora_all_linear_adapts_the_tower_and_its_mergers():
    body = {"config": copy.deepcopy(TINY), "method": "lora", "lora_targets": ["all-linear"], "seq": 512}
    text, images = api.build(body), api.build({**body, "images": 1, "image_size": "256x256"})
    r, h, f, m, out = 8, 192, 512, 4 * 192, 256
    block = r * (h + 3 * h) + r * (h + h) + r * (h + f) + r * (f + h)  # qkv, proj, linear_fc1, linear_fc2
    mergers = 3 * (r * (m + m) + r * (m + out))  # the merger and 2 DeepStack mergers
    assert images.trainable_parameters - text.trainable_parameters == 4 * block + mergers


@pytest.mark.trace
def test_transformers_counts_the_presets():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for cfg in (TINY, {"model_type": "qwen3_vl", "text_config": {"num_hidden_layers": 2}}):
        fields = copy.deepcopy(cfg)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        with torch.device("meta"):
            model = transformers.Qwen3VLForConditionalGeneration(config)
        assert sum(p.numel() for p in model.parameters()) == families.from_config(copy.deepcopy(cfg)).parameter_count


IMAGES = dict(batch=2, seq=1024, images=4, image_size="256x256")  # 8 images of 256 patches, 512 image tokens
SLOW = pytest.mark.slow
SAMPLE = [
    pytest.param(dict(precision="bf16", **IMAGES), id="full-bf16"),
    pytest.param(dict(precision="bf16-amp", **IMAGES), id="full-bf16-amp", marks=SLOW),
    pytest.param(dict(precision="fp32", **IMAGES), id="full-fp32", marks=SLOW),
    pytest.param(dict(precision="bf16", attention="eager", **IMAGES), id="full-eager", marks=SLOW),
    pytest.param(dict(method="lora", precision="bf16", **IMAGES), id="lora-default"),
    pytest.param(dict(method="lora", precision="bf16", lora_targets=("all-linear",), **IMAGES), id="lora-all-linear"),
    pytest.param(dict(method="qlora", **IMAGES), id="qlora", marks=SLOW),
    pytest.param(dict(method="freeze", trainable_layers=1, precision="bf16", **IMAGES), id="freeze", marks=SLOW),
    pytest.param(dict(precision="bf16", checkpointing=True, **IMAGES), id="full-ckpt", marks=SLOW),
]


@pytest.mark.trace
@pytest.mark.parametrize("kw", SAMPLE)
def test_estimate_within_3_percent_of_trace(kw):
    pytest.importorskip("torch")
    from cabe.analytic import estimate_model
    from cabe.trace import trace_step

    spec = families.from_config(copy.deepcopy(TINY))
    setup = TrainingSetup(**kw)
    traced = trace_step(copy.deepcopy(TINY), setup)
    estimated = estimate_model(spec, setup)
    assert abs(estimated.total_bytes - traced.peak_bytes) / traced.peak_bytes <= 0.03, (
        estimated.total_bytes,
        traced.peak_bytes,
    )
    if setup.method in ("full", "lora"):
        assert traced.trainable_parameters == estimated.trainable_parameters


def test_qlora_quantizes_the_towers_linears_by_hand():
    """bitsandbytes makes every exact ``nn.Linear`` 4-bit (integrations/bitsandbytes.py:189; only ``lm_head`` is
    skipped, quantizers/base.py:39-63): the blocks' qkv, proj, linear_fc1 / fc2 and the three mergers' linear_fc1 /
    fc2 (the final one and 2 DeepStack ones, modeling_qwen3_vl.py:171-185); the Conv3d patch embedding (with bias),
    the learned positions (nn.Embedding), the LayerNorms and the biases stay, fp32 after
    prepare_model_for_kbit_training."""
    from cabe.method import VISION_PREFIX
    from cabe.parameters import parameter_tensors

    h, f, depth, m, out = 192, 512, 4, 4 * 192, 256  # the tiny tower
    block = h * 3 * h + h * h + h * f + f * h  # 344,064
    mergers = 3 * (m * m + m * out)  # 2,359,296
    conv = 3 * 2 * 16 * 16 * h + h  # 295,104
    positions = 256 * h  # 49,152
    norms = (2 * depth + 1) * 2 * h + 2 * 2 * m  # LayerNorm weight and bias; the DeepStack mergers' over 4h: 6,528
    biases = depth * (3 * h + h + f + h) + 3 * (m + out)  # 5,888 + 3,072
    setup = TrainingSetup(method="qlora", seq=1024)
    tower = [
        t
        for t in parameter_tensors(families.from_config(copy.deepcopy(TINY)), setup)
        if t.name.startswith(VISION_PREFIX)
    ]
    quantized = sum(t.total for t in tower if t.kind == "quantized")
    rest = sum(t.total for t in tower if t.kind not in ("quantized", "adapter"))
    assert (quantized, rest) == (depth * block + mergers, conv + positions + norms + biases) == (3_735_552, 359_744)
