"""Each parameter tensor's share on one GPU, and the sums of what that GPU holds.

A tensor's share is the product of its tensor-parallel share (:func:`tp_share`), its expert-parallel
share (:func:`ep_share`) and its pipeline-stage share (:func:`pp_share`); the data-parallel strategy
then divides the sharded figures by the tensor's shard group (experts by their own, smaller group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cabe.architecture import ModelSpec
from cabe.method import Tensor, quantized_bytes, stored_bytes
from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.training import TrainingSetup

#: parameter tensors that are not in a decoder layer
NON_LAYER = ("embed_tokens", "position_embeddings", "final_norm", "lm_head", "prompt_embeddings")


@dataclass
class Holdings:
    """Byte and element sums over the tensors one GPU holds (model-parallel share applied);
    ``*_sharded`` the same divided by each tensor's data-parallel shard group."""

    stored: float = 0.0  # stored bytes, non-quantized
    stored_sharded: float = 0.0
    quantized: float = 0.0  # quantized (4-bit) bytes
    quantized_sharded: float = 0.0
    trainable: float = 0.0  # trainable stored bytes
    trainable_sharded: float = 0.0
    elements: float = 0.0  # non-quantized elements
    elements_sharded: float = 0.0
    trainable_elements: float = 0.0
    trainable_elements_sharded: float = 0.0
    persistent_elements: float = 0.0  # ZeRO-3: elements under the persistence threshold (kept whole)
    layer_elements: float = 0.0  # non-quantized elements of one decoder layer
    layer_quantized: float = 0.0  # quantized bytes of one decoder layer
    layer_stored: float = 0.0  # stored bytes of one decoder layer
    layer_trainable_elements: float = 0.0
    root_elements: float = 0.0  # embeddings, final norm, lm_head on this stage
    root_stored: float = 0.0
    largest_module: float = 0.0  # elements of the largest module (DeepSpeed's "largest layer")


def tp_share(t: Tensor, base: str, role: str, spec: ModelSpec, tp: int, cfg: ShardConfig) -> float:
    """Megatron-style tensor parallelism: matrices split in tp, norms and routers replicated,
    embeddings split over the vocabulary (``vocab_parallel``), k / v replicated per kv head when
    there are fewer kv heads than ranks."""
    name = t.name
    if tp == 1 or t.kind == "norm" or name in ("position_embeddings", "prompt_embeddings", "final_norm"):
        return 1.0
    if name in ("embed_tokens", "lm_head"):
        return 1 / tp if cfg.vocab_parallel else 1.0
    if role == "router":
        return 1.0
    if base in ("k_proj", "v_proj") and spec.num_kv_heads < tp:
        return 1 / spec.num_kv_heads  # each rank keeps (a replica of) one KV head
    return 1 / tp


def ep_divisor(role: str, ep: int) -> int:
    """Expert parallelism: each rank of an ep group holds 1/ep of the experts."""
    return ep if role == "expert" else 1


def pp_share(name: str, spec: ModelSpec, lay: Layout) -> float:
    """Pipeline parallelism: a stage holds its layers; embeddings on the first stage (and, tied, on
    the last), final norm and lm_head on the last."""
    if name not in NON_LAYER:
        return lay.stage_layers / spec.num_layers
    if name in ("embed_tokens", "position_embeddings", "prompt_embeddings"):
        on = lay.first or (name == "embed_tokens" and spec.tie_word_embeddings and lay.last)
        return 1.0 if on else 0.0
    return 1.0 if lay.last else 0.0  # final_norm, lm_head


def holdings(
    spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig, tensors: list[Tensor], dt: Any, lay: Layout
) -> Holdings:
    """What one GPU of ``lay`` holds of ``tensors``."""
    layers = spec.num_layers
    roles = {lin.name: lin.role for lin in spec.layer_linears}
    copies = {lin.name: lin.copies for lin in spec.layer_linears}
    stage_layers = lay.stage_layers
    h = Holdings()
    group_of_experts = max(lay.shard_group // lay.ep, 1) if lay.ep > 1 else lay.shard_group
    for t in tensors:
        name = t.name
        base = name.split(".lora_")[0].removesuffix(".bias")
        is_layer = name not in NON_LAYER
        role = roles.get(base, "attn")
        share = tp_share(t, base, role, spec, lay.tp, cfg)
        share /= ep_divisor(role, lay.ep)
        group = group_of_experts if role == "expert" else lay.shard_group
        share *= pp_share(name, spec, lay)
        if share == 0:
            continue
        numel = t.total * share
        per_tensor = t.numel * share / (stage_layers / layers) if is_layer else t.numel * share
        if t.kind == "quantized":
            qb = quantized_bytes(t.numel, setup.double_quant) * t.count * share
            h.quantized += qb
            h.quantized_sharded += qb / group
            if is_layer:
                h.layer_quantized += qb / stage_layers
            h.largest_module = max(h.largest_module, per_tensor)
            continue
        b = stored_bytes(t, setup, dt)
        _add_stored(h, t, numel, b, group, is_layer, stage_layers, t.numel * share < cfg.param_persistence_threshold)
        # a module's parameters: weight (+ its experts, stored as one 3-D parameter)
        mod = per_tensor * (copies.get(base, 1) if t.count == layers * copies.get(base, 1) else 1)
        h.largest_module = max(h.largest_module, mod if role == "expert" else per_tensor)
    return h


def _add_stored(
    h: Holdings, t: Tensor, numel: float, b: int, group: int, is_layer: bool, stage_layers: int, persistent: bool
) -> None:
    h.stored += numel * b
    h.stored_sharded += numel * b / group
    h.elements += numel
    h.elements_sharded += numel / group
    if t.trainable:
        h.trainable += numel * b
        h.trainable_sharded += numel * b / group
        h.trainable_elements += numel
        h.trainable_elements_sharded += numel / group
    if persistent:  # under ZeRO-3's param_persistence_threshold
        h.persistent_elements += numel
    if is_layer:
        h.layer_elements += numel / stage_layers
        h.layer_stored += numel * b / stage_layers
        if t.trainable:
            h.layer_trainable_elements += numel / stage_layers
    else:
        h.root_elements += numel
        h.root_stored += numel * b
