"""The longest context a model was built for, rope scaling included, read from its config.json.

transformers 5.25 keeps the scaling in ``rope_parameters`` (``rope_scaling`` in 4.x configs and on the Hub),
modeling_rope_utils.py: ``_compute_llama3_parameters`` stretches the rotary frequencies by ``factor`` over
``original_max_position_embeddings`` (Llama 3.1: 8 × 8,192 = 131,072, the ``max_position_embeddings`` it ships);
``_compute_yarn_parameters`` by ``factor`` over ``original_max_position_embeddings`` (or ``max_position_embeddings``
when the config has none: Qwen2.5's model cards add ``{"type": "yarn", "factor": 4.0,
"original_max_position_embeddings": 32768}`` for 131,072 tokens while ``max_position_embeddings`` stays 32,768);
``linear`` and ``dynamic`` (NTK) likewise scale positions by ``factor``. ``longrope`` (Phi-3) ships the scaled
length as ``max_position_embeddings`` already. The limit is the larger of ``max_position_embeddings`` and
factor × the original positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: rope types whose ``factor`` stretches the positions the model was trained on
SCALING = ("linear", "dynamic", "yarn", "llama3")


def _rope(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for c in (config, config.get("text_config") or {}):
        if isinstance(c, Mapping):
            for key in ("rope_parameters", "rope_scaling"):
                rope = c.get(key)
                if isinstance(rope, Mapping) and rope:
                    return rope
    return {}


def _positions(config: Mapping[str, Any], fallback: int) -> int:
    for c in (config, config.get("text_config") or {}):
        if isinstance(c, Mapping) and isinstance(c.get("max_position_embeddings"), int):
            return int(c["max_position_embeddings"])
    return fallback


def context_limit(config: Mapping[str, Any], context: int, max_positions: int = 0) -> dict[str, Any]:
    """``{"limit", "native", "rope_type", "factor", "original", "beyond"}``: the model's context limit for ``context``
    (0 when the config states none: ``beyond`` is then False)."""
    native = _positions(config, max_positions)
    rope = _rope(config)
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    factor = rope.get("factor")
    limit = native
    original = None
    if kind in SCALING and isinstance(factor, (int, float)) and factor > 0:
        original = rope.get("original_max_position_embeddings") or config.get("original_max_position_embeddings")
        original = int(original) if isinstance(original, (int, float)) and original > 0 else native
        limit = max(native, round(factor * original))
    return {
        "limit": limit,
        "native": native,
        "rope_type": kind,
        "factor": factor if original is not None else None,
        "original": original,
        "beyond": bool(limit) and context > limit,
    }
