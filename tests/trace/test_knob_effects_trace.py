"""The knob effects against the trace (issue 32 item 4): where cabe.knob_effects says a knob costs memory instead of
saving it, the traced step says so too. Checkpointing a freeze run (one trained layer on top of frozen ones): without
it the frozen layers keep nothing; with it transformers' ``enable_input_require_grads`` puts them in autograd's graph
and each checkpointed one keeps its input (transformers 5.24 modeling_utils.py:3189-3198)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.knob_effects import effects
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

# llama-3.2-3b (28 layers, h 3,072): the bottom 27 frozen, 8 × 1,024 tokens, bf16 weights without autocast, as the
# issue's llama-3.1-70b example (there: traced 157,066,976,256 B without checkpointing, 164,815,927,296 B with;
# estimated 157,335,309,312 and 164,815,783,936)
FREEZE = dict(method="freeze", precision="bf16", optimizer="paged-adamw-8bit", batch=8, seq=1024)


@pytest.mark.slow
def test_checkpointing_a_freeze_run_costs_on_the_trace_too():
    src = models.preset("llama-3.2-3b")
    with_ckpt = TrainingSetup(**FREEZE, checkpointing=True)
    report = estimate_model(src.spec, with_ckpt)
    (k,) = [k for k in effects(src.spec, with_ckpt, report, estimate_model) if k["field"] == "checkpointing"]
    assert k["effect"] == "costs"
    traced_with = fake_trace(src.config, with_ckpt).peak_bytes
    traced_without = fake_trace(src.config, TrainingSetup(**FREEZE)).peak_bytes
    assert traced_with > traced_without  # the trace's own verdict: checkpointing costs here
    # and by about as much: traced 20,614,531,072 − 20,179,135,488 = 435,395,584 B, estimated 334,691,328 B (each peak
    # within 0.5% of its trace; the difference within 1% of the peak)
    assert abs(k["delta_bytes"] - (traced_with - traced_without)) < 0.01 * traced_with
