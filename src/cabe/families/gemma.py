"""Gemma 1, 2 and 3 (text): a Llama-like layer whose RMSNorm computes x · (1 + w) in fp32, a GeGLU
MLP, tied embeddings. Gemma 2 and 3 wrap attention and MLP in pre- and post-norms (4 per layer);
Gemma 2 soft-caps attention logits (so transformers has no SDPA path for it: ``sdpa`` runs eager)
and final logits; Gemma 3 normalises q and k per head. Sliding-window layers: Gemma 2 alternates
sliding and global (starting with sliding), Gemma 3 has 5 local layers for every global one.

Gemma 3's multimodal ``config.json`` (``model_type: gemma3``) nests the decoder in ``text_config``,
often with only the keys that differ from transformers' defaults (a real Gemma-3-4B gives five): the
missing keys are filled as ``Gemma3TextConfig`` fills them, and the SigLIP vision tower of
``vision_config`` (with ``SiglipVisionConfig``'s defaults) and the multimodal projector are counted
as ``ModelSpec.vision_parameters``: held as frozen weights, their activations not modelled (text-only
batches never run the tower, so it gets no gradient and no optimizer state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import (
    Reader,
    attention_shape,
    config_section,
    decoder,
    gated_mlp,
    groups,
    listed_sliding_layers,
    qkvo,
    window,
)
from cabe.vision.tower import VisionTower

# gemma3: the multimodal config, whose text_config cabe.families.from_config reads as gemma3_text
MODEL_TYPES = ("gemma", "gemma2", "gemma3_text", "gemma3")

#: transformers 5.24 ``Gemma3TextConfig`` defaults (models/gemma3/configuration_gemma3.py:73-98, and
#: ``sliding_window_pattern`` 6 read in ``__post_init__``:105): what a key missing from a Gemma 3
#: ``text_config`` (or a flat ``gemma3_text`` config) means.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}

#: transformers 5.24 ``SiglipVisionConfig`` defaults (models/siglip/configuration_siglip.py:93-103):
#: ``Gemma3Config`` builds one when ``vision_config`` is missing (its ``sub_configs_defaults``).
SIGLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "vision_use_head": True,
}


def _pair(r: Reader, key: str) -> tuple[int, int]:
    """An image or patch size: one int, or [height, width]."""
    v = r.c.get(key)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v):
        return int(v[0]), int(v[1])
    n = r.int(key)
    return n, n


def siglip_vision_parameters(v: Reader) -> int:
    """Parameters of transformers' ``SiglipVisionModel`` (models/siglip/modeling_siglip.py): patch
    embedding (a Conv2d with bias) and learned positions, per layer two LayerNorms, q/k/v/out with
    biases and a two-layer MLP with biases, the post-LayerNorm, and the attention-pooling head when
    ``vision_use_head`` (probe, ``nn.MultiheadAttention``, LayerNorm, MLP)."""
    h, f = v.int("hidden_size"), v.int("intermediate_size")
    (ih, iw), (ph, pw) = _pair(v, "image_size"), _pair(v, "patch_size")
    channels = v.int("num_channels")
    embeddings = channels * ph * pw * h + h + (ih // ph) * (iw // pw) * h
    mlp = (h * f + f) + (f * h + h)
    layer = 4 * (h * h + h) + mlp + 2 * 2 * h
    head = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + mlp if v.bool("vision_use_head", True) else 0
    return embeddings + v.int("num_hidden_layers") * layer + 2 * h + head


def _section(r: Reader, key: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **(config_section(r.c, key) or {})}


def read_gemma3(r: Reader, name: str) -> ModelSpec:
    """The multimodal Gemma 3: its decoder (``text_config`` over the defaults) plus the parameters of the
    vision tower and of ``Gemma3MultiModalProjector`` (modeling_gemma3.py:635-645: a vision-width x
    text-width matrix and an RMSNorm over the vision width)."""
    text = _section(r, "text_config", GEMMA3_TEXT_DEFAULTS)
    text["model_type"] = "gemma3_text"
    if "tie_word_embeddings" in r.c:  # Gemma3Config's own tie_word_embeddings (default True) ties the head
        text["tie_word_embeddings"] = r.c["tie_word_embeddings"]
    spec = read(Reader(text, "gemma3_text"), name)
    vision = Reader(_section(r, "vision_config", SIGLIP_VISION_DEFAULTS), "siglip_vision_model")
    vh = vision.int("hidden_size")
    projector = vh * spec.hidden_size + vh
    parameters = siglip_vision_parameters(vision) + projector
    tower = siglip_tower(r, vision, spec.hidden_size)
    if tower is not None and tower.parameter_count != parameters:  # two counts of one tower (a bug if they differ)
        raise ConfigError("config_bad_value", "model", key="vision_config", detail="tower parameter count")
    # NOTE: Gemma3Model sets ``_supports_flash_attn = False`` (modeling_gemma3.py:751: flash drops the
    # bidirectional mask over image tokens): flash_attention_2 is refused for the multimodal model
    return replace(
        spec,
        model_type="gemma3",
        vision_parameters=parameters,
        vision=tower,
        flash_attention=False,
        config=dict(r.c),
    )


def siglip_tower(r: Reader, v: Reader, text_hidden: int) -> VisionTower | None:
    """The SigLIP tower as images run through it (:class:`cabe.vision.tower.VisionTower`, ``kind`` ``"siglip"``),
    or None when its images could not run: a square ``image_size`` and ``patch_size`` whose patch grid
    (``image_size // patch_size`` a side) the projector's ``AvgPool2d`` (kernel ``patches // sqrt(mm_tokens_per_image)``,
    modeling_gemma3.py:646-650) pools to exactly ``mm_tokens_per_image`` tokens, as the placeholder check needs, with no patch left over."""
    (ih, iw), (ph, pw) = _pair(v, "image_size"), _pair(v, "patch_size")
    tokens = r.int("mm_tokens_per_image", default=256)
    side = math.isqrt(tokens)
    if ih != iw or ph != pw or side < 1 or side * side != tokens:
        return None
    patches = ih // ph
    kernel = patches // side
    if kernel < 1 or patches != kernel * side:  # (a pool that drops edge patches: not modelled)
        return None
    return VisionTower(
        depth=v.int("num_hidden_layers"),
        hidden_size=v.int("hidden_size"),
        intermediate_size=v.int("intermediate_size"),
        num_heads=v.int("num_attention_heads"),
        out_hidden_size=text_hidden,
        patch_size=ph,
        temporal_patch_size=1,
        merge_size=kernel,
        window_size=0,
        in_channels=v.int("num_channels"),
        kind="siglip",
        image_size=ih,
        tokens_per_image=tokens,
        use_head=v.bool("vision_use_head", True),
        hidden_act=v.str("hidden_act", default="gelu_pytorch_tanh"),
    )


def sliding_layers(r: Reader, layers: int) -> int:
    listed = listed_sliding_layers(r)
    if listed is not None:
        return listed
    if r.model_type == "gemma2":  # NOTE: Gemma 2 alternates sliding / global, starting with sliding
        return (layers + 1) // 2
    if r.model_type == "gemma3_text":  # NOTE: Gemma 3: 5 local layers for every global one
        return layers - layers // r.int("sliding_window_pattern", default=6)
    return 0


def read(r: Reader, name: str) -> ModelSpec:
    if r.model_type == "gemma3":
        return read_gemma3(r, name)
    if r.model_type == "gemma3_text":  # NOTE: a missing key means Gemma3TextConfig's default
        r = Reader({**GEMMA3_TEXT_DEFAULTS, **r.c}, r.model_type)
    h, nh, nkv, d = attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    mt = r.model_type
    bias = r.bool("attention_bias", False)
    win = window(r)
    sandwich = mt != "gemma"  # NOTE: Gemma 2 and 3 wrap attention and MLP in pre- and post-norms
    return decoder(
        r,
        name,
        "gemma",
        (h, nh, nkv, d),
        f,
        tied=True,
        norms_per_layer=4 if sandwich else 2,
        norm_placement="sandwich" if sandwich else "pre",
        norm_weight_fp32=True,
        norm_plus_one=True,
        qk_norm="head" if mt == "gemma3_text" else "none",
        activation=r.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=8192),
        layer_groups=groups(
            layers,
            qkvo(h, nh, nkv, d, bias, bias) + gated_mlp(h, f, False),
            "gated",
            win,
            sliding_layers(r, layers) if win else 0,
        ),
        # NOTE: transformers 5 has no SDPA path for Gemma 2 (logit soft-capping): sdpa runs eager
        sdpa_fallback="eager" if mt == "gemma2" else "",
        attn_logit_softcapping=r.float("attn_logit_softcapping", None),
        final_logit_softcapping=r.float("final_logit_softcapping", None),
        attention_dropout=r.dropout("attention_dropout"),
    )
