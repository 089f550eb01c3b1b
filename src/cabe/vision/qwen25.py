"""What Qwen2.5-VL's vision tower keeps while its images run (transformers 5.24
``Qwen2_5_VisionTransformerPretrainedModel``, models/qwen2_5_vl/modeling_qwen2_5_vl.py:386-489): its block as a spec
(RMSNorm, a fused qkv, 2-D rotary, windowed SDPA, a SwiGLU MLP), the concatenated window outputs ``proj`` saves, and
what the patch embedding, the rotary tables and the merger save around the blocks. Proved by
tests/families/test_qwen2_5_vl.py and tests/trace/test_qwen2_5_vl_trace.py."""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.precision import Dtypes
from cabe.training import TrainingSetup
from cabe.units import round_alloc
from cabe.vision.block import patch_values, tower_block_spec
from cabe.vision.tower import VisionTower


def block_spec(tower: VisionTower) -> ModelSpec:
    """One tower block as a :class:`ModelSpec` the decoder-layer estimator reads."""
    return tower_block_spec(
        tower, "qwen2_5_vl_vision", "qwen2_5_vl", "gated", "silu", rotary=True, value_is_qkv_view=True
    )


def concatenated_output(tower: VisionTower, n: int, setup: TrainingSetup, dt: Dtypes, proj_input: bool) -> int:
    """Outside flash attention, the block runs SDPA once per window (or image) and concatenates the outputs
    (modeling_qwen2_5_vl.py:314-336): ``proj`` saves the concatenation, a copy beside the outputs SDPA saves (a
    decoder layer's ``o_proj`` saves SDPA's own output). flash_attention_2 takes the windows at once
    (``cu_seq_lens``): no copy."""
    if setup.attention == "flash" or not proj_input:
        return 0
    return round_alloc(n * dt.compute * tower.hidden_size)


def around(tower: VisionTower, n: int, dt: Dtypes, trains: bool, every: bool) -> int:
    """Saved outside the blocks, for ``n`` patches: the Conv3d's input (its weight trains), the fp32 cos and sin,
    the merger (RMSNorm: fp32 input and rsqrt, the normalised tensor when its weight trains; the first linear's
    input, GELU's input and output)."""
    h, c, d = tower.hidden_size, dt.compute, tower.hidden_size // tower.num_heads
    out = round_alloc(n * patch_values(tower) * c) if trains else 0
    out += 2 * round_alloc(n * 4 * d)  # cos, sin
    out += round_alloc(n * 4 * h) + round_alloc(n * 4)  # the merger's RMSNorm: fp32 input, rsqrt
    out += round_alloc(n * c * h) if trains else 0  # its normalised tensor, saved by the weight's multiply
    # mlp.0's input and GELU's output (their linears train: full, or all-linear LoRA on them), GELU's input
    out += (3 if trains or every else 1) * round_alloc(n * c * h)
    return out
