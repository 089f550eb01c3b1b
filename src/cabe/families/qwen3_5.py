"""Qwen3.5 as published: the vision-language checkpoints (``model_type`` ``qwen3_5`` / ``qwen3_5_moe``,
transformers 5.24 ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration``,
models/qwen3_5{,_moe}/modeling_qwen3_5*.py).

``config.json`` nests the decoder in ``text_config`` (``qwen3_5_text`` / ``qwen3_5_moe_text``: the hybrid gated
DeltaNet and gated attention layers of :mod:`cabe.families.qwen3_next`) and the tower in ``vision_config``; keys
a config leaves out mean ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` and ``Qwen3_5VisionConfig`` /
``Qwen3_5MoeVisionConfig`` defaults (configuration_qwen3_5*.py).

* **The tower** (``Qwen3_5VisionModel``, modeling_qwen3_5.py:1117-1200) is Qwen3-VL's (``Qwen3VLVisionModel``):
  the same Conv3d patch embedding with bias, learned positions resampled bilinearly, LayerNorm blocks with a fused
  ``qkv``, 2-D rotary, ``proj`` and a plain ``linear_fc1`` / ``linear_fc2`` MLP, and the same final merger
  (``Qwen3_5VisionPatchMerger`` is ``Qwen3VLVisionPatchMerger``, line 974) — but no DeepStack mergers (the
  class builds only ``merger``; a config's ``deepstack_visual_indexes`` is not read) and so no DeepStack sums in
  the decoder. It is read as a :class:`cabe.vision.tower.VisionTower` of kind ``"qwen3_vl"`` with no DeepStack
  indexes (cabe.vision.qwen3). Images are resized by Qwen3-VL's processor bounds (``Qwen3VLProcessor`` with
  ``Qwen2VLImageProcessorFast``, patch 16, merge 2, shortest_edge 65,536, longest_edge 16,777,216: what a public
  dump of Qwen/Qwen3.5-2B-Base's preprocessor_config.json shows).
* **Tied head**: the top-level ``tie_word_embeddings`` ties ``lm_head`` to the decoder's embedding (default False;
  ``text_config.tie_word_embeddings`` alone does not: a meta build of transformers 5.24 with only the nested key
  true has an untied head). Qwen3.5-0.8B / 2B / 4B set it true at both levels.
* **Multi-token prediction**: the checkpoints' ``mtp.*`` weights (``mtp_num_hidden_layers`` 1) are not built
  by transformers (``Qwen3_5PreTrainedModel._keys_to_ignore_on_load_unexpected = [r"^mtp.*"]``,
  modeling_qwen3_5.py:919; the same in qwen3_5_moe): dropped on load, not counted.

``AutoModelForCausalLM`` maps these types to the text-only ``Qwen3_5ForCausalLM`` ("VLM compatibility",
models/auto/modeling_auto.py:941-942), which drops the tower on load (``^model.visual.*`` ignored); the
published class, what ``AutoModelForImageTextToText`` and the checkpoints' ``architectures`` build, keeps it, and
is what is counted here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.families import qwen3_next, qwen3_vl
from cabe.families._common import Reader, config_section

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")

#: the nested decoder's model type
_TEXT_TYPE = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}

#: transformers 5.24 ``Qwen3_5TextConfig`` / ``Qwen3_5MoeTextConfig`` defaults that :func:`qwen3_next.read`
#: does not already default the same way (configuration_qwen3_5.py, configuration_qwen3_5_moe.py)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_5": {
        "vocab_size": 248_320,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 32768,
    },
    "qwen3_5_moe": {
        "vocab_size": 248_320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32768,
    },
}

#: ``Qwen3_5VisionConfig`` / ``Qwen3_5MoeVisionConfig`` defaults: Qwen3-VL's, without DeepStack
VISION_DEFAULTS: dict[str, Any] = {**qwen3_vl.VISION_DEFAULTS, "deepstack_visual_indexes": []}


def read(r: Reader, name: str) -> ModelSpec:
    text_type = _TEXT_TYPE[r.model_type]
    text = {**TEXT_DEFAULTS[r.model_type], **(config_section(r.c, "text_config") or {}), "model_type": text_type}
    # Qwen3_5Config.tie_word_embeddings (default False) ties the head; the nested key alone does not
    text["tie_word_embeddings"] = bool(r.c.get("tie_word_embeddings", False))
    spec = qwen3_next.read(Reader(text, text_type), name)
    vision = {**VISION_DEFAULTS, **(config_section(r.c, "vision_config") or {})}
    vision["deepstack_visual_indexes"] = []  # Qwen3_5VisionModel builds no DeepStack merger whatever the key says
    vt = qwen3_vl.tower(Reader(vision, "qwen3_5_vision"))
    return replace(spec, model_type=r.model_type, config=dict(r.c), vision=vt, vision_parameters=vt.parameter_count)
