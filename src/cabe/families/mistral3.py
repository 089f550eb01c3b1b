"""Mistral Small 3.1 / 3.2 (``mistral3``): a Mistral decoder in ``text_config`` and a Pixtral vision tower in
``vision_config`` with a multimodal projector (transformers 5.24 models/mistral3/modeling_mistral3.py,
``Mistral3ForConditionalGeneration``; models/pixtral/modeling_pixtral.py, ``PixtralVisionModel``).

The decoder is read by its own family module (``mistral``: :mod:`cabe.families.llama`). The tower and the projector
are counted as :attr:`ModelSpec.vision_parameters`, as Gemma 3's SigLIP is (:mod:`cabe.families.gemma`): held as
frozen weights, their activations not modelled (text-only batches never run the tower, so it gets no gradient and
the optimizers no state). A sub-config that is missing is built from ``Mistral3Config.sub_configs_defaults``
(Mistral Small 3.1's shapes); one that is given is filled by its class's defaults (``MistralConfig``,
``PixtralVisionConfig``: configuration_utils.py ``SubConfigSpec.create_subconfig``).

Pixtral tower: ``patch_conv`` (Conv2d channels -> hidden, kernel patch × patch, no bias), ``ln_pre`` (RMSNorm), then
per layer ``attention_norm``, q / k / v / o (hidden × hidden, no bias), ``ffn_norm`` and a SwiGLU MLP (gate, up,
down: hidden × intermediate). Projector (``Mistral3MultiModalProjector``): an RMSNorm over the vision width, the
patch merger (``merging_layer``: vision × merge² -> vision, no bias), ``linear_1`` (vision × feature layers -> text
width) and ``linear_2`` (text -> text), with biases when ``multimodal_projector_bias``.

NOTE: ``Mistral3Config.tie_word_embeddings`` (the top level's) defaults to True, and ``from_config`` ties the lm_head
to the embedding; Mistral Small 3.x checkpoints hold both, and ``from_pretrained`` then leaves them apart
("both are present in the checkpoints with different values, so we will NOT tie them", modeling_utils.py 5.24,
``tie_weights``). The presets say ``tie_word_embeddings: false`` so that the config builds what loading gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, config_section

MODEL_TYPES = ("mistral3",)

#: ``Mistral3Config.sub_configs_defaults`` (configuration_mistral3.py, 5.24): the text config when it is missing
MISTRAL3_TEXT_DEFAULTS: dict[str, Any] = {
    "model_type": "mistral",
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "intermediate_size": 32768,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "vocab_size": 131072,
}
#: ``MistralConfig``'s own defaults (models/mistral/configuration_mistral.py), for a text config that is given
MISTRAL_DEFAULTS: dict[str, Any] = {
    "model_type": "mistral",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "sliding_window": 4096,
}
#: the vision config when it is missing (``sub_configs_defaults``) and ``PixtralVisionConfig``'s own defaults
PIXTRAL_MISTRAL3_DEFAULTS: dict[str, Any] = {"hidden_size": 1024, "intermediate_size": 4096, "patch_size": 14}
PIXTRAL_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_channels": 3,
    "patch_size": 16,
}


def _section(c: Mapping[str, Any], key: str, missing: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    sub = config_section(c, key)
    return {**given, **(missing if sub is None else sub)}


def pixtral_parameters(v: Reader) -> tuple[int, int]:
    """``PixtralVisionModel``'s parameters (no biases; the rotary embedding is a buffer), and of them the
    ``nn.Linear`` weights."""
    h, i = v.int("hidden_size"), v.int("intermediate_size")
    p = v.int("patch_size")
    linear = 4 * h * h + 3 * h * i  # q, k, v, o; gate, up, down
    layers = v.int("num_hidden_layers")
    # patch_conv, ln_pre; per layer the linears and attention_norm, ffn_norm
    return v.int("num_channels") * p * p * h + h + layers * (linear + 2 * h), layers * linear


def projector_parameters(r: Reader, vision_hidden: int, text_hidden: int) -> tuple[int, int]:
    """``Mistral3MultiModalProjector``: norm, patch merger, linear_1 and linear_2 (biases when asked), and of them
    the ``nn.Linear`` weights."""
    merge = r.int("spatial_merge_size", default=2)
    layers = r.c.get("vision_feature_layer", -1)
    feature_layers = len(layers) if isinstance(layers, list) else 1
    bias = r.bool("multimodal_projector_bias", False)
    linear = (
        vision_hidden * merge * merge * vision_hidden
        + vision_hidden * feature_layers * text_hidden
        + text_hidden * text_hidden
    )
    return vision_hidden + linear + (2 * text_hidden if bias else 0), linear


def read(r: Reader, name: str) -> ModelSpec:
    from cabe.families import from_config  # the decoder's own family (a lazy import: no cycle at import time)

    text = _section(r.c, "text_config", MISTRAL3_TEXT_DEFAULTS, MISTRAL_DEFAULTS)
    if text.get("model_type") == "mistral3":
        raise ConfigError("config_bad_value", "model", key="text_config", detail="model_type mistral3")
    spec = from_config(text, name=name)
    vision = Reader(_section(r.c, "vision_config", PIXTRAL_MISTRAL3_DEFAULTS, PIXTRAL_DEFAULTS), "pixtral")
    tower, tower_linear = pixtral_parameters(vision)
    projector, projector_linear = projector_parameters(r, vision.int("hidden_size"), spec.hidden_size)
    # the lm_head is tied to the decoder's embedding by the top-level config (Mistral3Config.tie_word_embeddings,
    # default True; Mistral3ForConditionalGeneration._tied_weights_keys), not by text_config's
    tied = r.bool("tie_word_embeddings", True)
    return replace(
        spec,
        model_type="mistral3",
        vision_parameters=tower + projector,
        vision_linear_parameters=tower_linear + projector_linear,
        tie_word_embeddings=tied,
    )
