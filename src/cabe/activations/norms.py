"""Norms and the residual stream: RMSNorm's saved tensors (its fp32 upcast, the rsqrt, the normalised tensor when
the weight trains, Gemma's fp32 ``1 + w``) and what a checkpointed layer keeps (its input, the residual).

RMSNorm upcasts its input to fp32 (4h, saved by ``pow``/``mul``), keeps the fp32 ``rsqrt`` per token (4), the
normalised tensor cast back (ρh, saved by ``weight *`` only when the norm weight trains) and its output (saved by the
next linear layer): transformers 5.24 models/llama/modeling_llama.py ``LlamaRMSNorm.forward``. LayerNorm's terms
(GPT-2's lineage: its fp32 input under autocast, mean and rstd) are counted where its blocks are
(:mod:`cabe.activations.attention_block`, :mod:`cabe.activations.mlp`). Proved by tests/core_torch/test_saved_tensors.py
(saved-tensor hooks, Llama / Gemma / OLMo 2 layers) and tests/trace/test_bottom_layer.py."""

from __future__ import annotations

from cabe.activations.state import LayerState
from cabe.precision import Dtypes

#: the norms on the residual stream (a layer's input, attention's and the MLP's outputs): what they save is the
#: stream's width and length, whole on every GPU under tensor parallelism (LayerActivations.stream_per_token); the
#: others (per-head q / k norms, latent attention's) read a projection's output, split by heads as it is
STREAM_NORMS = frozenset(("input_norm", "mlp_norm", "post_attention_norm", "post_mlp_norm"))


def rms_norm(
    layer: LayerState,
    name: str,
    width: int,
    width_sym: str,
    trainable: bool,
    fp32_weight: bool,
    rows: int = 1,
    rows_sym: str = "",
    in_bytes: int | None = None,
) -> None:
    """``in_bytes``: dtype of the norm's input (the residual stream ρ, or a for q/k norms);
    ``fp32_weight``: the weight multiplies the fp32 normalised tensor (Gemma, OLMo 2)."""
    add = layer.add_stream if name in STREAM_NORMS else layer.add
    add(f"{name}.fp32_input", 4 * width, f"4·{width_sym}")
    add(f"{name}.rsqrt", 4 * rows, f"4·{rows_sym}" if rows_sym else "4")
    width_in = layer.facts.rho if in_bytes is None else in_bytes
    if trainable:
        nb = 4 * width if fp32_weight else width_in * width
        add(f"{name}.normalized", nb, f"{nb // width}·{width_sym}")
    if fp32_weight and layer.facts.spec.norm_plus_one:
        layer.constant += 4 * (
            layer.facts.spec.head_dim if rows_sym else width
        )  # (1 + w) in fp32, saved by the multiply


def checkpointed_layer_bytes_per_token(dt: Dtypes) -> int:
    """With gradient checkpointing, a layer keeps only its input: the residual stream (ρ·h)."""
    return dt.residual
