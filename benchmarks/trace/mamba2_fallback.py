"""How far transformers' PyTorch fallback of a Mamba-2 layer is from mamba-ssm's fused kernel, on Granite-4.0-H.

    PYTHONPATH=src .venv/bin/python benchmarks/trace/mamba2_fallback.py

For each setup: cabe's estimate (the fused kernel, cabe.ssm), the trace with the kernel's stand-in
(cabe.trace.ssm, what the differential benchmark compares against) and the trace of transformers' own
``torch_forward`` (the chunked scan in PyTorch, what runs without mamba-ssm): peaks and activations, GB.
"""

from __future__ import annotations

import os

from cabe.analytic import estimate_model
from cabe.models import preset
from cabe.trace import ssm, trace_step
from cabe.training import TrainingSetup

SETUPS = [
    ("granite-4.0-h-1b", dict(precision="bf16", batch=1, seq=4096)),
    ("granite-4.0-h-1b", dict(method="lora", batch=1, seq=4096)),
    ("granite-4.0-h-tiny", dict(batch=1, seq=4096)),
    ("granite-4.0-h-tiny", dict(method="lora", batch=2, seq=2048, checkpointing=True)),
]


def main() -> None:
    print(
        f"{'model':<20} {'setup':<58} {'cabe':>8} {'kernel':>8} {'fallback':>9}   activations: cabe / kernel / fallback"
    )
    for name, kw in SETUPS:
        src, setup = preset(name), TrainingSetup(**kw)
        est = estimate_model(src.spec, setup)
        kernel = trace_step(dict(src.config), setup)
        os.environ[ssm.FALLBACK_ENV] = "1"
        try:
            fallback = trace_step(dict(src.config), setup)
        finally:
            del os.environ[ssm.FALLBACK_ENV]
        gb = 1e9
        act = (
            est.components.get("activations", 0),
            kernel.components.get("activations", 0),
            fallback.components.get("activations", 0),
        )
        label = " ".join(f"{k}={v}" for k, v in kw.items())
        print(
            f"{name:<20} {label:<58} {est.total_bytes / gb:8.2f} {kernel.peak_bytes / gb:8.2f} "
            f"{fallback.peak_bytes / gb:9.2f}   {act[0] / gb:.2f} / {act[1] / gb:.2f} / {act[2] / gb:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
