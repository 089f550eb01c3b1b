"""Qwen2.5-VL: a Qwen2 decoder (biases on q, k, v; SwiGLU; multimodal rotary) that reads image tokens made by
a ViT (transformers 5.24 ``Qwen2_5_VLForConditionalGeneration``, models/qwen2_5_vl/modeling_qwen2_5_vl.py).

The Hub's ``config.json`` is flat (the decoder's keys at the top, ``vision_config`` beside them); the one
transformers 5 saves nests the decoder in ``text_config``. Missing keys mean ``Qwen2_5_VLTextConfig``'s and
``Qwen2_5_VLVisionConfig``'s defaults (configuration_qwen2_5_vl.py:34-56 and :82-104).

The vision tower (:class:`cabe.vision.tower.VisionTower`): a Conv3d patch embedding (14 x 14 pixels x 2 frames, no
bias), ``depth`` blocks of RMSNorm, a fused ``qkv`` with bias, 2-D rotary, ``proj`` with bias, RMSNorm and a
gated MLP with biases (``gate_proj`` / ``up_proj`` / ``down_proj``, the names PEFT matches in the decoder too), of
which the ``fullatt_block_indexes`` attend over the whole image and the others over 112-pixel windows, then the
merger (RMSNorm, Linear 4h -> 4h, GELU, Linear 4h -> the text width): one text token per 2 x 2 patches.
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

MODEL_TYPES = ("qwen2_5_vl",)

#: transformers 5.24 ``Qwen2_5_VLTextConfig`` defaults (configuration_qwen2_5_vl.py:82-104): a key the config
#: leaves out means this
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 152_064,
    "hidden_size": 8192,
    "intermediate_size": 29_568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-5,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
}

#: transformers 5.24 ``Qwen2_5_VLVisionConfig`` defaults (configuration_qwen2_5_vl.py:44-56)
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": [7, 15, 23, 31],
}

#: the keys of the flat Hub config that belong to the decoder (Qwen2_5_VLConfig.__post_init__ pops the text
#: config's parameters from the top level when ``text_config`` is absent)
_TEXT_KEYS = (*TEXT_DEFAULTS, "rope_theta", "rope_scaling", "rope_parameters", "max_window_layers", "layer_types")


def _section(c: Mapping[str, Any], key: str) -> dict[str, Any]:
    return config_section(c, key) or {}


def tower(v: Reader) -> VisionTower:
    """The vision tower of a ``vision_config`` (over the defaults)."""
    blocks = v.c.get("fullatt_block_indexes", [])
    if not isinstance(blocks, (list, tuple)) or not all(isinstance(b, int) for b in blocks):
        raise ConfigError("config_bad_value", "model", key="fullatt_block_indexes", detail=str(blocks)[:60])
    return VisionTower(
        depth=v.int("depth", "num_hidden_layers"),
        hidden_size=v.int("hidden_size"),
        intermediate_size=v.int("intermediate_size"),
        num_heads=v.int("num_heads", "num_attention_heads"),
        out_hidden_size=v.int("out_hidden_size"),
        patch_size=v.int("patch_size"),
        temporal_patch_size=v.int("temporal_patch_size"),
        merge_size=v.int("spatial_merge_size"),
        window_size=v.int("window_size"),
        full_attention_blocks=tuple(int(b) for b in blocks),
        in_channels=v.int("in_channels", "in_chans"),
    )


def read(r: Reader, name: str) -> ModelSpec:
    nested = _section(r.c, "text_config")
    flat = {k: r.c[k] for k in _TEXT_KEYS if k in r.c}
    text = {**TEXT_DEFAULTS, **(nested or flat), "model_type": "qwen2"}
    # Qwen2_5_VLConfig's own tie_word_embeddings (default False) ties the head (configuration_qwen2_5_vl.py:197)
    text["tie_word_embeddings"] = bool(r.c.get("tie_word_embeddings", nested.get("tie_word_embeddings", False)))
    spec = llama.read(Reader(text, "qwen2"), name)
    vt = tower(Reader({**VISION_DEFAULTS, **_section(r.c, "vision_config")}, "qwen2_5_vl_vision"))
    return replace(
        spec,
        model_type="qwen2_5_vl",
        family="qwen2_5_vl",
        config=dict(r.c),
        vision=vt,
        vision_parameters=vt.parameter_count,
    )
