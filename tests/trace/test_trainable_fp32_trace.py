"""Freeze with fp32 trained layers (``trainable_fp32``: LLaMA-Factory's cast_trainable_params_to_fp32,
model/adapter.py:129-134): the trace casts the trained layers' parameters to fp32 and leaves the rest as loaded."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]

CASES = [
    # the frozen bf16 head is not cast under bf16 autocast (+8% when it was counted)
    {"trainable_layers": 2},
    {"trainable_layers": 4, "checkpointing": True},
    # selective checkpointing: the frozen layers left out keep their saved tensors, and no casts of their bf16
    # weights (pythia-1.4b, 4 trained, every 2nd checkpointed: +15% when they were counted as cast)
    {"trainable_layers": 4, "checkpointing": True, "checkpoint_every": 3},
    # fp16 weights under fp16 autocast: GradScaler takes the fp32 trained layers' gradients (refused without the cast)
    {"trainable_layers": 2, "dtype": "fp16", "autocast": "fp16"},
]


@pytest.mark.parametrize("kw", CASES)
def test_fp32_trained_layers_match_the_trace(kw):
    src = models.preset("qwen2.5-0.5b")
    kw = {"dtype": "bf16", "autocast": "bf16", **kw}
    setup = TrainingSetup(method="freeze", trainable_fp32=True, batch=2, seq=512, **kw)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert traced.trainable_parameters == est.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005, (est.total_bytes, traced.peak_bytes)
