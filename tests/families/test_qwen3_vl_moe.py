"""Qwen3-VL-MoE (``qwen3_vl_moe``): Qwen3-VL's tower before a Qwen3-MoE decoder. Its parameters counted by hand and
against transformers; LoRA, which PEFT 0.21 keeps off the fused experts for this model type; QLoRA, which leaves
them 16-bit; serving with images (the tower's prefill, traced); and the training step against the trace (the real
Qwen3VLMoeForConditionalGeneration on fake tensors, images through cabe.trace.vision)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cabe import api, families, models
from cabe.errors import InvalidValueError
from cabe.inference import estimate_inference
from cabe.method import lora_targets
from cabe.parameters import parameter_tensors
from cabe.training import TrainingSetup
from cabe.vision.images import image_grid
from cabe.vision.serving import vision_forward_bytes

TINY = json.loads((Path(__file__).parent.parent / "configs" / "files" / "qwen3_vl_moe_tiny_config.json").read_text())


def _preset(name: str) -> dict:
    return {k: v for k, v in models.preset(name).config.items() if k != "_cabe"}


def test_30b_a3b_by_hand():
    """Qwen3-VL-30B-A3B, term by term as transformers 5.24 builds it:
    decoder layer (hidden 2048, 32 / 4 heads of 128, 128 experts of 768):
      q 2048·4096 = 8,388,608; k, v 2048·512 = 1,048,576 each; o 4096·2048 = 8,388,608; q / k norms 128 + 128
      router 128·2048 = 262,144; experts gate_up 128·1536·2048 = 402,653,184, down 128·2048·768 = 201,326,592
      two RMSNorms 2·2048 -> 623,120,640; × 48 = 29,909,790,720
    embeddings and the untied head 2 · 151,936·2048 = 622,329,856; the final norm 2,048 -> 30,532,122,624 (Qwen3-30B-A3B's
    count: the same decoder)
    tower (Qwen3-VL-8B's but out_hidden_size 2048): Conv3d 1,769,472 + 1,152, positions 2,654,208,
      27 blocks × 15,239,504 = 411,466,608; merger LayerNorm 2,304 + fc1 4608² + 4608 = 21,238,272
      + fc2 4608·2048 + 2048 = 9,439,232 -> 30,679,808; 3 DeepStack mergers (LayerNorm over 4608: 9,216) 30,686,720
      each -> 538,631,408
    total 31,070,754,032: the card's "31.1B"."""
    spec = families.from_config(_preset("qwen3-vl-30b-a3b-instruct"))
    layer = 8_388_608 + 2 * 1_048_576 + 8_388_608 + 256 + 262_144 + 402_653_184 + 201_326_592 + 4_096
    assert layer == 623_120_640
    text = 48 * layer + 2 * 151_936 * 2048 + 2048
    assert text == 30_532_122_624 == families.from_config(_preset("qwen3-30b-a3b")).parameter_count
    tower = 1_769_472 + 1_152 + 2_654_208 + 27 * 15_239_504 + (2_304 + 21_238_272 + 9_439_232)
    tower += 3 * (9_216 + 21_238_272 + 9_439_232)
    assert spec.vision is not None and spec.vision_parameters == spec.vision.parameter_count == tower == 538_631_408
    assert spec.parameter_count == text + tower == 31_070_754_032
    assert (spec.num_experts, spec.experts_per_token, spec.runs[0].mlp, spec.runs[0].count) == (128, 8, "moe", 48)
    assert spec.vision.kind == "qwen3_vl" and spec.vision.deepstack_indexes == (8, 16, 24)


def test_cabe_models_lists_its_kinds():
    # 32 query heads over 4 KV heads: gqa; 128 experts, 8 per token, SwiGLU: moe128x8; TINY: a dense layer, then MoE
    from cabe.cli.models import kinds

    assert kinds(models.preset("qwen3-vl-30b-a3b-instruct").spec) == {"attention": "gqa", "mlp": "moe128x8"}
    assert kinds(families.from_config(copy.deepcopy(TINY)))["mlp"] == "gated+moe8x2"


def test_defaults_are_qwen3vlmoetextconfigs():
    # Qwen3VLMoeTextConfig(): 60 experts of 1,408, 4 per token, head_dim 2048 / 16 = 128, tied off by the top config
    spec = families.from_config({"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 2}})
    assert (spec.num_experts, spec.experts_per_token, spec.head_dim, spec.num_kv_heads) == (60, 4, 128, 16)
    assert spec.runs[0].intermediate_size == 1408 and not spec.tie_word_embeddings
    # transformers writes num_experts back as num_local_experts (its attribute_map): read either
    cfg = {"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 2, "num_local_experts": 16}}
    assert families.from_config(cfg).num_experts == 16


def test_dense_layers_where_the_config_puts_them():
    # TINY: mlp_only_layers [0] -> a dense SwiGLU of 512 at the bottom, then three MoE layers of 8 experts of 128
    spec = families.from_config(copy.deepcopy(TINY))
    assert [(r.mlp, r.count, spec.ffn_size(r)) for r in spec.runs] == [("gated", 1, 512), ("moe", 3, 128)]


def test_lora_default_is_all_linear_and_never_the_experts():
    """PEFT 0.21.2 moves no target onto the fused experts for qwen3_vl_moe (no conversion pattern): all-linear
    adapts the attention (and the tower when images run), never the experts or the router. 30B-A3B, r 8:
      q 8·(2048 + 4096) = 49,152; k, v 8·(2048 + 512) = 20,480 each; o 8·(4096 + 2048) = 49,152 -> 139,264 × 48
      = 6,684,672 trainable, AdamW's two fp32 moments 8 B each: 53,477,376 B;
    with images the tower's adapters train too: per block qkv 8·(1152 + 3456) = 36,864, proj 8·2304 = 18,432,
    fc1 and fc2 8·(1152 + 4304) = 43,648 each -> 142,592 × 27 = 3,849,984; 4 mergers × (8·(4608 + 4608) = 73,728
    + 8·(4608 + 2048) = 53,248) = 507,904 -> 11,042,560."""
    spec = families.from_config(_preset("qwen3-vl-30b-a3b-instruct"))
    assert spec.peft_default_targets == ("all-linear",) and spec.peft_parameter_targets == ()
    assert [lin.name for lin in lora_targets(spec, ())] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    body = {"model": "qwen3-vl-30b-a3b-instruct", "method": "lora", "seq": 2048, "precision": "bf16"}
    text = api.build(body)
    assert text.trainable_parameters == 48 * (49_152 + 2 * 20_480 + 49_152) == 6_684_672
    assert text.components["optimizer"] == 8 * 6_684_672 == 53_477_376
    assert "lora_experts_not_adapted" in text.notes and "lora_targets_moved_to_experts" not in text.notes
    images = api.build({**body, "images": 1, "image_size": "448x448"})
    assert images.trainable_parameters == 6_684_672 + 27 * 142_592 + 4 * (73_728 + 53_248) == 11_042_560


@pytest.mark.parametrize("targets", [["q_proj", "gate"], ["experts"], ["v_proj", "experts"]])
def test_router_and_experts_refused_as_peft_refuses_them(targets):
    """PEFT matches ``gate`` (the Qwen3VLMoeTextTopKRouter module) and ``experts`` (Qwen3VLMoeTextExperts) by name
    and raises "Target module ... is not supported" for the whole adapter (peft/tuners/lora/model.py:559, 0.21.2;
    traced: cabe trace answers bad_lora_targets with that reason): cabe refuses them too, beside other names."""
    with pytest.raises(InvalidValueError) as err:
        api.build({"model": "qwen3-vl-30b-a3b-instruct", "method": "lora", "seq": 512, "lora_targets": targets})
    assert err.value.code == "lora_target_unsupported"


def test_qlora_leaves_the_experts_16bit():
    """bitsandbytes replaces nn.Linear modules only (transformers' integration): the attention's and the tower's
    linears are 4-bit, the fused expert stacks and the router stay in the compute dtype."""
    spec = families.from_config(_preset("qwen3-vl-30b-a3b-instruct"))
    tensors = parameter_tensors(spec, TrainingSetup(method="qlora", seq=1024, kbit_prep=False))
    kinds = {t.name.split(".")[-1]: t.kind for t in tensors if t.role in ("attn", "expert", "router")}
    assert kinds["q_proj"] == "quantized"
    assert kinds["gate_up_proj"] == kinds["down_proj"] == "base" and kinds["gate"] == "base"
    experts = sum(t.numel * t.count for t in tensors if t.role == "expert")
    assert experts == 48 * (402_653_184 + 201_326_592)  # every expert weight, unquantized
    notes = api.build({"model": "qwen3-vl-30b-a3b-instruct", "method": "qlora", "seq": 1024, "kbit_prep": False}).notes
    assert "qlora_moe_experts_16bit" in notes


def test_qwen3_vl_tower_prefill_by_hand():
    """Serving's tower prefill for Qwen3-VL's tower (8B's, and every MoE one: h 1152, MLP 4304, 16 heads of 72),
    per patch, 16-bit:
      pixels 3·2·16·16 = 1,536 values in fp32 and their 16-bit cast: 1,536 · 6 = 9,216
      one block's attention moment: residual, LayerNorm output, qkv (5 · 2 · 1152 = 11,520), the fp32 rotary
      temporaries 26 · 1152 = 29,952, cos and sin 2 · 4 · 72 = 576 -> 42,048 (its plain MLP's: 2 · 2 · 1152 +
      fc1's output and the GELU's 2 · 2 · 4304 = 21,824, smaller), beside the fp32 positions 4 · 1152 = 4,608
      -> 55,872 (the positions' gather and product, 4 · 1152 · (2 + 4) = 27,648, smaller).
    Qwen2.5-VL's formula (a SwiGLU MLP, no LayerNorm output, no positions) gave 46,656: 17% under the trace."""
    tower = families.from_config(_preset("qwen3-vl-8b-instruct")).vision
    assert tower is not None
    per_patch = 9_216 + (11_520 + 29_952 + 576) + 4_608
    assert per_patch == 55_872 and vision_forward_bytes(tower, 1024) == 1024 * per_patch
    # cabe infer: 4 images of 1280 x 720 (3,520 patches each, 880 tokens) in 4,096 tokens of Qwen3-VL-30B-A3B: the
    # tower's 14,080 patches (786,677,760 B) outweigh the decoder's widest layer, 4,096 · 2 · (2 · 2048 + 8 · (3 · 768
    # + 2048)) = 318,767,104 B (eight experts' SwiGLU per token)
    spec = families.from_config(_preset("qwen3-vl-30b-a3b-instruct"))
    assert image_grid(spec.vision, "1280x720").patches == 3_520
    out = estimate_inference(spec, context=4096, images=4, image_size="1280x720")
    assert out["components"]["activations"] == 14_080 * per_patch == 786_677_760
    assert out["kv"]["bytes_per_token"] == 2 * 48 * 4 * 128 * 2  # 98,304 B: 4 KV heads of 128 in 48 layers


@pytest.mark.trace
@pytest.mark.parametrize("images,size", [(1, "256x256"), (2, "1280x720")])
def test_tower_prefill_against_the_trace(images, size):
    """The tiny config's tower (h 192, MLP 512): the traced no-grad forward, pixels included, against
    vision_forward_bytes (tests/families/tower_prefill_trace.py; 17,216 B per patch traced, 17,280 modelled: +0.4%; at Qwen3-VL's real widths 56,704
    traced against 55,872, -1.5%; Qwen2.5-VL's formula gave 46,656, -17.7%)."""
    pytest.importorskip("torch")
    spec = families.from_config(copy.deepcopy(TINY))
    n = images * image_grid(spec.vision, size).patches
    script = Path(__file__).parent / "tower_prefill_trace.py"
    config = Path(__file__).parent.parent / "configs" / "files" / "qwen3_vl_moe_tiny_config.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, str(script), str(config), str(images), size],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    traced = int(run.stdout.split()[-1])
    estimated = vision_forward_bytes(spec.vision, n)
    assert abs(estimated - traced) / traced <= 0.01, (estimated, traced)


@pytest.mark.trace
def test_transformers_counts_the_tiny_and_default_configs():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for cfg in (TINY, {"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 2}}):
        fields = copy.deepcopy(cfg)
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
        with torch.device("meta"):
            model = transformers.Qwen3VLMoeForConditionalGeneration(config)
        assert sum(p.numel() for p in model.parameters()) == families.from_config(copy.deepcopy(cfg)).parameter_count


IMAGES = dict(batch=2, seq=1024, images=4, image_size="256x256")  # 8 images of 256 patches, 512 image tokens
SLOW = pytest.mark.slow
SAMPLE = [
    pytest.param(dict(precision="bf16", **IMAGES), id="full-bf16"),
    pytest.param(dict(precision="bf16-amp", **IMAGES), id="full-bf16-amp", marks=SLOW),
    pytest.param(dict(precision="bf16", checkpointing=True, **IMAGES), id="full-ckpt", marks=SLOW),
    pytest.param(dict(method="lora", precision="bf16", **IMAGES), id="lora-default"),
    pytest.param(dict(method="lora", precision="bf16", lora_targets=("q_proj", "v_proj"), **IMAGES), id="lora-qv"),
    pytest.param(dict(method="qlora", **IMAGES), id="qlora"),
    pytest.param(dict(method="qlora", kbit_prep=False, **IMAGES), id="qlora-no-prep", marks=SLOW),
    pytest.param(dict(method="freeze", trainable_layers=1, precision="bf16", **IMAGES), id="freeze", marks=SLOW),
    pytest.param(dict(method="lora", precision="bf16", batch=2, seq=512), id="lora-text-only", marks=SLOW),
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
    if setup.method in ("full", "lora", "qlora") and setup.images:
        # (PEFT adapted the same modules: none on the experts; with images the tower's adapters train)
        assert traced.trainable_parameters == estimated.trainable_parameters
