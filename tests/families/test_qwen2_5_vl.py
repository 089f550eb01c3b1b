"""Qwen2.5-VL: the Qwen2 decoder and its ViT counted exactly, images turned into tokens as Qwen's processor does,
and the tower's saved tensors written out term by term."""

from __future__ import annotations

import copy

import pytest

from cabe import families, models
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.precision import dtypes_for, resolve
from cabe.training import TrainingSetup
from cabe.vision.images import image_grid, parse_image_size, resized
from cabe.vision.training import tower_activations

SEVEN_B = "qwen2.5-vl-7b-instruct"


def _spec(name: str = SEVEN_B):
    return models.resolve(name).spec


def test_tower_parameters_by_hand():
    # Qwen2.5-VL-7B's vision_config: depth 32, hidden 1280, MLP 3420, 16 heads, out 3584, patches 14 x 14 x 2 frames
    t = _spec().vision
    patch_embed = 3 * 2 * 14 * 14 * 1280  # Conv3d, no bias: 1,505,280
    qkv = 1280 * 3840 + 3840  # 4,919,040
    proj = 1280 * 1280 + 1280  # 1,639,680
    gate = up = 1280 * 3420 + 3420  # 4,381,020 each
    down = 3420 * 1280 + 1280  # 4,378,880
    block = qkv + proj + gate + up + down + 2 * 1280  # + norm1, norm2: 19,702,200
    merger = 1280 + (5120 * 5120 + 5120) + (5120 * 3584 + 3584)  # ln_q, mlp.0, mlp.2: 44,574,464
    assert block == 19_702_200 and merger == 44_574_464
    assert t.parameter_count == patch_embed + 32 * block + merger == 676_550_144
    # the meta-device build of Qwen2_5_VLForConditionalGeneration (tests/test_presets.py) counts 8,292,166,656
    assert _spec().parameter_count == 8_292_166_656


def test_nested_text_config_reads_the_same():
    flat = dict(models.resolve(SEVEN_B).config)
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
    nested = {k: v for k, v in flat.items() if k not in keys + ("vocab_size",)}
    nested["text_config"] = {k: flat[k] for k in keys + ("vocab_size",)}
    assert families.from_config(copy.deepcopy(nested)).parameter_count == _spec().parameter_count


@pytest.mark.parametrize(
    ("size", "resized_to", "tokens"),
    [
        ("448x448", (448, 448), 256),  # 32 x 32 patches / 2² = 256 tokens
        # round(1024/28) = 37 -> 1036, round(768/28) = 27 -> 756: 74 x 54 = 3,996 patches -> 999 tokens
        ("1024x768", (1036, 756), 999),
        # 12e6 pixels > 28·28·1280 = 1,003,520: beta = sqrt(12e6 / 1,003,520) = 3.458; floor(4000/3.458/28) = 41,
        # floor(3000/3.458/28) = 30 -> 1148 x 840 = 82 x 60 patches -> 1,230 tokens
        ("4000x3000", (1148, 840), 1230),
        # 28·28 < 56·56: beta = 2, ceil(28·2/28)·28 = 56 -> 4 x 4 patches -> 4 tokens
        ("28", (56, 56), 4),
    ],
)
def test_image_tokens_from_image_size(size: str, resized_to: tuple[int, int], tokens: int):
    t = _spec().vision
    assert resized(t, *parse_image_size(size)) == resized_to
    assert image_grid(t, size).tokens == tokens


def _transformers_smart_resize():
    """transformers' own ``smart_resize`` (models/qwen2_vl/image_processing_qwen2_vl.py), its source compiled alone:
    the module imports torchvision, which the trace extra does not install."""
    import ast
    import importlib.util
    import math
    from pathlib import Path

    found = importlib.util.find_spec("transformers")
    if found is None or found.origin is None:
        pytest.skip("transformers is not installed")
    path = Path(found.origin).parent / "models" / "qwen2_vl" / "image_processing_qwen2_vl.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    namespace: dict = {"math": math}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["smart_resize"]


@pytest.mark.trace
def test_resize_agrees_with_transformers():
    smart_resize = _transformers_smart_resize()
    t = _spec().vision
    for h, w in [(1, 1), (13, 997), (224, 224), (333, 517), (1080, 1920), (5000, 4000), (8000, 50)]:
        assert resized(t, h, w) == smart_resize(h, w, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280)


@pytest.mark.parametrize("bad", ["", "448x", "x448", "0x448", "448x448x3", "-4x4", "abc", 448])
def test_bad_image_size(bad: object):
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(images=1, image_size=bad)  # type: ignore[arg-type]
    assert e.value.code == "bad_image_size"


def test_images_must_fit_and_need_a_tower():
    with pytest.raises(InvalidValueError) as e:
        estimate_model(_spec(), TrainingSetup(images=3, image_size="448x448", seq=512))  # 768 tokens > 512
    assert e.value.code == "images_exceed_seq"
    with pytest.raises(InvalidValueError) as e:
        estimate_model(models.resolve("llama-3.2-1b").spec, TrainingSetup(images=1))
    assert e.value.code == "images_need_vision"
    with pytest.raises(InvalidValueError) as e:
        estimate_model(_spec(), TrainingSetup(images=1, image_size="100x30000"))
    assert e.value.code == "image_aspect_ratio"


def test_tower_saved_tensors_by_hand():
    # full fine-tuning, bf16 weights under bf16 autocast, SDPA; one 448 x 448 image: 1,024 patches, 16 windows of
    # 8 x 8 patches (112-pixel windows), blocks 7, 15, 23, 31 over the whole image. h = 1280, f = 3420, 16 heads
    spec = _spec()
    setup = resolve(TrainingSetup(method="full", images=1, seq=1024), "bf16")
    acts = tower_activations(spec, setup, dtypes_for(setup), image_grid(spec.vision, "448x448"))
    h, f, nh, n = 1280, 3420, 16, 1024
    per_patch = (
        (4 * h + 4 + 2 * h + 2 * h)  # norm1: fp32 input, rsqrt, normalised (its weight trains), qkv's input
        + (6 * h + 2 * h + 2 * h)  # the qkv output (v is a view of it), rotated q and k
        + (2 * h + 4 * nh)  # SDPA's output and fp32 log-sum-exp (efficient kernel)
        + 2 * h  # the windows' outputs concatenated: proj's input
        + (4 * h + 4 + 2 * h + 2 * h)  # norm2, the MLP's input
        + 4 * 2 * f  # gate, SiLU, up, product
    )
    assert per_patch == 65_832
    rng = 2 * 512  # each SDPA call's philox seed and offset
    window_block = n * per_patch + 16 * rng
    full_block = n * per_patch + 1 * rng
    assert acts.blocks == 28 * window_block + 4 * full_block == 2_157_645_824
    around = (
        n * 1176 * 2  # the Conv3d's input, the pixels in bf16 (3 · 2 · 14 · 14 values)
        + 2 * n * 4 * 80  # cos and sin, fp32, head_dim 80
        + n * 4 * h
        + 4096  # the merger's RMSNorm: fp32 input, rsqrt (1,024 · 4 B, one 512 B block each way)
        + n * 2 * h  # its normalised tensor
        + 3 * n * 2 * h  # mlp.0's input, GELU's input and output (4h per merged token = h per patch)
    )
    assert acts.around == around == 18_796_544
    assert acts.saved == acts.blocks + acts.around


def test_qlora_frozen_tower_forward_by_hand():
    """QLoRA on the decoder alone: the 4-bit tower runs without a graph, its largest moment is one block's rotary.
    After prepare_model_for_kbit_training the RMSNorm weights are fp32, so the normed input is fp32, and
    ``Linear4bit`` returns its input's dtype (bitsandbytes/nn/modules.py:626-637): qkv and, from the second block
    on, the residual are fp32; rotary needs no ``.float()`` copies. Without kbit prep it is the 16-bit moment."""
    spec = _spec()
    grid = image_grid(spec.vision, "448x448")
    h, f, d, n = 1280, 3420, 80, 2 * 1024  # two images of 32 x 32 patches
    prep = resolve(TrainingSetup(method="qlora", images=2, seq=1024), "bf16")
    fwd = tower_activations(spec, prep, dtypes_for(prep), grid).forward_transient
    attention = 4 * (h + h + 3 * h + 4 * h)  # residual, normed, qkv, q_embed and k's three rotary temporaries: fp32
    mlp = 4 * (2 * h + 3 * f)  # residual, normed, the activation, up and their product: fp32
    assert max(attention, mlp) == mlp == 51_280  # the MLP moment is the larger here (46,080 for attention)
    assert fwd == n * (mlp + 2 * 4 * d) == 106_332_160  # and the fp32 cos and sin; no 16-bit copy of the pixels
    plain = resolve(TrainingSetup(method="qlora", images=2, seq=1024, kbit_prep=False), "bf16")
    sixteen = n * (max(2 * (5 * h) + 4 * 6 * h, 2 * 2 * h + 3 * 2 * f) + 2 * 4 * d) + n * 1176 * 2
    assert tower_activations(spec, plain, dtypes_for(plain), grid).forward_transient == sixteen


def test_method_semantics_on_the_tower():
    spec = _spec()
    n_tower = spec.vision.parameter_count
    full = estimate_model(spec, TrainingSetup(method="full", images=1, seq=1024))
    text_only = estimate_model(spec, TrainingSetup(method="full", images=0, seq=1024))
    # full trains the tower only when images run through it (else it gets no gradient and no optimizer state)
    assert full.trainable_parameters == spec.parameter_count
    assert text_only.trainable_parameters == spec.parameter_count - n_tower
    lora = estimate_model(spec, TrainingSetup(method="lora", images=1, seq=1024))
    everything = estimate_model(spec, TrainingSetup(method="lora", images=1, seq=1024, lora_targets=("all-linear",)))
    # q_proj, v_proj (the family's default) name no tower linear; all-linear adapts the tower's 5 linears per block
    # and the merger's 2 (PEFT's all-linear: every nn.Linear but lm_head), r = 8
    r, h, f, m, out = 8, 1280, 3420, 5120, 3584
    tower_adapters = 32 * r * ((h + 3 * h) + (h + h) + 2 * (h + f) + (f + h)) + r * ((m + m) + (m + out))
    decoder = lora.trainable_parameters
    text_all = 28 * r * ((3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 2 * (3584 + 18944) + (18944 + 3584))
    assert decoder == 28 * r * ((3584 + 3584) + (3584 + 512))
    assert everything.trainable_parameters == text_all + tower_adapters


def test_qlora_quantizes_the_towers_linears_by_hand():
    """bitsandbytes makes every exact ``nn.Linear`` 4-bit (integrations/bitsandbytes.py:189; only ``lm_head`` is
    skipped, quantizers/base.py:39-63): the blocks' qkv, proj and gated MLP and the merger's two linears
    (``merger.mlp``, an nn.Sequential of nn.Linear, modeling_qwen2_5_vl.py:189-194); the Conv3d patch embedding,
    the RMSNorms and the biases stay, fp32 after prepare_model_for_kbit_training."""
    import json
    from pathlib import Path

    from cabe.method import VISION_PREFIX
    from cabe.parameters import parameter_tensors

    config = json.loads((Path(__file__).parents[1] / "configs" / "files" / "qwen2_5_vl_tiny_config.json").read_text())
    h, f, depth, m, out = 256, 512, 5, 4 * 256, 128  # the tiny tower; the merger is 4 patches wide
    block = h * 3 * h + h * h + 2 * h * f + f * h  # qkv, proj, gate / up, down: 655,360
    merger = m * m + m * out  # 1,179,648
    conv = 3 * 2 * 14 * 14 * h  # no bias: 301,056
    norms = (2 * depth + 1) * h  # RMSNorm weights, the merger's ln_q included: 2,816
    biases = depth * (3 * h + h + 2 * f + h) + m + out  # 11,520 + 1,152
    setup = TrainingSetup(method="qlora", seq=1024)
    tower = [t for t in parameter_tensors(families.from_config(config), setup) if t.name.startswith(VISION_PREFIX)]
    quantized = sum(t.total for t in tower if t.kind == "quantized")
    rest = sum(t.total for t in tower if t.kind not in ("quantized", "adapter"))
    assert (quantized, rest) == (depth * block + merger, conv + norms + biases) == (4_456_448, 316_544)
