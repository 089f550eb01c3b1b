"""What each memory knob of a request does to its peak: saves, costs, or nothing (issue 32 item 4).

A knob is a field people set to save memory (the solver's changes, :mod:`cabe.solver`, and the schema's memory
savers, :mod:`cabe.schema`): checkpointing, selective checkpointing, activation offload, LoRA / QLoRA / freeze against
the method they replace, LoRA's rank against PEFT's default, the weights' dtype and autocast, an 8-bit / paged /
low-rank optimizer, its implementation, the optimizer in backward, flash attention, packing, a chunked or fused loss,
DoRA, modules_to_save, gradient accumulation, sharding, offload and FSDP's mixed precision. For each one the request
sets, the same request is estimated again without it (:data:`KNOBS`: the field at its default, or the method it
replaces) and the two peaks are compared; which components grew or fell says why, and the explained steps that grew
(:data:`REASON_STEPS`) say how, in the report's own figures. Nothing here is a special case: a knob that costs memory
is found by its counterfactual, never listed.

Not on the estimate's path (one estimate per knob): only when asked (``cabe estimate --explain``, ``explain=true`` on
``POST /api/estimate`` and :func:`cabe.estimate`, the page's result). Pure: no torch, codes and numbers only; the
words are the catalogs' (``i18n/<lang>/knobs.json``), written by :mod:`cabe.report.knobs`. Proved by
tests/test_knob_effects.py."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe import schema
from cabe.errors import CabeError
from cabe.training import TrainingSetup

# (reports and specs are read, never imported: cabe.report's text view imports this module's NEGLIGIBLE)
Report = Any
ModelSpec = Any

#: the method a method replaces, to save memory (the solver's "lora" from full, "qlora" from LoRA)
REPLACES = {"lora": "full", "qlora": "lora", "freeze": "full", "prompt-tuning": "full"}


def _method(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"method": REPLACES[s.method]} if s.method in REPLACES else None


def _dtype(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    """16-bit weights (as loaded: ``auto`` resolved to the checkpoint's dtype, the report's setup) against fp32."""
    return {"dtype": "fp32"} if r.get("dtype") in ("bf16", "fp16") else None


def _off(name: str, off: Any = False) -> Callable[[TrainingSetup, Mapping[str, Any]], dict[str, Any] | None]:
    """A knob that is on when the field is not ``off``; without it: ``off``."""

    def without(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
        return None if getattr(s, name) == off else {name: off}

    return without


def _default(name: str) -> Callable[[TrainingSetup, Mapping[str, Any]], dict[str, Any] | None]:
    """A knob set away from its schema default; without it: the default."""
    return _off(name, schema.field(name).default)


def _loss(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return None if s.resolved_loss == "hf" else {"loss": "hf"}


def _checkpoint_every(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"checkpoint_every": 1} if s.checkpointing and s.checkpoint_every > 1 else None


def _optimizer_impl(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"optimizer_impl": None} if s.optimizer_impl not in (None, "foreach") else None


def _shard(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    """Sharded states over several GPUs, against each GPU holding them whole (DDP); with an offload, that knob's."""
    if s.gpus > 1 and s.shard not in ("none", "ddp") and s.offload == "none":
        return {"shard": "ddp", "param_dtype": "none", "reshard_after_forward": True}
    return None


def _reshard(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"reshard_after_forward": True} if s.shard.startswith("fsdp") and not s.reshard_after_forward else None


def _tp_knob(name: str) -> Callable[[TrainingSetup, Mapping[str, Any]], dict[str, Any] | None]:
    def without(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
        return {name: False} if s.tp > 1 and getattr(s, name) else None

    return without


def _attention(s: TrainingSetup, r: Mapping[str, Any]) -> dict[str, Any] | None:
    return {"attention": "sdpa"} if s.attention == "flash" else None


#: knobs whose cost is no surprise: gradient accumulation against the same micro-batch without it (it keeps the
#: gradients between micro-batches; what it saves is against a larger micro-batch). (A LoRA rank is a saver below
#: PEFT's default only, the solver's "lower_rank": :func:`_saver`.)
NOT_SAVERS = ("grad_accum",)


def _saver(name: str, value: Any) -> bool:
    """Is this knob, at this value, one people set to save memory (so that a cost is a cost "instead of saving")?"""
    if name == "lora_rank":
        return bool(value < schema.field("lora_rank").default)
    return name not in NOT_SAVERS


#: (field, the request's change without the knob, or None when the request does not set it), in the order shown
KNOBS: tuple[tuple[str, Callable[[TrainingSetup, Mapping[str, Any]], dict[str, Any] | None]], ...] = (
    ("method", _method),
    ("dtype", _dtype),
    ("autocast", _off("autocast", "none")),
    ("lora_rank", _default("lora_rank")),
    ("adapter_dtype", _default("adapter_dtype")),
    ("optimizer", _default("optimizer")),
    ("optimizer_impl", _optimizer_impl),
    ("optimizer_in_backward", _off("optimizer_in_backward")),
    ("checkpointing", _off("checkpointing")),
    ("checkpoint_every", _checkpoint_every),
    ("offload_activations", _off("offload_activations")),
    ("attention", _attention),
    ("packing", _default("packing")),
    ("loss", _loss),
    ("grad_accum", _default("grad_accum")),
    ("dora", _off("dora")),
    ("modules_to_save", _off("modules_to_save", ())),
    ("shard", _shard),
    ("offload", _default("offload")),
    ("param_dtype", _default("param_dtype")),
    ("reshard_after_forward", _reshard),
    ("sequence_parallel", _tp_knob("sequence_parallel")),
    ("loss_parallel", _tp_knob("loss_parallel")),
)

#: explained steps whose growth the catalogs put in words (``knob.step.<key>``): how a knob made a component grow
#: each with the steps that hold the same tensors under another name, weighed together: a trained layer's checkpointed
#: input is a frozen layer's under freeze (freeze against full fine-tuning moves inputs from one step to the other;
#: it adds none)
REASON_STEPS: dict[str, tuple[str, ...]] = {
    "activations.frozen_inputs": ("activations.frozen_inputs", "activations.checkpointed"),
    "weight_copies": ("weight_copies",),
    "activations.selective": ("activations.selective",),
    "optimizer_temporaries": ("optimizer_temporaries",),
}
_WEIGHED = {k for keys in REASON_STEPS.values() for k in keys}

#: a difference under a thousandth of the peak is no effect worth a word (display rule, not a model figure)
NEGLIGIBLE = 1e-3


def _cleaned(setup: TrainingSetup, change: dict[str, Any]) -> dict[str, Any]:
    """``change`` with the fields that act only beside the knob's value back at their defaults (LoRA's rank without
    LoRA, GaLore's without GaLore), as a request without the knob would leave them."""
    out = dict(change)
    method = out.get("method", setup.method)
    for f in schema.SETUP_FIELDS:
        if f.name in out:
            continue
        moot = (f.methods and method not in f.methods) or (f.low_rank_only and "optimizer" in out)
        if moot and getattr(setup, f.name) != f.default:
            out[f.name] = f.default
    if "optimizer" in out and setup.optimizer_impl is not None:
        out["optimizer_impl"] = None  # an HF name's implementation (adamw_torch_fused) goes with it
    return out


def effects(spec: ModelSpec, setup: TrainingSetup, report: Report, estimate: Callable[..., Report]) -> list[dict]:
    """Each knob the request sets, with the peak without it: ``field``, ``value`` (as set), ``without`` (the value
    estimated instead), ``with_bytes`` / ``without_bytes`` (the two peaks), ``delta_bytes`` (with − without),
    ``effect`` (``saves`` / ``costs`` / ``nothing``), ``saver`` (set to save memory: a cost is one instead of a
    saving, :func:`_saver`), ``components`` (each component's change, bytes) and ``reasons``
    (the explained steps among :data:`REASON_STEPS` that grew: key, bytes with and without, the step's params). A
    knob whose counterfactual is itself refused (a combination that cannot run) is left out.

    ``estimate``: :func:`cabe.analytic.estimate_model` (passed in: this module sits above the analytic path)."""
    out: list[dict] = []
    resolved = report.setup
    for name, without in KNOBS:
        change = without(setup, resolved)
        if change is None:
            continue
        try:
            other = estimate(spec, setup.with_(**_cleaned(setup, change)))
        except CabeError:
            continue
        out.append(_effect(name, resolved.get(name, getattr(setup, name)), change[name], report, other))
    return out


def _effect(name: str, value: Any, without: Any, report: Report, other: Report) -> dict[str, Any]:
    delta = report.total_bytes - other.total_bytes
    if abs(delta) < NEGLIGIBLE * max(report.total_bytes, other.total_bytes):
        effect = "nothing"
    else:
        effect = "costs" if delta > 0 else "saves"
    names = list(report.components) + [k for k in other.components if k not in report.components]
    components = {k: d for k in names if (d := report.components.get(k, 0) - other.components.get(k, 0)) != 0}
    return {
        "field": name,
        "value": list(value) if isinstance(value, tuple) else value,
        "without": list(without) if isinstance(without, tuple) else without,
        "with_bytes": report.total_bytes,
        "without_bytes": other.total_bytes,
        "delta_bytes": delta,
        "effect": effect,
        "saver": _saver(name, value),
        "components": dict(sorted(components.items(), key=lambda kv: -abs(kv[1]))),
        "reasons": _reasons(report, other, NEGLIGIBLE * max(report.total_bytes, other.total_bytes)),
    }


def _step_bytes(report: Report) -> dict[str, tuple[int, dict[str, Any]]]:
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for s in report.steps:
        key = "optimizer_temporaries" if s.key.startswith("optimizer_temporaries.") else s.key
        if key in _WEIGHED and s.bytes:
            out[key] = (s.bytes, {k: v for k, v in s.params.items() if isinstance(v, (int, float, str))})
    return out


def _reasons(report: Report, other: Report, least: float) -> list[dict[str, Any]]:
    """The explained steps of :data:`REASON_STEPS` that are larger with the knob than without it, with the steps that
    hold the same tensors (by ``least`` bytes at least: a growth worth a word)."""
    mine, theirs = _step_bytes(report), _step_bytes(other)
    out = []
    for key, same in REASON_STEPS.items():
        if key not in mine:
            continue
        grown = sum(mine.get(k, (0, {}))[0] - theirs.get(k, (0, {}))[0] for k in same)
        if grown >= least:
            nbytes, params = mine[key]
            out.append(
                {"key": key, "with_bytes": nbytes, "without_bytes": theirs.get(key, (0, {}))[0], "params": params}
            )
    return out
