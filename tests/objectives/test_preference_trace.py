"""A DPO step traced with TRL 1.16's own code (cabe.trace.preference) against the estimate; the objectives the trace
cannot run refused with a typed error, never traced as SFT."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

import cabe.trace  # noqa: F401  (the fake-CUDA shim, before torch)
from cabe import models
from cabe.analytic import estimate_model
from cabe.errors import ConfigError
from cabe.trace.engine import trace_step
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace


def test_orpo_trace_refused():
    src = models.preset("qwen2.5-0.5b")
    with pytest.raises(ConfigError) as e:
        trace_step(src.config, TrainingSetup(method="lora", objective="orpo"))
    assert e.value.code == "objective_not_traceable"


def test_several_gpus_refused():
    src = models.preset("qwen2.5-0.5b")
    with pytest.raises(ConfigError) as e:
        trace_step(src.config, TrainingSetup(method="lora", objective="dpo", gpus=2, shard="ddp"))
    assert e.value.code == "objective_one_gpu"


# Traced 2026-12-07 (trl 1.16.0, transformers 5.25, torch 2.13): DPO LoRA 0.00%, full -0.80%; KTO LoRA -0.00%,
# full (its KL rows first) -0.00%
@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        dict(method="lora", dtype="bf16", batch=2, seq=512, prompt_length=128),
        dict(method="full", dtype="bf16", batch=2, seq=256, prompt_length=64, optimizer="adamw"),
        dict(method="lora", dtype="bf16", batch=2, seq=512, prompt_length=128, objective="kto"),
        dict(method="full", dtype="bf16", batch=2, seq=256, prompt_length=64, optimizer="adamw", objective="kto"),
    ],
)
def test_preference_estimate_matches_trace(kw):
    src = models.preset("qwen2.5-0.5b")
    setup = TrainingSetup(**{"objective": "dpo", **kw})
    traced = trace_step(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert "reference" in traced.phase_peaks and "reference" in est.phase_peaks
    assert ("kl" in traced.phase_peaks) == ("kl" in est.phase_peaks) == (setup.objective == "kto")
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.015
