"""LoRA adapters in the base weights' dtype (``--adapter-dtype model``: PEFT's
``get_peft_model(autocast_adapter_dtype=False)``; torchtune's and LitGPT's bf16-true adapters) against the trace.

Traced 2026-12-07 (transformers 5.24, torch 2.13, PEFT 0.21.2), estimate vs trace peak, all-linear, batch 2:
  llama-3.2-1b bf16 no autocast s512 +0.03%; qwen2.5-0.5b bf16 under bf16 autocast s512 +0.21% (was +4.3% before
  lora_A was seen to save x itself: autocast's cast of a bf16 input for bf16 weights returns it), with dropout
  +0.25%, with DoRA +0.16%, with checkpointing -0.00%; fp16 weights under bf16 autocast +0.04%; llama-3.2-1b,
  gpt2-medium, pythia-1.4b default targets s256, bf16 under bf16 autocast and bf16 with dropout: within 0.08%."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

BASE = dict(method="lora", adapter_dtype="model", lora_targets=("all-linear",), batch=2, seq=256)
CASES = {
    "bf16-pure": ("llama-3.2-1b", dict(dtype="bf16", autocast="none", **BASE)),
    "bf16-autocast": ("qwen2.5-0.5b", dict(dtype="bf16", autocast="bf16", **BASE)),
    "bf16-autocast-dropout": ("qwen2.5-0.5b", dict(dtype="bf16", autocast="bf16", lora_dropout=0.1, **BASE)),
    "fp16-under-bf16": ("qwen2.5-0.5b", dict(dtype="fp16", autocast="bf16", **BASE)),
    "gpt2-bf16-autocast": ("gpt2-medium", dict(dtype="bf16", autocast="bf16", **BASE)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_adapters_in_the_model_dtype_estimate_matches_trace(case):
    name, kw = CASES[case]
    p = models.preset(name)
    setup = TrainingSetup(**kw)
    traced = fake_trace(p.config, setup).peak_bytes
    estimate = estimate_model(p.spec, setup).total_bytes
    assert abs(estimate - traced) / traced < 0.005, (estimate, traced)


def test_the_adapters_are_half_and_their_state_too():
    p = models.preset("llama-3.2-1b")
    kw = dict(method="lora", dtype="bf16", autocast="none", batch=1, seq=128)
    fp32 = fake_trace(p.config, TrainingSetup(**kw))
    model = fake_trace(p.config, TrainingSetup(adapter_dtype="model", **kw))
    assert model.components["optimizer"] * 2 == pytest.approx(fp32.components["optimizer"], rel=0.01)
