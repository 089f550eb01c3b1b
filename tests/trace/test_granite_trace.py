"""Granite-4.0-H traced on fake CUDA tensors — Mamba-2 layers through the stand-in of mamba-ssm's fused kernel
(cabe.trace.ssm), an attention layer without position embedding, MoE with a shared MLP — and cabe's estimate within
1% of that trace; the PyTorch fallback the trace runs without the stand-in is several times larger."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from cabe import families
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup
from configs import GRANITE_HYBRID as TINY

pytestmark = pytest.mark.trace

SAMPLE = [
    dict(precision="bf16", batch=2, seq=256, attention="sdpa"),
    dict(precision="bf16-amp", batch=2, seq=200, attention="sdpa"),  # a partial last chunk (chunk 64)
    dict(precision="fp32", batch=1, seq=256, attention="eager"),
    dict(precision="bf16", batch=2, seq=256, checkpointing=True),
    dict(method="lora", precision="bf16", batch=2, seq=256),  # all-linear: in_proj, out_proj (never run), ...
    dict(method="lora", dtype="fp32", batch=2, seq=256, lora_targets=("q_proj", "out_proj")),
    dict(method="freeze", trainable_layers=2, precision="bf16", batch=2, seq=256),
]


@pytest.mark.parametrize("kw", SAMPLE, ids=[str(i) for i in range(len(SAMPLE))])
def test_granite_hybrid_estimate_within_1_percent_of_trace(kw):
    from cabe.trace import trace_step

    spec = families.from_config(TINY)
    setup = TrainingSetup(**kw)
    traced = trace_step(dict(TINY), setup)
    assert traced.parameters - (traced.trainable_parameters if setup.method == "lora" else 0) == spec.parameter_count
    estimated = estimate_model(spec, setup).total_bytes
    assert abs(estimated - traced.peak_bytes) / traced.peak_bytes <= 0.01, (estimated, traced.peak_bytes)
    # the three Mamba-2 layers ran the kernel's stand-in in both steps (again when recomputed), and the result says so
    assert (
        traced.attention_kernels["mamba2_fused_stand_in"] == (12 if setup.checkpointing else 6)
        and "trace_mamba2_stand_in" in traced.notes
    )


def test_the_fallback_saves_more_than_the_kernel(tmp_path):
    """Without the stand-in the trace runs transformers' torch_forward (the chunked scan in PyTorch, what a machine
    without mamba-ssm runs): its activations are larger than the kernel's. Each trace in a new process, so that the
    environment variable reaches it (a trace worker started by an earlier test keeps the environment it had)."""
    import json
    import os
    import subprocess
    import sys

    from cabe.trace import ssm

    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    cmd = [sys.executable, "-m", "cabe", "trace", "--model", str(config), "--precision", "bf16", "--batch", "2"]
    cmd += ["--seq", "256", "--attention", "sdpa", "--json"]

    def activations(**env: str) -> int:
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, check=True, timeout=600)
        return json.loads(out.stdout)["components"]["activations"]

    kernel = activations()
    fallback = activations(**{ssm.FALLBACK_ENV: "1"})
    assert fallback > 2 * kernel, (fallback, kernel)
