"""A sample of benchmarks/accuracy/grid.py in the test suite: cabe's analytic estimate within 3% of the
fake-tensor trace of the same training step (the whole 70-configuration grid runs as a benchmark)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

SAMPLE = [
    ("qwen2.5-0.5b", dict(method="full", precision="bf16-amp", optimizer_impl="fused", batch=2, seq=256)),
    ("qwen2.5-0.5b", dict(method="full", precision="bf16", batch=1, seq=512, attention="eager")),
    ("llama-3.2-1b", dict(method="lora", precision="bf16", batch=2, seq=512)),
    ("llama-3.2-1b", dict(method="qlora", batch=2, seq=512, checkpointing=True)),
    ("gpt2", dict(method="full", precision="bf16", optimizer_impl="fused", batch=2, seq=512, checkpointing=True)),
    ("gemma-2-2b", dict(method="lora", precision="bf16", batch=1, seq=512, checkpointing=True)),
]


@pytest.mark.parametrize("model,kw", SAMPLE, ids=[f"{m}-{kw['method']}-{i}" for i, (m, kw) in enumerate(SAMPLE)])
def test_estimate_within_3_percent_of_trace(model, kw):
    from cabe.trace import trace_step

    src = preset(model)
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(src.config), setup).peak_bytes
    estimated = estimate_model(src.spec, setup).total_bytes
    assert abs(estimated - traced) / traced <= 0.03, (estimated, traced)
