"""QLoRA on the vision towers (Gemma 3's SigLIP, Llama 4's, Qwen2.5-VL's, Qwen3-VL's): which of the tower's weights
bitsandbytes makes 4-bit, against transformers' own quantizer. transformers 5.24 replaces every module whose type is
exactly ``nn.Linear`` (integrations/bitsandbytes.py:189, ``replace_with_bnb_linear``) outside
``get_modules_to_not_convert`` (quantizers/base.py:261-280: ``get_keys_to_not_convert``'s tied weights, last
parameter's module and output embedding, lines 39-63, plus ``llm_int8_skip_modules`` and
``_keep_in_fp32_modules``, which none of these models sets). So every linear of a tower is 4-bit; the Conv2d /
Conv3d patch embeddings, the norms, the positions, Gemma 3's bare projector matrix and SigLIP's
``nn.MultiheadAttention`` stay. The hand-written arithmetic per tower is in the family's own test file
(test_gemma3_images.py, test_llama4.py, test_qwen2_5_vl.py, test_qwen3_vl.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cabe import families
from cabe.method import VISION_PREFIX
from cabe.parameters import parameter_tensors
from cabe.training import TrainingSetup

FILES = Path(__file__).parent.parent / "configs" / "files"


def _file(name: str) -> dict:
    return json.loads((FILES / name).read_text())


GEMMA3 = _file("gemma3_vision_tiny_config.json")
#: the same with SigLIP's attention-pooling head (SiglipVisionConfig's default ``vision_use_head``)
GEMMA3_HEAD = {**GEMMA3, "vision_config": {**GEMMA3["vision_config"], "vision_use_head": True}}
QWEN2_5_VL = _file("qwen2_5_vl_tiny_config.json")
QWEN3_VL = _file("qwen3_vl_tiny_config.json")
#: a multimodal llama4 config: a tiny decoder and tower (also tests/trace/test_llama4_trace.py's)
LLAMA4 = _file("llama4_multimodal_tiny_config.json")
CONFIGS = [
    pytest.param(GEMMA3, id="gemma3"),
    pytest.param(GEMMA3_HEAD, id="gemma3-head"),
    pytest.param(LLAMA4, id="llama4"),
    pytest.param(QWEN2_5_VL, id="qwen2_5_vl"),
    pytest.param(QWEN3_VL, id="qwen3_vl"),
]
QLORA = TrainingSetup(method="qlora", seq=1024)


def tower_split(config: dict, setup: TrainingSetup = QLORA) -> tuple[int, int, int]:
    """cabe's (4-bit tower elements, other tower elements but the adapters, 4-bit elements in all)."""
    tensors = parameter_tensors(families.from_config(copy.deepcopy(config)), setup)
    tower = [t for t in tensors if t.name.startswith((VISION_PREFIX, "vision_tower")) and t.kind != "adapter"]
    quantized = sum(t.total for t in tower if t.kind == "quantized")
    every = sum(t.total for t in tensors if t.kind == "quantized")
    return quantized, sum(t.total for t in tower) - quantized, every


def _transformers_split(config: dict) -> tuple[int, int, int]:
    """The same split from transformers' bitsandbytes integration run on a meta build (``Linear4bit`` modules'
    weights inside the tower and projector; the tower's other parameters; every ``Linear4bit``'s weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    bnb = pytest.importorskip("bitsandbytes")
    from transformers.integrations import replace_with_bnb_linear
    from transformers.quantizers.base import HfQuantizer

    fields = copy.deepcopy(config)
    cls = getattr(transformers, fields["architectures"][0])
    cfg = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = cls._from_config(cfg, dtype=torch.bfloat16)
    qc = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_use_double_quant=True)
    skip = HfQuantizer.get_modules_to_not_convert(model, qc.llm_int8_skip_modules, model._keep_in_fp32_modules)
    model = replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=qc)

    def in_tower(name: str) -> bool:
        return any(w in name for w in ("vision", "visual", "multi_modal_projector"))

    four_bit = {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    quantized = sum(m.in_features * m.out_features for n, m in four_bit.items() if in_tower(n))
    every = sum(m.in_features * m.out_features for m in four_bit.values())
    # (a Linear4bit's weight on meta is its packed shape: count the others by name)
    packed = {n + ".weight" for n in four_bit}
    rest = sum(p.numel() for n, p in model.named_parameters() if in_tower(n) and n not in packed)
    return quantized, rest, every


@pytest.mark.trace
@pytest.mark.parametrize("config", CONFIGS)
def test_tower_split_equals_transformers_quantizer(config):
    assert tower_split(config) == _transformers_split(config)


@pytest.mark.trace
@pytest.mark.slow
def test_siglip_head_qlora_estimate_within_3_percent_of_trace():
    """Gemma 3 with SigLIP's head under QLoRA and images: the head's MLP is 4-bit in the trace too (cabe.trace.quant
    replaces every exact ``nn.Linear`` but the output embedding, as transformers does); the parameters agree, the
    weights differ by the quantisation state's per-allocation rounding (512 B per tensor, 6 tensors per 4-bit layer
    with double quantisation) that the estimate does not round, and the totals within 3%."""
    pytest.importorskip("torch")
    from cabe.analytic import estimate_model
    from cabe.trace import trace_step

    setup = TrainingSetup(method="qlora", batch=1, seq=512, images=2, image_size="448x448")
    spec = families.from_config(copy.deepcopy(GEMMA3_HEAD))
    traced = trace_step(copy.deepcopy(GEMMA3_HEAD), setup)
    estimated = estimate_model(spec, setup)
    assert traced.parameters - traced.trainable_parameters == spec.parameter_count == 5_796_160
    assert traced.trainable_parameters == estimated.trainable_parameters
    # 46 4-bit layers (28 in the decoder, 18 in the tower's blocks) and the head's 2: at most 6 · 511 B each
    layers = 4 * 7 + 3 * 6 + 2
    assert 0 <= traced.components["weights"] - estimated.components["weights"] <= layers * 6 * 511
    assert abs(estimated.total_bytes - traced.peak_bytes) / traced.peak_bytes <= 0.03, (
        estimated.total_bytes,
        traced.peak_bytes,
    )
