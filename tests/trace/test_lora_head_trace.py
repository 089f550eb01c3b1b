"""LoRA on the token embedding and the lm_head, held to the trace (PEFT 0.21's own ``Embedding`` and
``Linear`` wrappers on fake CUDA tensors): trainable parameters exact, the peak within 0.5%."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

KW = dict(method="lora", batch=2, seq=128, lora_rank=16)
# Traced 2026-12-04 (transformers 5.24, torch 2.13, peft 0.21.2), estimate vs trace peak: +0.059%, -0.021%,
# -0.000%, -0.011%; not here (a minute more): pythia-1.4b embed_in + lm_head bf16-mixed b = 1: -0.013%;
# qwen2.5-0.5b bf16-amp with checkpointing, q_proj + embed_tokens + lm_head: -0.032%
CASES = {
    "qwen-fp32-lm_head": ("qwen2.5-0.5b", KW | dict(precision="fp32", lora_targets=("q_proj", "lm_head"))),
    # tied: PEFT wraps wte and lm_head apart (their adapters are not tied)
    "gpt2-fp32-wte-lm_head": ("gpt2", KW | dict(precision="fp32", lora_targets=("c_attn", "wte", "lm_head"))),
    "qwen-bf16-dropout-both": (
        "qwen2.5-0.5b",
        KW | dict(precision="bf16", lora_targets=("embed_tokens", "lm_head"), lora_dropout=0.1),
    ),
    "qwen-qlora-both": (
        "qwen2.5-0.5b",
        KW | dict(method="qlora", lora_targets=("q_proj", "v_proj", "lm_head", "embed_tokens")),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_head_adapters_estimate_matches_trace(case):
    name, kw = CASES[case]
    src = models.preset(name)
    setup = TrainingSetup(**kw)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert est.trainable_parameters == traced.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005, (est.total_bytes, traced.peak_bytes)


@pytest.mark.slow
def test_the_lm_head_adapter_adds_what_the_trace_adds():
    """bf16 weights under autocast: the lm_head's adapters add their fp32 weights (4 B), AdamW's moments (8 B),
    their cached bf16 casts and 2·h + 2·r per token at the head — the peak moves by the same bytes, to the byte
    (2,445,312 parameters × 12 + 4,890,624 + 256 × 1,824 = 34,701,312)."""
    src = models.preset("qwen2.5-0.5b")
    base, head = (
        TrainingSetup(**KW, precision="bf16-mixed", lora_targets=targets)
        for targets in (("q_proj",), ("q_proj", "lm_head"))
    )
    traced = fake_trace(src.config, head).peak_bytes - fake_trace(src.config, base).peak_bytes
    assert traced == 2445312 * 12 + 4890624 + 256 * (2 * 896 + 2 * 16)
    assert estimate_model(src.spec, head).total_bytes - estimate_model(src.spec, base).total_bytes == traced
