"""The tensors decoder layer 0 saves for backward in one forward pass, collected inside a trace (:func:`collect`,
which :func:`cabe.trace.layer_inventory` runs): the module inside the layer, the aten op that allocated the storage,
the autograd node that produced the tensor, shape, dtype, kind (activation, parameter, weight_copy) and bytes
(storages counted once, rounded to 512 B as on the GPU). ``python -m cabe.trace.inventory`` prints them
(:mod:`cabe.trace.inventory`). Proved by tests/trace/test_outputs.py and tests/core_torch/test_saved_tensors.py."""

from __future__ import annotations

from typing import Any

from cabe.trace import _native
from cabe.trace.build import decoder_layers
from cabe.trace.inputs import autocast, make_inputs
from cabe.training import TrainingSetup

_native.preload()


class _Rows:
    """The saved-tensor hook of layer 0: one row per tensor autograd saves while the layer runs."""

    def __init__(self, model: Any, layer0: Any, device: Any, tracker: Any) -> None:
        self.layer0 = layer0
        self.device = device
        self.tracker = tracker
        self.names = {m: n for n, m in layer0.named_modules()}
        self.params = {p.untyped_storage()._cdata: n for n, p in model.named_parameters()}
        self.stack: list[str] = []
        self.active = False
        self.rows: list[dict[str, Any]] = []
        self.keys: list[int] = []
        self.seen: dict[int, int] = {}

    def pre(self, mod: Any, args: Any) -> None:
        self.stack.append(self.names.get(mod, "?"))
        if mod is self.layer0:
            self.active = True

    def post(self, mod: Any, args: Any, out: Any) -> None:
        if self.stack:
            self.stack.pop()
        if mod is self.layer0:
            self.active = False

    def pack(self, t: Any) -> Any:
        import torch

        if self.active and isinstance(t, torch.Tensor) and t.device.type == self.device.type:
            self._add(t)
        return t

    def _kind(self, key: int, aid: int | None) -> str:
        if key in self.params:
            return "parameter"
        if aid is not None and aid in self.tracker.copy_of_weight:
            return "weight_copy"
        return "activation"

    def _add(self, t: Any) -> None:
        from cabe.trace.tracker import round_up

        key = t.untyped_storage()._cdata
        aid = self.tracker.live.get(key)
        row = {
            "module": next((s for s in reversed(self.stack) if s), "") or "(layer)",
            "op": self.tracker.op_of[aid] if aid is not None else "",
            "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else ("leaf" if t.requires_grad else ""),
            "shape": list(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "bytes": round_up(t.untyped_storage().nbytes()),
            "kind": self._kind(key, aid),
            "shared_with": None,
            "name": self.params.get(key),
        }
        if key in self.seen:
            row["shared_with"] = self.seen[key]
            row["bytes"] = 0
        else:
            self.seen[key] = len(self.rows)
        self.rows.append(row)
        self.keys.append(key)


def collect(model: Any, cfg: Any, setup: TrainingSetup, device: Any, tracker: Any) -> list[dict[str, Any]]:
    """The rows of :func:`cabe.trace.layer_inventory`: one forward with layer 0's saved tensors listed."""
    import torch

    layer0 = decoder_layers(model, cfg)[0]
    rows = _Rows(model, layer0, device, tracker)
    handles = []
    for m in layer0.modules():
        handles.append(m.register_forward_pre_hook(rows.pre))
        handles.append(m.register_forward_hook(rows.post))
    ids, labels, positions = make_inputs(cfg, setup, device)
    extra = {} if positions is None else {"position_ids": positions}
    tracker.set_phase("forward")
    try:
        with torch.autograd.graph.saved_tensors_hooks(rows.pack, lambda t: t), autocast(setup):
            out = model(input_ids=ids, labels=labels, use_cache=False, **extra)
        saved_by = _saved_by(out.loss, device)
        del out
    finally:
        for h in handles:
            h.remove()
    for r, key in zip(rows.rows, rows.keys):
        r["saved_by"] = ",".join(sorted(set(saved_by.get(key, []))))
    return rows.rows


def _saved_by(loss: Any, device: Any) -> dict[int, list[str]]:
    """storage key -> names of the autograd nodes that hold it as a saved tensor."""
    import torch

    out: dict[int, list[str]] = {}
    stack = [loss.grad_fn]
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        name = type(fn).__name__
        for x in _saved_values(fn):
            if isinstance(x, torch.Tensor) and x.device.type == device.type:
                out.setdefault(x.untyped_storage()._cdata, []).append(name)
        for nxt, _ in fn.next_functions:
            stack.append(nxt)
    return out


def _saved_values(fn: Any) -> list[Any]:
    """What an autograd node holds for backward (``_saved_*`` attributes and ``saved_tensors``)."""
    values: list[Any] = []
    for attr in dir(fn):
        if attr.startswith("_saved_") or attr == "saved_tensors":
            try:
                v = getattr(fn, attr)
            except Exception:
                continue
            values.extend(v if isinstance(v, (tuple, list)) else (v,))
    return values
