"""Llama 4 traced on fake CUDA tensors — dense and MoE layers, every token through every expert, chunked attention
(masked under SDPA once the sequence reaches the chunk), NoPE layers — and cabe's estimate within 3% of that trace;
the parameter counts of tiny configs equal transformers' meta-device build, the vision tower included."""

import copy
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup
from configs import LLAMA4, LLAMA4_MEDIUM

pytestmark = pytest.mark.trace

QV = ("q_proj", "v_proj")
SAMPLE = [
    (LLAMA4, dict(precision="bf16", batch=2, seq=512, attention="sdpa")),  # chunked layers masked (512 >= 128)
    (LLAMA4, dict(precision="bf16", batch=2, seq=100, attention="sdpa")),  # under the chunk: no mask
    (LLAMA4, dict(precision="bf16-amp", batch=2, seq=512, attention="sdpa")),
    (LLAMA4, dict(precision="fp32", batch=2, seq=256, attention="sdpa")),
    (LLAMA4, dict(precision="bf16", batch=2, seq=512, attention="eager")),
    (LLAMA4, dict(method="lora", precision="bf16", batch=2, seq=512, lora_targets=QV)),
    (LLAMA4, dict(method="lora", precision="bf16", batch=4, seq=256, checkpointing=True, lora_targets=QV)),
    # no targets: PEFT keys llama4, not the decoder's llama4_text; the trace takes the family's q_proj, v_proj
    (LLAMA4, dict(method="lora", precision="bf16", batch=2, seq=256)),
    (LLAMA4, dict(method="qlora", batch=2, seq=512, lora_targets=("q_proj", "v_proj", "down_proj"))),
    (LLAMA4_MEDIUM, dict(precision="bf16", batch=1, seq=1024, attention="sdpa")),
    (LLAMA4_MEDIUM, dict(method="lora", precision="bf16-amp", batch=2, seq=1024, lora_targets=QV)),
    (LLAMA4_MEDIUM, dict(method="qlora", batch=1, seq=1024, attention="eager", lora_targets=QV)),
    (LLAMA4_MEDIUM, dict(precision="fp32", batch=1, seq=512, attention="eager", checkpointing=True)),
]


@pytest.mark.parametrize("cfg,kw", SAMPLE, ids=[str(i) for i in range(len(SAMPLE))])
def test_llama4_estimate_within_3_percent_of_trace(cfg, kw):
    from cabe.trace import trace_step

    spec = families.from_config(dict(cfg))
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(cfg), setup)
    adapters = traced.trainable_parameters if setup.method in ("lora", "qlora") else 0
    assert traced.parameters - adapters == spec.parameter_count
    estimated = estimate_model(spec, setup).total_bytes
    assert abs(estimated - traced.peak_bytes) / traced.peak_bytes <= 0.03, (estimated, traced.peak_bytes)


#: a multimodal llama4 config: a tiny text_config and a tiny vision tower (Llama4VisionConfig keys)
MULTIMODAL = json.loads(
    (Path(__file__).parents[1] / "configs" / "files" / "llama4_multimodal_tiny_config.json").read_text()
)


def _meta_count(cfg: dict) -> int:
    import torch
    import transformers

    fields = copy.deepcopy(cfg)
    model_type = fields.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        if model_type == "llama4":
            model = transformers.Llama4ForConditionalGeneration._from_config(config)
        else:
            model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "cfg",
    [LLAMA4, LLAMA4_MEDIUM, MULTIMODAL, {"model_type": "llama4", "text_config": {"num_hidden_layers": 2}}],
    ids=["tiny", "medium", "multimodal", "defaults"],
)
def test_parameters_equal_transformers_meta_build(cfg):
    # tiny 1,263,744; multimodal 730,848; the defaults (Llama4TextConfig's decoder with 2 layers and
    # Llama4VisionConfig's tower) 6,928,358,400
    assert families.from_config(copy.deepcopy(cfg)).parameter_count == _meta_count(cfg)


def test_multimodal_config_traces_its_decoder():
    """AutoModelForCausalLM builds Llama4ForCausalLM from the text config alone: the trace holds everything but
    the vision tower, which cabe counts as frozen weights (note vision_tower_weights_only)."""
    from cabe.trace import trace_step

    spec = families.from_config(copy.deepcopy(MULTIMODAL))
    setup = TrainingSetup(precision="bf16", batch=2, seq=256, attention="sdpa")
    traced = trace_step(copy.deepcopy(MULTIMODAL), setup)
    assert traced.parameters == spec.parameter_count - spec.vision_parameters
    report = estimate_model(spec, setup)
    assert "vision_tower_weights_only" in report.notes
    vision_weights = 2 * spec.vision_parameters  # bf16, held on the device beside the decoder
    assert abs(report.total_bytes - vision_weights - traced.peak_bytes) / traced.peak_bytes <= 0.03
