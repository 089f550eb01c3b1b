"""What Qwen3-VL's vision tower keeps while its images run (transformers 5.24 models/qwen3_vl/modeling_qwen3_vl.py,
``Qwen3VLVisionModel``, lines 621-725).

A block (``Qwen3VLVisionBlock``) is Qwen2.5-VL's with LayerNorms and a plain MLP: LayerNorm, one fused ``qkv``
whose v is a view (the whole output stays alive while v is saved), 2-D rotary on q and k (fp32, cast back:
``apply_rotary_pos_emb_vision``), SDPA over each image (split by the cumulative lengths, the outputs
concatenated for ``proj`` outside flash), LayerNorm, ``linear_fc1``, ``gelu_pytorch_tanh``, ``linear_fc2``. So one
block's saved tensors are :func:`cabe.activations.layer_activations` of a spec made of the block
(:func:`block_spec`, LayerNorm blocks), per patch. The residual is the compute dtype (the Conv3d's output, the
positions cast to it: ``pos_embeds.to(hidden_states.dtype)``).

Around the blocks (per patch ``n``, when gradients flow through the tower), beside Qwen2.5-VL's patch embedding
input and fp32 rotary tables:

* the final merger (``Qwen3VLVisionPatchMerger``, its LayerNorm over the width): the LayerNorm's input (the last
  block's output, or its fp32 cast under autocast) and mean / rstd per patch; ``linear_fc1``'s input, the GELU's
  input and output (h per patch each, 4h per merged token);
* each DeepStack merger (its LayerNorm over 4h, a view of that block's output, which the next block's norm saves
  already; under autocast its own fp32 cast), mean / rstd per merged token, and the same three MLP tensors.

The learned positions (``pos_embed(indices) * weights``, summed over 4 bilinear taps) make an (n, 4, h) gather and
an fp32 product before the blocks run: a transient of the tower's forward, not saved (the weights are constants).
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.precision import Dtypes
from cabe.units import round_alloc
from cabe.vision.block import tower_block_spec
from cabe.vision.tower import VisionTower


def block_spec(tower: VisionTower) -> ModelSpec:
    """One Qwen3-VL block as a :class:`ModelSpec` the decoder-layer estimator reads (LayerNorm blocks, a fused qkv
    whose v is a view, rotary, a plain MLP)."""
    return tower_block_spec(
        tower, "qwen3_vl_vision", "qwen3_vl", "plain", tower.hidden_act, rotary=True,
        norm="layernorm", norm_bias=True, value_is_qkv_view=True,
    )  # fmt: skip


def positions_transient(tower: VisionTower, n: int, weight: int) -> int:
    """The learned positions' forward transient over ``n`` patches: the (n, 4, h) gather in the weights' dtype
    and its fp32 product with the interpolation weights (modeling_qwen3_vl.py:695)."""
    return round_alloc(n * 4 * tower.hidden_size * weight) + round_alloc(n * 4 * tower.hidden_size * 4)


def forward_transient(tower: VisionTower, n: int, dt: Dtypes, in_path: bool) -> int:
    """The largest transient of one block's forward over ``n`` patches, beside what the tower keeps: the fp32
    rotary temporaries (q and k upcast, q's rotated result while k's is made: six fp32 h-wide tensors, and
    ``rotate_half``'s negated half, apply_rotary_pos_emb_vision, modeling_qwen3_vl.py:213-224; with gradients the
    rest is saved already), or without gradients the residual, the norm's output, the qkv output, the fp32 cos and
    sin and those temporaries, or the MLP's moment. All along the blocks the fp32 sum of the positions
    (``pos_embeds``, a local of the tower's forward, modeling_qwen3_vl.py:695) stays alive."""
    h, f, c, d = tower.hidden_size, tower.intermediate_size, dt.compute, tower.hidden_size // tower.num_heads
    ln = 4 if dt.autocast else c
    rotary = 24 * h + 2 * h
    positions = 4 * h
    if in_path:
        return n * (rotary + positions)
    attention = c * h + ln * h + 3 * c * h + rotary + 2 * 4 * d
    mlp = c * h + ln * h + 2 * c * f
    return n * (max(attention, mlp) + positions)


def serving_transient(tower: VisionTower, n: int, act_bytes: int) -> int:
    """The largest moment of the tower's forward without gradients (serving's prefill) over ``n`` patches, its
    weights and activations ``act_bytes`` wide, beside the pixels: :func:`forward_transient` of a tower no gradient
    flows through (one block's attention moment — residual, LayerNorm output, the fused qkv output, the fp32 rotary
    temporaries and tables — or its plain MLP's — residual, LayerNorm output, ``linear_fc1``'s output and the
    GELU's — beside the fp32 positions), or the learned positions' gather and product before the blocks."""
    c = act_bytes
    dt = Dtypes(weight=c, frozen=c, grad=c, compute=c, residual=c, adapter=c, weight_copies=False)
    return max(forward_transient(tower, n, dt, False), positions_transient(tower, n, c))


def around(tower: VisionTower, n: int, dt: Dtypes, trains: bool, mlp_saved: bool) -> int:
    """Saved outside the blocks for ``n`` patches (see the module's docstring); ``mlp_saved``: the mergers'
    linears train or LoRA adapts them (their inputs saved)."""
    h, c, d = tower.hidden_size, dt.compute, tower.hidden_size // tower.num_heads
    m = n // tower.merge_size**2
    values = tower.in_channels * tower.temporal_patch_size * tower.patch_size**2
    out = round_alloc(n * values * c) if trains else 0  # the Conv3d's input, cast to the compute dtype
    out += 2 * round_alloc(n * 4 * d)  # cos, sin
    ln = 4 if dt.autocast else c  # the merger's LayerNorm input: its fp32 cast under autocast, else the output
    mlp = (3 if trains or mlp_saved else 1) * round_alloc(n * c * h)  # fc1's input, GELU's input and output
    out += round_alloc(n * ln * h) + 2 * round_alloc(n * 4) + mlp
    for _ in tower.deepstack_indexes:  # LayerNorm over 4h on a view of the block's output
        out += (round_alloc(n * 4 * h) if dt.autocast else 0) + 2 * round_alloc(m * 4) + mlp
    return out
