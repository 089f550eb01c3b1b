"""``generate`` on a GRPO generation batch, traced in its own run (:mod:`cabe.trace.generate`) before the training
trace's environment, and joined as that trace's generation phase (:func:`cabe.trace.grpo.join_generation`)."""

from __future__ import annotations

from typing import Any

from cabe.objectives.grpo import shape
from cabe.training import TrainingSetup


def traced_generation(config: dict[str, Any], setup: TrainingSetup, kind: str) -> dict[str, Any] | None:
    """``generate`` on the G rows of a generation batch, traced in its own run (:mod:`cabe.trace.generate`: the
    policy's weights in their dtype, ``prompt_length`` tokens then ``max_completion_length`` new ones, every row to
    the end): what it holds beside the weights. None where it cannot run here (real tensors; QLoRA's 4-bit
    weights, whose kernels are CUDA-only)."""
    if kind not in ("fake",) or setup.method == "qlora" or setup.use_vllm:
        return None
    from cabe.trace.build import load_dtype
    from cabe.trace.generate import handle_request, request

    sh = shape(setup)
    dtype = {4: "fp32", 2: "bf16"}.get(load_dtype(setup).itemsize, "bf16")
    dtype = "fp16" if str(load_dtype(setup)) == "torch.float16" else dtype
    req = request(config, weights=dtype, kv_dtype=dtype, prompt=sh.p, new_tokens=sh.c, batch=sh.g)
    out = handle_request(req)
    comps = dict(out["trace_components"])
    # the weights are the policy's, and cuBLAS's workspace the training forward's: generate runs on its stream
    # and handle, so neither is new
    comps.pop("weights", None)
    comps.pop("cuda_workspaces", None)
    return {k: v for k, v in comps.items() if v}
