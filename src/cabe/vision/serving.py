"""The vision tower's forward without gradients (serving's prefill): its working memory over the patches, per
tower kind. Modelled, not traced; proved by tests/families/test_qwen3_vl_moe.py and tests/test_inference.py."""

from __future__ import annotations

from cabe.vision import qwen3, siglip
from cabe.vision.block import patch_values
from cabe.vision.tower import VisionTower


def vision_forward_bytes(tower: VisionTower, n: int, act_bytes: int = 2) -> int:
    """Working memory of the tower's forward without gradients (serving's prefill) over ``n`` patches: modelled,
    not traced. The fp32 pixels and their 16-bit cast, the fp32 rotary tables (cos, sin), and the larger of one
    block's attention moment — residual, normed input, the fused qkv output, q and k upcast to fp32 and the
    rotated fp32 product being made (apply_rotary_pos_emb_vision, modeling_qwen2_5_vl.py:200-210) — and its MLP
    moment — residual, normed input, gate, up and the activation (modelled as
    :func:`cabe.inference.forward_bytes` does a decoder layer's). SigLIP's and Qwen3-VL's towers have their own
    (:mod:`cabe.vision.siglip`, :func:`cabe.qwen3.serving_transient`: LayerNorm blocks, a plain MLP, learned
    positions; traced in tests/families/test_qwen3_vl_moe.py)."""
    if tower.kind == "siglip":  # LayerNorm blocks, no rotary (cabe.vision.siglip), pixels cast to the weights'
        return n * (siglip.pixel_values(tower) * (4 + act_bytes) + siglip.serving_block(tower, act_bytes))
    if tower.kind == "qwen3_vl":  # LayerNorm blocks, a plain MLP, learned positions (cabe.vision.qwen3), not SwiGLU
        return n * patch_values(tower) * (4 + act_bytes) + qwen3.serving_transient(tower, n, act_bytes)
    h, f = tower.hidden_size, tower.intermediate_size
    d = h // tower.num_heads
    pixels = patch_values(tower) * (4 + act_bytes)
    rotary = 2 * 4 * d
    attention = act_bytes * (h + 3 * h) + 4 * 6 * h
    mlp = act_bytes * (2 * h + 3 * f)
    return n * (pixels + rotary + max(attention, mlp))
