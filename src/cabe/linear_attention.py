"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5) outside a training step: the kernel's chunk, the fixed state
a served sequence keeps and the layers that keep it. (A training step's saved tensors:
:mod:`cabe.activations.deltanet`.)

**Serving.** A linear-attention layer caches no token: each sequence keeps a conv state of C × kernel values in
the model's dtype (transformers 5.24 cache_utils.py ``LinearAttentionLayer.lazy_initialization``: the last
``conv_kernel_size`` inputs) and a recurrent state of Hv × K × V in fp32 (``torch_chunk_gated_delta_rule`` returns
it in fp32, and fla's ``chunk_gated_delta_rule_fwd_h`` makes ``final_state`` fp32: fla/ops/common/chunk_delta_h.py
:716), whatever the context length.

Proved by tests/families/test_qwen3_next.py.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec

#: flash-linear-attention's chunk (``chunk_gated_delta_rule(chunk_size=64)``): the solved A is 64 wide
CHUNK = 64
#: bytes of the recurrent state's elements (fp32: see the module docstring)
RECURRENT_STATE_BYTES = 4
#: bytes of the conv state's elements: the projections' output dtype, 16-bit for a served checkpoint
CONV_STATE_BYTES = 2
#: the note a report carries when some layers are gated DeltaNet ones
NOTE = "gated_deltanet_kernels_modelled"


def linear_layers(spec: ModelSpec) -> int:
    """Layers whose token mixer is a gated DeltaNet."""
    return sum(g.count for g in spec.layer_groups if g.mixer == "gated_deltanet")


def state_bytes(spec: ModelSpec) -> int:
    """The fixed state one served sequence keeps in every linear-attention layer: conv + recurrent state."""
    dn = spec.gated_deltanet
    if dn is None:
        return 0
    per_layer = dn.conv_state_elements * CONV_STATE_BYTES + dn.recurrent_state_elements * RECURRENT_STATE_BYTES
    return linear_layers(spec) * per_layer


def state_breakdown(spec: ModelSpec, batch: int) -> dict[str, object]:
    """The serving state's figures, for the KV cache's breakdown."""
    dn = spec.gated_deltanet
    assert dn is not None
    return {
        "linear_attention_layers": linear_layers(spec),
        "conv_state_bytes_per_sequence": linear_layers(spec) * dn.conv_state_elements * CONV_STATE_BYTES,
        "recurrent_state_bytes_per_sequence": linear_layers(spec) * dn.recurrent_state_elements * RECURRENT_STATE_BYTES,
        "linear_state_bytes": batch * state_bytes(spec),
    }
