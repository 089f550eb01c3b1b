"""``modules_to_save`` traced: PEFT's ``ModulesToSaveWrapper`` on the token embedding and the lm_head (a frozen
original beside a trainable copy in its dtype, peft 0.21.2 utils/other.py:632-663), against the estimate (issue 11)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]

CASES = [
    # the embedding trained: every layer is in the gradient's path even without checkpointing
    ("pythia-1.4b", {"method": "lora", "dtype": "bf16", "batch": 2, "modules_to_save": ("embed_in",)}),
    # the lm_head trained on an fp32 model after k-bit preparation: its fp32 copy, cached 16-bit cast and gradient
    ("phi-3-mini", {"method": "qlora", "checkpointing": True, "modules_to_save": ("lm_head",)}),
]


@pytest.mark.parametrize(("model", "kw"), CASES)
def test_modules_to_save_matches_the_trace(model, kw):
    src = models.preset(model)
    setup = TrainingSetup(optimizer="adamw", seq=512, **kw)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert traced.trainable_parameters == est.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005, (est.total_bytes, traced.peak_bytes)
