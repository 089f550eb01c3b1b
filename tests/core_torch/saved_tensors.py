"""Measure what autograd really saves in one decoder layer of a tiny transformers model (CPU).

Used by the tests to hold cabe.activations to PyTorch: storages saved for backward during
layer 1's forward, deduplicated by storage, parameters and autocast weight copies excluded.
"""

from __future__ import annotations

import torch


def layer_saved_bytes(
    model, input_ids, *, layer_index: int = 1, amp: bool = False, labels=None, used_only: bool = False
) -> int:
    """Bytes first saved for backward inside decoder layer ``layer_index`` (+ its per-layer constants);
    ``labels`` default to the input ids (a causal LM), one class per sequence for a classifier.

    ``used_only``: count only what backward reads back (a graph built and dropped inside forward — DoRA's
    detached weight norm — saves tensors that die with it, and the CPU allocator may hand their addresses
    to later storages)."""
    if used_only:
        return _used_saved_bytes(model, input_ids, layer_index, amp, labels)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    weight_shapes |= {s[::-1] for s in weight_shapes}
    seen: dict[int, int] = {}
    where = ["pre"]
    layers = _layers(model)
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "post")))

    first_seen: dict[int, object] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr in params or ptr in first_seen:
            return t
        first_seen[ptr] = where[0]  # a storage belongs to the layer that first saves it (cos/sin: layer 0)
        if where[0] == layer_index:
            # autocast's cached weight copies are 2-D transposed views of a param-sized storage
            # (and so are the per-use casts of frozen weights, which have no grad_fn)
            cast_of_weight = (
                amp
                and t.dim() == 2
                and tuple(t.shape) in weight_shapes
                and (t.grad_fn is None or t.grad_fn.name() == "TBackward0")
            )
            if not cast_of_weight:
                seen[ptr] = t.untyped_storage().nbytes()
        return t

    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
        ):
            out = model(input_ids=input_ids, labels=input_ids if labels is None else labels)
        out.loss.backward()
    finally:
        for h in hooks:
            h.remove()
    return sum(seen.values())


def _used_saved_bytes(model, input_ids, layer_index: int, amp: bool, labels) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    weight_shapes |= {s[::-1] for s in weight_shapes}
    where = ["pre"]
    records: list[tuple[int, int, object, bool]] = []  # (ptr, nbytes, layer, autocast weight copy), pack order
    used: set[int] = set()
    hooks = []
    for i, layer in enumerate(_layers(model)):
        hooks.append(layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "post")))

    def pack(t):
        cast = amp and t.dim() == 2 and tuple(t.shape) in weight_shapes
        cast = cast and (t.grad_fn is None or t.grad_fn.name() == "TBackward0")
        records.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), where[0], cast))
        return (len(records) - 1, t)

    def unpack(packed):
        used.add(packed[0])
        return packed[1]

    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, unpack),
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp),
        ):
            out = model(input_ids=input_ids, labels=input_ids if labels is None else labels)
        out.loss.backward()
    finally:
        for h in hooks:
            h.remove()
    first: dict[int, object] = {}
    seen: dict[int, int] = {}
    for k, (ptr, nbytes, layer, cast) in enumerate(records):
        if k not in used or ptr in params or ptr in first:
            continue
        first[ptr] = layer
        if layer == layer_index and not cast:
            seen[ptr] = nbytes
    return sum(seen.values())


def _layers(model):
    base = getattr(model, "base_model", model)
    base = getattr(base, "model", base)
    for path in ("model.layers", "layers", "transformer.h", "gpt_neox.layers", "h", "encoder.layer"):
        obj = base
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise AttributeError("no decoder layers found")
