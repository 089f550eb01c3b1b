"""DoRA with dropout on GPT-2's Conv1D layers (issue 10, seed 844940971: gpt2-medium -4.75%): PEFT's
``transpose`` wraps ``W.T`` in a new ``nn.Parameter`` (peft/utils/other.py:1315), which requires grad, so DoRA's
``F.linear`` (tuners/lora/dora.py:163) saves its input's cast, makes that parameter's gradient in backward and,
under checkpointing, leaves its fp32 leaf's cast in autocast's cache until forward ends. Each case: estimate vs
the fake-tensor trace of the same request, within 0.6%."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]

BASE = dict(
    method="lora", dtype="fp32", optimizer="sgd", attention="sdpa", batch=2, seq=512, lora_rank=32, dora=True,
    lora_dropout=0.05, lora_targets=("c_proj",),
)  # fmt: skip
CASES = {
    "fp16-autocast": BASE | dict(autocast="fp16"),  # -3.94% before
    "bf16-autocast-ckpt": BASE | dict(autocast="bf16", checkpointing=True),  # -6.76% before
    "no-autocast-ckpt": BASE | dict(autocast="none", checkpointing=True),
    "all-targets-accum": BASE
    | dict(autocast="fp16", lora_targets=("c_attn", "c_fc", "c_proj"), grad_accum=2, loss="chunked", loss_chunks=4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dora_dropout_on_conv1d_matches_the_trace(case):
    src = models.preset("gpt2-medium")
    setup = TrainingSetup(**CASES[case])
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.006, (est, traced.peak_bytes)
