"""Memory savers on the trace: selective checkpointing (transformers' ``every_n_layers``) and activation
offloading (``offload=True``: ``save_on_cpu(pin_memory=True)`` around each checkpoint), against the
analytic estimate (``--checkpoint-every``, ``--offload-activations``)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

CKPT = dict(checkpointing=True, dtype="bf16")  # the checkpoint's dtype (what "auto" reads)
# Traced 2026-12-04 (transformers 5.24, torch 2.13, llama-3.2-1b: 16 layers): estimate vs trace peak, each
# within 0.005% (python -m cabe trace --model llama-3.2-1b ... prints estimate_relative_error)
CASES = {
    # layers 0, 3, ... 15 checkpointed (6 of 16), the other 10 keep their full activations
    "full-bf16-every-3": dict(method="full", batch=2, seq=1024, checkpoint_every=3, **CKPT),
    "amp-every-5": dict(method="full", precision="bf16-amp", batch=2, seq=512, checkpoint_every=5, checkpointing=True),
    "lora-every-2": dict(method="lora", batch=4, seq=1024, checkpoint_every=2, **CKPT),
    "qlora-every-2": dict(method="qlora", batch=2, seq=1024, checkpoint_every=2, **CKPT),
    # freeze: the frozen layers left out keep what a frozen-weight layer saves (enable_input_require_grads)
    "freeze-every-3": dict(method="freeze", trainable_layers=5, batch=2, seq=1024, checkpoint_every=3, **CKPT),
    # offloading: the frozen embeddings' output stays (AccumulateGrad holds the leaf)
    "lora-offload": dict(method="lora", batch=2, seq=1024, offload_activations=True, **CKPT),
    "qlora-offload-every-3": dict(
        method="qlora", batch=3, seq=700, offload_activations=True, checkpoint_every=3, **CKPT
    ),
    "full-offload": dict(method="full", batch=2, seq=1024, offload_activations=True, **CKPT),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_savers_estimate_matches_trace(case):
    src = models.preset("llama-3.2-1b")
    setup = TrainingSetup(**CASES[case])
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.001
