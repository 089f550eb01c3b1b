"""DeepSeek-V4 traced on fake CUDA tensors (hyper-connections, eager attention with sinks over sliding / CSA / HCA
layers, the indexer's transient, hash-routed and top-k MoE) and cabe's estimate within 3% of that trace."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup
from configs import DEEPSEEK_V4 as TINY

pytestmark = pytest.mark.trace

SAMPLE = [
    # pure bf16 (the peak at the loss's backward), fp32 weights under autocast, checkpointing at 2048 tokens (the peak
    # in the recomputed attention: masked and shifted scores beside the softmax), LoRA on cabe's default targets
    dict(precision="bf16", batch=2, seq=512, attention="eager"),
    dict(precision="bf16-amp", batch=2, seq=512),
    dict(precision="bf16", batch=4, seq=2048, checkpointing=True),
    dict(method="lora", precision="bf16", batch=2, seq=512),
]


@pytest.mark.parametrize("kw", SAMPLE, ids=[str(i) for i in range(len(SAMPLE))])
def test_deepseek_v4_estimate_within_3_percent_of_trace(kw):
    from cabe.trace import trace_step

    spec = families.from_config(TINY)
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(TINY), setup)
    assert traced.parameters - (traced.trainable_parameters if setup.method == "lora" else 0) == spec.parameter_count
    estimated = estimate_model(spec, setup).total_bytes
    assert abs(estimated - traced.peak_bytes) / traced.peak_bytes <= 0.03, (estimated, traced.peak_bytes)
