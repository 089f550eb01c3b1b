"""What a training setup costs in GPU time, relative to another: the time model of ``cabe fit``.

A setup's GPU-seconds per token are its hardware FLOPs per token (:func:`cabe.flops.step_flops`: LoRA's missing
weight gradients, freeze's shorter backward and checkpointing's recomputed forward are counted there, once) over the
card's throughput, times the factors FLOPs do not see, each a property of the setup (not of a change), so that a
change's cost is always the ratio of the two setups and two changes never count one saving twice:

* 4-bit base weights (QLoRA) ×1.3 — every matmul first dequantizes the NF4 weight (bitsandbytes ``matmul_4bit`` /
  ``dequantize_4bit``; the QLoRA paper's measured slowdown over 16-bit LoRA).
* a paged optimizer ×1.05 (bitsandbytes' unified-memory state; the 8-bit kernels themselves are as fast as fused AdamW).
* parameters sharded over several GPUs (ZeRO-3 / FSDP) ×1.15 — 1.5× DDP's communication volume (ZeRO paper §7);
  ZeRO-1 / ZeRO-2 move what DDP moves (×1).
* CPU offload of the optimizer ×1.5 (ZeRO-Offload: CPU Adam and PCIe transfers), of parameters too ×2.5
  (ZeRO-Infinity, PCIe-bound: the whole step's figure, so not also ×1.15 for the sharded parameters).

and, between two setups, ×1.1 per halving of the tokens of a micro-batch (smaller kernels; twice the accumulation
keeps the tokens of a step). These are documented rules of thumb, not measurements of your run.

GPU-hours for a number of tokens are tokens × GPU-seconds per token (independent of how many GPUs share them, but for
the communication factor); wall-clock hours are GPU-hours over the GPUs.
"""

from __future__ import annotations

import math
from typing import Any

from cabe.architecture import ModelSpec
from cabe.flops import run_time, step_flops
from cabe.gpus import Gpu
from cabe.training import TrainingSetup, number

DEQUANT_4BIT = 1.3
PAGED_OPTIMIZER = 1.05
SHARDED_PARAMETERS = 1.15
OFFLOAD_OPTIMIZER = 1.5
OFFLOAD_PARAMETERS = 2.5
SMALLER_KERNELS = 1.1  # per halving of a micro-batch's tokens


def overhead(s: TrainingSetup) -> float:
    """The factors FLOPs do not see, of one setup (see the module's list)."""
    f = 1.0
    if s.method == "qlora":
        f *= DEQUANT_4BIT
    if "paged" in s.optimizer:
        f *= PAGED_OPTIMIZER
    if s.offload in ("parameters", "both"):
        return f * OFFLOAD_PARAMETERS  # PCIe-bound: ZeRO-Infinity's figure is the whole step, its gathers included
    if s.gpus > 1 and (s.shard == "zero3" or s.shard.startswith("fsdp")):
        f *= SHARDED_PARAMETERS
    if s.offload == "optimizer":
        f *= OFFLOAD_OPTIMIZER
    return f


def _micro_tokens(s: TrainingSetup) -> int:
    return s.batch * s.seq


def gpu_time_factor(spec: ModelSpec, cur: TrainingSetup, new: TrainingSetup) -> float:
    """GPU-hours of ``new`` for the same tokens, as a multiple of ``cur``'s (1.0: unchanged)."""
    a = step_flops(spec, cur)["per_token"] * overhead(cur)
    b = step_flops(spec, new)["per_token"] * overhead(new)
    kernels = SMALLER_KERNELS ** math.log2(_micro_tokens(cur) / _micro_tokens(new))
    return b / a * kernels


def factors(spec: ModelSpec, cur: TrainingSetup, new: TrainingSetup) -> dict[str, float]:
    """``gpu_hours``: GPU-hours for the same tokens, ×; ``time``: wall-clock for the same tokens, × (the GPU-hours
    shared by ``new.gpus`` instead of ``cur.gpus``)."""
    g = gpu_time_factor(spec, cur, new)
    return {"gpu_hours": round(g, 3), "time": round(g * cur.gpus / new.gpus, 3)}


def run_cost(
    spec: ModelSpec,
    cur: TrainingSetup,
    new: TrainingSetup,
    card: Gpu,
    *,
    tokens: float | None,
    mfu: float,
    price: float | None,
) -> dict[str, Any]:
    """The time of one optimizer step of ``new`` and, with ``tokens``, the run's hours and GPU-hours (and its cost at
    ``price`` per GPU-hour): :func:`cabe.flops.run_time` times ``new``'s :func:`overhead` and the kernel factor from
    ``cur`` (so that ``new``'s GPU-hours over ``cur``'s are :func:`gpu_time_factor`)."""
    out = run_time(spec, new, card, tokens=tokens, mfu=mfu)
    f = overhead(new) * SMALLER_KERNELS ** math.log2(_micro_tokens(cur) / _micro_tokens(new))
    out["overhead"] = round(f, 4)
    out["step_seconds"] *= f
    out["price_per_gpu_hour"] = None
    out["cost"] = None
    if out["run_hours"] is not None:
        out["run_hours"] *= f
        out["gpu_hours"] *= f
    if price is not None:
        p = number("price_per_gpu_hour", price, minimum=0.0, maximum=1e9)
        out["price_per_gpu_hour"] = p
        if out["gpu_hours"] is not None:
            out["cost"] = out["gpu_hours"] * p
    return out
