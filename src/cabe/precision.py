"""Precision: which dtype each kind of tensor has, for a method and a precision mode.

Bytes per element, never bits-as-float: 4-bit storage is handled in :mod:`cabe.method`.

=============  ==============  ============  =================  ====================
precision      weights          gradients     compute (saved)    autocast weight copy
=============  ==============  ============  =================  ====================
fp32           4 (fp32)         4             4                  no
bf16-amp       4 (fp32 master)  4             2 (bf16)           yes, 2 B/param
fp16-amp       4 (fp32 master)  4             2 (fp16)           yes, 2 B/param
bf16 / fp16    2 (pure 16-bit)  2             2                  no
=============  ==============  ============  =================  ====================

The lesson's "mixed precision" (16-bit weights + 16-bit gradients + fp32 master copy + fp32
Adam = 2 + 2 + 4 + 8 = 16 B/param) and PyTorch autocast (fp32 weights + fp32 gradients + fp32
Adam = 16 B/param, plus a 16-bit copy of each weight cached during forward and kept for
backward) cost the same 16 B/param of model states; cabe models what PyTorch does.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.training import TrainingSetup

FP32 = 4
HALF = 2


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element for each kind of tensor in a setup."""

    weight: int  # trainable / full-precision parameters as stored
    frozen: int  # frozen (non-quantized) base parameters as stored
    grad: int
    compute: int  # activations saved for backward (matmul inputs/outputs)
    residual: int  # the residual stream between layers
    adapter: int  # LoRA adapter weights (PEFT keeps them fp32 by default)
    weight_copies: bool  # autocast caches a 16-bit copy of each fp32 weight

    @property
    def amp(self) -> bool:
        return self.weight_copies


def dtypes_for(setup: TrainingSetup) -> Dtypes:
    p = setup.precision
    if setup.method == "qlora":
        # NOTE: QLoRA as transformers + PEFT run it: 4-bit linear weights, the rest of the model
        # cast to fp32 by prepare_model_for_kbit_training, compute in compute_dtype.
        # The Trainer runs QLoRA under autocast (bf16=True): fp32 residual stream (fp32 embeddings),
        # 16-bit casts of the fp32 lm_head and adapters saved for backward.
        compute = FP32 if setup.compute_dtype == "fp32" else HALF
        return Dtypes(
            weight=FP32,
            frozen=FP32,
            grad=FP32,
            compute=compute,
            residual=FP32,
            adapter=FP32,
            weight_copies=compute != FP32,
        )
    if p == "fp32":
        return Dtypes(FP32, FP32, FP32, FP32, FP32, FP32, False)
    if p in ("bf16-amp", "fp16-amp"):
        return Dtypes(FP32, FP32, FP32, HALF, FP32, FP32, True)
    # pure 16-bit: model.to(bfloat16); PEFT still upcasts adapters to fp32 (autocast_adapter_dtype)
    return Dtypes(HALF, HALF, HALF, HALF, HALF, FP32, False)
