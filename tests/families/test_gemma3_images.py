"""Gemma 3 with images: every image becomes ``mm_tokens_per_image`` soft tokens of the tower's fixed ``image_size``
square, the SigLIP tower's saved tensors join the step, and the decoder's SDPA gets the bidirectional image mask in
every layer (cabe.vision.siglip; the trace feeds pixel_values and token_type_ids through the real
Gemma3ForConditionalGeneration)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cabe import api, families, models
from cabe.errors import InvalidValueError
from cabe.precision import dtypes_for, resolve
from cabe.training import TrainingSetup
from cabe.vision.images import image_grid
from cabe.vision.training import tower_activations

TINY_PATH = Path(__file__).parent.parent / "configs" / "files" / "gemma3_vision_tiny_config.json"
TINY = json.loads(TINY_PATH.read_text())
#: google/gemma-3-4b-it's config.json (the preset)
GEMMA3_4B = {k: v for k, v in models.preset("gemma-3-4b-it").config.items() if k != "_cabe"}


def test_every_image_is_256_tokens_of_4096_patches():
    tower = families.from_config(copy.deepcopy(GEMMA3_4B)).vision
    assert tower is not None and tower.kind == "siglip"
    # 896 px / 14 px patches = 64 a side: 4,096 patches, pooled 4 x 4 (kernel 64 / sqrt(256)) to 256 tokens
    for size in ("896x896", "224x224", "1280x720"):  # the processor resizes every image to 896 x 896
        grid = image_grid(tower, size)
        assert (grid.height, grid.width, grid.patches, grid.tokens) == (896, 896, 4096, 256)


def test_images_must_fit_and_need_a_tower_that_pools_exactly():
    body = {"config": copy.deepcopy(GEMMA3_4B), "method": "lora", "seq": 512}
    with pytest.raises(InvalidValueError):  # 3 images = 768 tokens > 512
        api.build({**body, "images": 3})
    # SigLIP's defaults (224 px, patch 16: 14 patches a side) cannot pool to 256 tokens: no tower for images
    with pytest.raises(InvalidValueError):
        api.build({"config": {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2}}, "images": 1})


def test_tower_breakdown_by_hand():
    """The tiny tower (3 blocks of 192, 4 heads, MLP 512, 224 px / 14 px patches: 256 patches, 64 tokens), full
    fine-tuning in bf16, one image of one sequence: n = 256 patches.

    One block, per patch (cabe.activations, LayerNorm blocks; h = 192, f = 512):
      two LayerNorm inputs 2·2·h = 768, their mean and rstd 2·8 = 16, the q/k/v input 2·h = 384,
      flash's q, k, v and output 4 · 2·h = 1,536 and logsumexp 4·4 heads = 16, fc1's input 2·h = 384,
      fc1's output and the GELU's output 2 · 2·f = 2,048                     -> 5,152 B per patch
      × 256 patches = 1,318,912 B, + flash's philox seed and offset 2 · 512 -> 1,319,936 B per block
    Around the blocks:
      the Conv2d's input, pixel_values.to(bf16): 256 · 3·14·14 · 2 = 301,056
      post-LayerNorm: input 256 · 2·192 = 98,304; mean, rstd 2 · round512(256 · 4) = 2,048
      the contiguous copy AvgPool2d saves: 98,304
      64 pooled tokens' RMSNorm: x.float() 64 · 4·192 = 49,152, rsqrt round512(256) = 512, x·rsqrt 49,152
      the projection's input: 64 · 2·192 = 24,576                            -> 623,104 B
    """
    spec = families.from_config(copy.deepcopy(TINY))
    setup = resolve(TrainingSetup(precision="bf16", batch=1, seq=256, images=1), spec.dtype)
    grid = image_grid(spec.vision, "640x480")
    acts = tower_activations(spec, setup, dtypes_for(setup), grid)
    per_patch = 768 + 16 + 384 + 4 * 384 + 16 + 384 + 2 * 1024
    assert per_patch == 5_152
    block = 256 * per_patch + 2 * 512
    assert acts.kept == (block,) * 3 == (1_319_936,) * 3
    around = 301_056 + 98_304 + 2_048 + 98_304 + 49_152 + 512 + 49_152 + 24_576
    assert acts.around == around == 623_104
    assert acts.saved == 3 * block + around


def test_images_mask_every_decoder_layer_and_grow_the_estimate():
    body = {"config": copy.deepcopy(TINY), "precision": "bf16", "batch": 2, "seq": 512}
    text, images = api.build(body), api.build({**body, "images": 4})
    assert images.total_bytes > text.total_bytes
    assert "vision_images_siglip" in images.notes
    # LoRA's default targets (q_proj, v_proj) are the tower's names too: PEFT adapts its 3 blocks' as well
    lora = api.build({**body, "method": "lora", "images": 1})
    text_lora = api.build({**body, "method": "lora"})
    r, h, th = 8, 192, 256
    tower_adapters = 3 * 2 * (r * h + h * r)
    assert lora.trainable_parameters - text_lora.trainable_parameters == tower_adapters
    assert text_lora.trainable_parameters == 4 * (r * th + 4 * 64 * r + r * th + 2 * 64 * r)


IMAGES = dict(batch=4, seq=1024, images=8)  # 32 images of 256 patches through the tower, 2,048 image tokens
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
    pytest.param(dict(precision="bf16", checkpointing=True, **IMAGES), id="full-ckpt"),
    pytest.param(dict(method="lora", precision="bf16", checkpointing=True, **IMAGES), id="lora-ckpt", marks=SLOW),
    pytest.param(dict(method="qlora", checkpointing=True, **IMAGES), id="qlora-ckpt", marks=SLOW),
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


def _tower_split(config: dict, **kw) -> tuple[int, int, set[int]]:
    """(4-bit elements, other elements but the adapters, their bytes per element) of the tower under QLoRA."""
    from cabe.method import VISION_PREFIX
    from cabe.parameters import parameter_tensors, stored_bytes

    setup = resolve(TrainingSetup(method="qlora", seq=1024, **kw), "bf16")
    tower = [
        t
        for t in parameter_tensors(families.from_config(copy.deepcopy(config)), setup)
        if t.name.startswith(VISION_PREFIX) and t.kind != "adapter"
    ]
    rest = [t for t in tower if t.kind != "quantized"]
    widths = {stored_bytes(t, setup, dtypes_for(setup)) for t in rest}
    return sum(t.total for t in tower if t.kind == "quantized"), sum(t.total for t in rest), widths


def test_qlora_quantizes_the_siglip_linears_by_hand():
    """bitsandbytes makes every exact ``nn.Linear`` 4-bit (integrations/bitsandbytes.py:189): the blocks' q / k / v /
    out_proj and fc1 / fc2, and the head's MLP when there is one; the Conv2d patch embedding, the positions, the
    LayerNorms, the biases, the head's nn.MultiheadAttention (in_proj a bare parameter, out_proj a subclass of
    nn.Linear) and Gemma 3's projector matrix (a bare parameter, modeling_gemma3.py:639) stay, in fp32 after
    prepare_model_for_kbit_training (peft/utils/other.py:205-209), in the load dtype without it."""
    h, f, depth = 192, 512, 3  # the tiny tower: 224 px, 14 px patches
    quantized = depth * (4 * h * h + 2 * h * f)  # 3 · (147,456 + 196,608)
    conv = 3 * 14 * 14 * h + h  # 113,088
    positions = (224 // 14) ** 2 * h  # 49,152
    norms = (2 * depth + 1) * 2 * h  # 2,688: two LayerNorms a block and the post-LayerNorm, weight and bias
    biases = depth * (4 * h + f + h)  # 4,416
    projector = h * 256 + h  # mm_input_projection_weight (vision x text width) and its RMSNorm: 49,344
    rest = conv + positions + norms + biases + projector
    assert (quantized, rest) == (1_032_192, 218_688)
    assert _tower_split(TINY) == (quantized, rest, {4})
    assert _tower_split(TINY, kbit_prep=False) == (quantized, rest, {2})
    # with SigLIP's attention-pooling head: its MLP's fc1 and fc2 are 4-bit, the rest of it stays
    head_mlp = 2 * h * f  # 196,608
    head_rest = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (f + h)  # probe, in_proj, out_proj, LayerNorm, biases
    assert head_rest == 149_504
    with_head = {**TINY, "vision_config": {**TINY["vision_config"], "vision_use_head": True}}
    assert _tower_split(with_head) == (quantized + head_mlp, rest + head_rest, {4})
