"""Qwen3-VL: a Qwen3 decoder (q / k RMSNorm per head, SwiGLU, interleaved multimodal rotary) that reads image tokens
made by a ViT, and whose bottom layers add DeepStack features of the tower's middle blocks (transformers 5.24
``Qwen3VLForConditionalGeneration``, models/qwen3_vl/modeling_qwen3_vl.py).

``config.json`` nests the decoder in ``text_config`` and the tower in ``vision_config``; missing keys mean
``Qwen3VLTextConfig``'s and ``Qwen3VLVisionConfig``'s defaults (configuration_qwen3_vl.py).

The vision tower (:class:`cabe.vision.tower.VisionTower`, ``kind`` ``"qwen3_vl"``): a Conv3d patch embedding with
bias (16 x 16 pixels x 2 frames), learned positions (a ``num_position_embeddings`` table resampled bilinearly to
each image's grid) added to it, ``depth`` blocks of LayerNorm, a fused ``qkv`` with bias, 2-D rotary, ``proj``,
LayerNorm and a plain MLP (``linear_fc1``, ``gelu_pytorch_tanh``, ``linear_fc2``, with biases), every block
attending over its whole image (no windows); then the merger (LayerNorm over the width, 2 x 2 patches side by
side, ``linear_fc1`` 4h -> 4h, GELU, ``linear_fc2`` 4h -> the text width), and one more merger (its LayerNorm over
4h) after each of the ``deepstack_visual_indexes`` blocks, whose outputs the decoder adds to the image tokens'
hidden states after its first layers (``Qwen3VLTextModel._deepstack_process``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families import llama
from cabe.families._common import Reader, config_section
from cabe.vision.tower import VisionTower

MODEL_TYPES = ("qwen3_vl",)

#: transformers 5.24 ``Qwen3VLTextConfig`` defaults (configuration_qwen3_vl.py): a key the config leaves out
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "intermediate_size": 22_016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 128_000,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "attention_dropout": 0.0,
}

#: transformers 5.24 ``Qwen3VLVisionConfig`` defaults (configuration_qwen3_vl.py)
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}

#: the released checkpoints' image processor bounds (their ``preprocessor_config.json``: ``Qwen2VLImageProcessor``
#: with ``patch_size`` 16, ``merge_size`` 2, ``size`` shortest_edge 65,536 = 64·32·32 and longest_edge
#: 16,777,216 = 16,384·32·32 pixels): what ``smart_resize`` keeps an image within
MIN_PIXELS, MAX_PIXELS = 64 * 32 * 32, 16_384 * 32 * 32


def _section(c: Mapping[str, Any], key: str) -> dict[str, Any]:
    return config_section(c, key) or {}


def tower(v: Reader) -> VisionTower:
    """The vision tower of a ``vision_config`` (over the defaults)."""
    indexes = v.c.get("deepstack_visual_indexes", [])
    if not isinstance(indexes, (list, tuple)) or not all(isinstance(b, int) and b >= 0 for b in indexes):
        raise ConfigError("config_bad_value", "model", key="deepstack_visual_indexes", detail=str(indexes)[:60])
    return VisionTower(
        depth=v.int("depth", "num_hidden_layers"),
        hidden_size=v.int("hidden_size"),
        intermediate_size=v.int("intermediate_size"),
        num_heads=v.int("num_heads", "num_attention_heads"),
        out_hidden_size=v.int("out_hidden_size"),
        patch_size=v.int("patch_size"),
        temporal_patch_size=v.int("temporal_patch_size"),
        merge_size=v.int("spatial_merge_size"),
        window_size=0,
        in_channels=v.int("in_channels"),
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
        kind="qwen3_vl",
        hidden_act=v.str("hidden_act", default="gelu_pytorch_tanh"),
        num_position_embeddings=v.int("num_position_embeddings"),
        deepstack_indexes=tuple(int(b) for b in indexes),
    )


def text_fields(r: Reader, defaults: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The decoder's config: ``text_config`` over ``defaults`` (the text config class's), read as ``model_type``."""
    nested = _section(r.c, "text_config")
    text = {**defaults, **nested, "model_type": model_type}
    # the top config's own tie_word_embeddings (Qwen3VLConfig / Qwen3VLMoeConfig: default False) ties the head
    text["tie_word_embeddings"] = bool(r.c.get("tie_word_embeddings", nested.get("tie_word_embeddings", False)))
    return text


def with_tower(spec: ModelSpec, r: Reader, vision_defaults: Mapping[str, Any], model_type: str) -> ModelSpec:
    """``spec`` (the decoder) with the tower of ``r``'s ``vision_config`` (over ``vision_defaults``), as
    ``model_type`` (also its family's name)."""
    vt = tower(Reader({**vision_defaults, **_section(r.c, "vision_config")}, model_type + "_vision"))
    if any(b >= vt.depth for b in vt.deepstack_indexes):
        raise ConfigError("config_bad_value", "model", key="deepstack_visual_indexes", detail=str(vt.deepstack_indexes))
    return replace(
        spec,
        model_type=model_type,
        family=model_type,
        config=dict(r.c),
        vision=vt,
        vision_parameters=vt.parameter_count,
    )


def read(r: Reader, name: str) -> ModelSpec:
    spec = llama.read(Reader(text_fields(r, TEXT_DEFAULTS, "qwen3"), "qwen3"), name)
    return with_tower(spec, r, VISION_DEFAULTS, "qwen3_vl")
