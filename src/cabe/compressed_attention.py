"""DeepSeek-V4's compressed attention outside a training step: the cache a served sequence keeps
(:func:`kv_cache_elements`), the compressed entries a layer makes (:func:`entries`, which the training room
:mod:`cabe.activations.compressed` counts too) and the refusal of prompt tuning on hash-routed layers. Proved by
tests/families/test_deepseek_v4.py.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.layers import LayerGroup
from cabe.mixers import CompressedAttention


def refusal(spec: ModelSpec, method: str) -> None:
    """Prompt tuning cannot run hash-routed MoE layers: ``DeepseekV4HashRouter.forward`` indexes ``tid2eid`` with
    ``input_ids``, and PEFT's prompt tuning calls the model with ``inputs_embeds`` alone (peft_model.py
    ``PeftModelForCausalLM.forward``): ``None.reshape`` (the trace fails there the same way)."""
    if method == "prompt-tuning" and any(g.router == "hash" for g in spec.layer_groups):
        raise InvalidValueError("prompt_tuning_hash_routing", "method", value=method, model_type=spec.model_type)


def entries(ca: CompressedAttention, attention: str, s: int) -> int:
    """Compressed entries a layer of kind ``attention`` makes from ``s`` tokens: one per closed window."""
    rate = ca.rate(attention)
    return s // rate if rate else 0


def kv_cache_elements(spec: ModelSpec, group: LayerGroup, context: int) -> int:
    """Elements one sequence of ``context`` tokens keeps in one layer of ``group`` once it decodes, as transformers
    5.24 caches it (cache_utils.py ``DynamicSlidingWindowLayer``; modeling_deepseek_v4.py ``DeepseekV4HCACache`` /
    ``DeepseekV4CSACache``): a sliding layer its window's keys and values (two tensors of one head of d: its cache
    ``cat``s them apart); a compressed layer its window's key = value (one tensor, ``self.values = self.keys``), the
    compressed entries (d each, and CSA's indexer's own of d_I), the tokens of the window not closed yet (their kv
    and gate: 2·d each for HCA, 2·(2·d + 2·d_I) for CSA's two series) and CSA's overlap (the last window's Ca kv and
    gate: 2·rate·(d + d_I)). The window is whole after a decode step (``cat`` of the w - 1 kept and the new token;
    the kept slice is a view of it). Counted in the cache's dtype (the gate buffers and the overlap's gate are the
    gate projection's dtype and fp32 in transformers: modelled)."""
    ca = spec.compressed_attention
    assert ca is not None
    d = ca.head_dim
    window = min(context, ca.window)
    rate = ca.rate(group.attention)
    if not rate:
        return 2 * window * d
    t, left = context // rate, context % rate
    if group.attention == "compressed_sparse":
        di = ca.index_head_dim
        overlap = 2 * rate * (d + di) if t else 0
        return window * d + t * (d + di) + left * 2 * (2 * d + 2 * di) + overlap
    return window * d + t * d + left * 2 * d


def kv_cache_bytes(spec: ModelSpec, context: int, batch: int, element_bytes: float) -> int:
    """The cache of ``batch`` sequences of ``context`` tokens (:func:`kv_cache_elements` over the layers)."""
    elements = sum(g.count * kv_cache_elements(spec, g, context) for g in spec.layer_groups)
    return round(batch * elements * element_bytes)
