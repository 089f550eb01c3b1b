"""What Gemma 3's SigLIP tower keeps while its images run (transformers 5.24 models/siglip/modeling_siglip.py,
``SiglipVisionTransformer``; models/gemma3/modeling_gemma3.py:635-665, ``Gemma3MultiModalProjector``).

A block (``SiglipEncoderLayer``) is a decoder layer of GPT-2's lineage with Llama's names: LayerNorm, separate
``q_proj`` / ``k_proj`` / ``v_proj`` (with biases) whose outputs SDPA reads without a mask (``is_causal=False``)
over all the image's patches, ``out_proj``, LayerNorm and a plain MLP (``fc1``, ``gelu_pytorch_tanh``, ``fc2``).
So one block's saved tensors are :func:`cabe.activations.layer_activations` of a spec made of the block
(:func:`block_spec`), per patch, with the attention's span the image's patches. The residual between blocks is the
patch embedding's output plus the learned positions: the weights' dtype (a 16-bit Conv2d output under autocast
plus fp32 positions is fp32).

Around the blocks (per patch ``n``, per pooled token ``m = n / kernel²``, when gradients flow through the tower):

* the Conv2d patch embedding saves its input when its weight trains: ``pixel_values.to(weight dtype)`` (a copy
  unless the weights are fp32; under autocast the convolution's own 16-bit cast);
* the post-LayerNorm: its input (an fp32 cast of a 16-bit input under autocast) and mean / rstd;
* the projector: ``transpose(1, 2).reshape(...).contiguous()`` copies the post-norm's output, which
  ``AvgPool2d`` saves; the pooled tokens' ``Gemma3RMSNorm`` (fp32 input, rsqrt, the normalised tensor when its
  weight trains), and the projection matmul's input (a 16-bit cast under autocast, or the RMSNorm's output cast
  back to the input's dtype).

Positions (``nn.Embedding``) save only their indices. Without gradient through the tower it saves nothing; its
forward's largest moment is one block's.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.precision import Dtypes
from cabe.units import round_alloc
from cabe.vision.block import tower_block_spec
from cabe.vision.tower import VisionTower


def block_spec(tower: VisionTower) -> ModelSpec:
    """One SigLIP block as a :class:`ModelSpec` the decoder-layer estimator reads (LayerNorm blocks with a plain
    MLP, no rotary)."""
    return tower_block_spec(
        tower, "siglip_vision_model", "gemma", "plain", tower.hidden_act, rotary=False,
        norm="layernorm", norm_bias=True, position="learned",
    )  # fmt: skip


def pixel_values(tower: VisionTower) -> int:
    """Values of one patch of ``pixel_values``: channels × patch²."""
    return tower.in_channels * tower.patch_size**2


def pixel_cast(dt: Dtypes, weight: int) -> int:
    """Bytes per pixel value of the Conv2d's input copy: ``pixel_values.to(weight dtype)`` (a new tensor unless the
    weights are fp32), or autocast's 16-bit cast of it."""
    if dt.autocast:
        return dt.compute
    return 0 if weight == 4 else weight


def forward_transient(tower: VisionTower, n: int, dt: Dtypes, in_path: bool) -> int:
    """The largest transient of the tower's forward over ``n`` patches, beside what it keeps: without gradients,
    one block's attention moment (the residual, the norm's output, q, k, v and SDPA's output) or its MLP moment
    (the residual, the norm's output, fc1's output and the GELU's); with gradients those are saved already: the
    residual being added."""
    h, f, c, rho = tower.hidden_size, tower.intermediate_size, dt.compute, dt.residual
    ln = 4 if dt.autocast else rho  # layer_norm runs in fp32 under autocast
    if in_path:
        return n * rho * h
    attention = rho * h + ln * h + 4 * c * h
    mlp = rho * h + ln * h + 2 * c * f
    return n * max(attention, mlp)


def around(tower: VisionTower, n: int, dt: Dtypes, trains: bool, weight: int) -> int:
    """Saved outside the blocks for ``n`` patches (see the module's docstring)."""
    h, c, rho = tower.hidden_size, dt.compute, dt.residual
    m = n // tower.merge_size**2  # pooled tokens
    out = round_alloc(n * pixel_values(tower) * pixel_cast(dt, weight)) if trains else 0
    # post_layernorm: its input (fp32 cast of a 16-bit residual under autocast), mean and rstd
    ln = 4 if dt.autocast else rho
    out += round_alloc(n * ln * h) + 2 * round_alloc(n * 4)
    # the contiguous copy of its output, AvgPool2d's saved input
    out += round_alloc(n * ln * h)
    # Gemma3RMSNorm on the pooled tokens: x.float() (a copy unless fp32), rsqrt; x·rsqrt when its weight trains
    out += round_alloc(m * 4 * h) + round_alloc(m * 4)
    out += round_alloc(m * 4 * h) if trains else 0
    # the projection's input: autocast's 16-bit cast, or type_as(x) (a copy when x is not fp32)
    out += round_alloc(m * (c if dt.autocast else ln) * h)
    return out


def serving_block(tower: VisionTower, act_bytes: int) -> int:
    """Bytes per patch of one block's largest forward moment without gradients, all in ``act_bytes`` (serving's
    prefill: modelled, not traced): the residual, the norm's output, q, k, v and SDPA's output; or the residual,
    the norm's output, fc1's output and the GELU's."""
    h, f = tower.hidden_size, tower.intermediate_size
    return act_bytes * max(6 * h, 2 * h + 2 * f)
