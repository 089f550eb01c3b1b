"""Qwen3-VL-MoE: Qwen3-VL's vision tower (:mod:`cabe.families.qwen3_vl`: LayerNorm blocks over the whole image,
learned positions, a 2 x 2 merger and DeepStack mergers feeding the decoder's first layers) in front of a Qwen3-MoE
decoder (:mod:`cabe.families.qwen_moe`: q / k RMSNorm per head, routed SwiGLU experts behind a bare router weight,
dense layers where ``mlp_only_layers`` / ``decoder_sparse_step`` say so) — transformers 5.24
``Qwen3VLMoeForConditionalGeneration``, models/qwen3_vl_moe/modeling_qwen3_vl_moe.py.

What the code says, checked against the two families it is made of:

* the decoder layer (``Qwen3VLMoeTextDecoderLayer``, modeling_qwen3_vl_moe.py:348-357) picks the sparse block by
  ``qwen_moe.is_moe``'s rule; the experts (``Qwen3VLMoeTextExperts``, :114-150) are Qwen3-MoE's to the line: two
  3-D parameters (``gate_up_proj`` E x 2f x h, ``down_proj`` E x h x f) and the same per-expert loop or the
  ``use_experts_implementation`` kernels; the router (``Qwen3VLMoeTextTopKRouter``, :153-169) a bare (E, h) weight,
  softmax in fp32, top-k always renormalised (Qwen3-MoE's ``norm_topk_prob`` branch taken, no config key);
* the tower is Qwen3-VL's class for class (``Qwen3VLMoeVisionModel``, :675-780): the same
  :class:`cabe.vision.tower.VisionTower` of kind ``"qwen3_vl"``, so the same estimators;
* ``text_config`` defaults differ from both families' (``Qwen3VLMoeTextConfig``, configuration_qwen3_vl_moe.py):
  60 experts of 1,408, 4 per token, a 5,632-wide dense MLP, 24 layers of 2,048 and 16 heads with ``head_dim``
  hidden / heads, no sliding window (``__post_init__`` sets ``sliding_window = None``).

PEFT 0.21.2: ``qwen3_vl_moe`` is no key of transformers' ``_MODEL_TO_CONVERSION_PATTERN``
(conversion_mapping.py:48-148, 5.24; its own entry at :1450 only transposes the checkpoint's experts), so
``_convert_peft_config_moe`` (peft/utils/transformers_weight_conversion.py:213-217) returns at once: no target
moves onto the fused expert parameters, ``all-linear`` adapts the ``nn.Linear`` modules only (attention, dense
MLPs, the tower and its mergers) and the experts and the router stay frozen and unadapted. PEFT has no default
``target_modules`` for the type (peft/utils/constants.py): cabe plans ``all-linear`` as for Qwen3-MoE.
bitsandbytes (transformers' integration, quantizers/base.py:39-63) replaces ``nn.Linear`` modules only: the experts
stay 16-bit under QLoRA (the ``Linear``s below are not modules).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.families import qwen3_vl, qwen_moe
from cabe.families._common import Reader

MODEL_TYPES = ("qwen3_vl_moe",)

#: transformers 5.24 ``Qwen3VLMoeTextConfig`` defaults (configuration_qwen3_vl_moe.py): a key the config leaves out
#: (head_dim: hidden_size // num_attention_heads when absent, as :func:`cabe.families._common.attention_shape` reads)
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151_936,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 128_000,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "num_experts_per_tok": 4,
    "num_experts": 60,
    "mlp_only_layers": [],
}

#: ``Qwen3VLMoeVisionConfig``'s defaults are ``Qwen3VLVisionConfig``'s (configuration_qwen3_vl_moe.py)
VISION_DEFAULTS = qwen3_vl.VISION_DEFAULTS


def read(r: Reader, name: str) -> ModelSpec:
    text = qwen3_vl.text_fields(r, TEXT_DEFAULTS, "qwen3_moe")
    text["use_sliding_window"] = False  # Qwen3VLMoeTextConfig.__post_init__: no sliding window
    if "num_local_experts" in text and "num_experts" not in (qwen3_vl.config_section(r.c, "text_config") or {}):
        # transformers writes num_experts back as num_local_experts (its attribute_map): that one, over the default
        text["num_experts"] = text["num_local_experts"]
    spec = qwen_moe.read(Reader(text, "qwen3_moe"), name)
    # no conversion pattern for qwen3_vl_moe in PEFT 0.21.2: nothing moves onto the fused experts (module docstring)
    spec = replace(spec, peft_parameter_targets=(), lora_unsupported=("gate", "experts"))
    return qwen3_vl.with_tower(spec, r, VISION_DEFAULTS, "qwen3_vl_moe")
