"""State-space (Mamba-2) mixers outside a training step: what serving keeps per sequence, the scan's FLOPs, the
report's note and QLoRA's refusal. (A training step's saved tensors and kernel transients:
:mod:`cabe.activations.mamba`.)

Serving: a Mamba-2 layer keeps, per sequence, the convolution state (conv_dim × conv_kernel, in the model's dtype:
transformers 5.24 cache_utils.py ``LinearAttentionLayer.lazy_initialization``) and the SSM state (heads × head_dim
× state, fp32: the scan's ``final_states``), whatever the context length; it keeps no KV cache.

Proved by tests/families/test_granitemoehybrid.py.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError

#: bytes of one SSM-state element (the chunk scan's fp32 ``final_states``, kept as the cache's recurrent state)
SSM_STATE_BYTES = 4


def has_mamba2(spec: ModelSpec) -> bool:
    return spec.mamba2 is not None and any(g.mixer == "mamba2" for g in spec.layer_groups)


def notes(spec: ModelSpec) -> list[str]:
    """The report's note codes for a model with Mamba-2 layers."""
    return ["mamba2_kernel_modelled"] if has_mamba2(spec) else []


def refusal(spec: ModelSpec, method: str) -> None:
    """QLoRA cannot run the fused kernel: it multiplies ``out_proj.weight`` itself (ssd_combined.py:885,
    ``F.linear(out, outproj_weight)``), which bitsandbytes' Linear4bit stores as packed uint8 (``Params4bit``
    handles only ``torch.chunk`` / ``torch.split``, bitsandbytes nn/modules.py ``__torch_function__``)."""
    if method == "qlora" and has_mamba2(spec):
        raise InvalidValueError("qlora_mamba2_fused", "method", value="qlora", model_type=spec.model_type)


def scan_flops_forward_per_token(spec: ModelSpec) -> int:
    """Forward FLOPs per token of the Mamba-2 layers' chunked scan (SSD; Dao & Gu 2024, section 6), beside their
    in_proj / out_proj / conv1d matmuls (counted with the weights): within a chunk C·Bᵀ (groups × chunk × state) and
    its product with x (heads × chunk × head_dim); across chunks the states Bᵀ·x and their read-out C·h (heads ×
    head_dim × state each); 2 FLOPs per multiply-add."""
    m = spec.mamba2
    if m is None:
        return 0
    layers = sum(g.count for g in spec.layer_groups if g.mixer == "mamba2")
    per_layer = 2 * m.chunk * (m.groups * m.state + m.d_inner) + 2 * 2 * m.d_inner * m.state
    return layers * per_layer


def state_bytes_per_sequence(spec: ModelSpec, weight_bytes: float) -> int:
    """Serving: what every Mamba-2 layer keeps for one sequence (conv state in the weights' dtype, SSM state in
    fp32), over all such layers."""
    m = spec.mamba2
    if m is None:
        return 0
    layers = sum(g.count for g in spec.layer_groups if g.mixer == "mamba2")
    per_layer = round(m.conv_state_elements * weight_bytes) + m.ssm_state_elements * SSM_STATE_BYTES
    return layers * per_layer
