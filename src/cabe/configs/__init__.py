"""Read the configs people already have and turn them into a cabe request.

One module per input format, each with ``read(path_or_dict) -> Mapping`` and
``to_request(data) -> (request_fields, used, ignored)``:

========================  ================================================================
``training_args``         transformers ``TrainingArguments`` / TRL ``SFTConfig`` (JSON, YAML)
``peft_config``           PEFT ``adapter_config.json`` / ``LoraConfig``
``bnb``                   ``BitsAndBytesConfig``
``deepspeed``             DeepSpeed config JSON
``accelerate``            ``accelerate config`` YAML (FSDP, DeepSpeed, multi-GPU)
``axolotl``               axolotl YAML
``torchtune``             torchtune recipe YAML
``llama_factory``         LLaMA-Factory training YAML
``unsloth``               an unsloth training script's arguments (YAML / JSON, docs/unsloth-config.md)
``requirements``          pip requirements / ``pip freeze``: the transformers line the run installs
========================  ================================================================

:func:`from_files` reads several at once (``cabe from-config train.json adapter_config.json``),
detects each format from its content (the file name breaks ties), and merges the fields: the
same field with two different values in two files is a :class:`~cabe.errors.ConfigError`
(``cfg_conflict``), except that QLoRA refines LoRA and a precision's amp / pure form follows
the method.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cabe import schema
from cabe.configs import _base
from cabe.configs._base import ConfigText
from cabe.errors import ConfigError
from cabe.i18n import t

#: Formats in detection order (the most specific content markers first).
FORMATS: tuple[str, ...] = (
    "torchtune",
    "accelerate",
    "deepspeed",
    "axolotl",
    "llama_factory",
    "unsloth",
    "training_args",
    "peft_config",
    "bnb",
    "requirements",
)

#: File-name hints, used when the content says nothing.
NAME_HINTS = (
    ("adapter_config", "peft_config"),
    ("ds_config", "deepspeed"),
    ("deepspeed", "deepspeed"),
    ("zero", "deepspeed"),
    ("accelerate", "accelerate"),
    ("fsdp", "accelerate"),
    ("axolotl", "axolotl"),
    ("bnb", "bnb"),
    ("quant", "bnb"),
    ("training_args", "training_args"),
    ("sft", "training_args"),
)

#: Request fields one format decides when several files set them: an ``optimizer`` block in the
#: DeepSpeed config replaces TrainingArguments' ``optim`` (the HF Trainer does the same).
PRECEDENCE = {"optimizer": "deepspeed"}
#: Fields that go with a decided field (TrainingArguments' fused AdamW goes with its optim).
COMPANIONS = {"optimizer": ("optimizer_impl",)}

ALIASES = {
    "peft": "peft_config",
    "lora": "peft_config",
    "trainingarguments": "training_args",
    "sftconfig": "training_args",
    "trl": "training_args",
    "transformers": "training_args",
    "bitsandbytes": "bnb",
    "ds": "deepspeed",
    "fsdp": "accelerate",
    "llamafactory": "llama_factory",
    "lf": "llama_factory",
}


def module(fmt: str) -> ModuleType:
    name = ALIASES.get(fmt.lower().replace("-", "_"), fmt.lower().replace("-", "_"))
    if name not in FORMATS:
        raise ConfigError("cfg_bad_format", "format", value=fmt, allowed=", ".join(FORMATS))
    return importlib.import_module(f"cabe.configs.{name}")


def detect(data: Mapping[str, Any], filename: str | None = None) -> str:
    """The format of a parsed config, from its keys; the file name only when the keys are silent."""
    for fmt in FORMATS:
        if module(fmt).looks_like(data):
            return fmt
    base = os.path.basename(filename or "").lower()
    for hint, fmt in NAME_HINTS:
        if hint in base:
            return fmt
    raise ConfigError("cfg_unknown_format", "file", path=filename or "<dict>", allowed=", ".join(FORMATS))


def _check_format(data: Mapping[str, Any], asked: str, path: str) -> None:
    """``--format torchtune`` on a file whose content says it is another format: refuse it
    (``cfg_format_mismatch``) rather than read it as the wrong one and drop every key."""
    for other in FORMATS:
        if other != asked and module(other).looks_like(data):
            raise ConfigError("cfg_format_mismatch", "format", path=path, value=asked, detected=other)


@dataclass
class Source:
    """One config read: where from, which format, what it maps to, what it used and ignored."""

    path: str
    format: str
    fields: dict[str, Any]
    used: list[str]
    ignored: list[tuple[str, str]]
    origin: dict[str, str] = field(default_factory=dict)

    def drop(self, request_field: str, reason: str = "overridden") -> None:
        """Another file decides ``request_field``: move its source field from used to ignored."""
        src = self.origin.get(request_field)
        self.fields.pop(request_field, None)
        if src and src in self.used:
            self.used.remove(src)
            self.ignored.append((src, reason))


@dataclass
class Combined:
    """Several sources merged into one request, plus the bookkeeping ``--json`` shows."""

    request: dict[str, Any]
    sources: list[Source]
    overridden: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)

    def to_json(self, lang: str = "en") -> dict[str, Any]:
        return {
            "files": [{"path": s.path, "format": s.format} for s in self.sources],
            "used": [{"file": s.path, "field": u} for s in self.sources for u in s.used],
            "ignored": [
                {"file": s.path, "field": f, "reason": r, "message": t("from_config.reason." + r, lang)}
                for s in self.sources
                for f, r in s.ignored
            ],
            "request": {k: list(v) if isinstance(v, tuple) else v for k, v in self.request.items()},
            "overridden": list(self.overridden),
            "defaults": list(self.defaults),
        }


def read_source(item: Any, fmt: str | None = None) -> Source:
    """Read one file (a path, a :class:`ConfigText` or a dict) and map it."""
    path = "<dict>" if isinstance(item, Mapping) else item.name if isinstance(item, ConfigText) else str(item)
    data = _base.read(item)
    name = (fmt and module(fmt).FORMAT) or detect(data, path)
    mod = module(name)
    if fmt and not mod.looks_like(data):
        _check_format(data, name, path)
    if hasattr(mod, "read") and not isinstance(item, Mapping):
        data = mod.read(item)
    c = mod.collect(data)
    fields_, used, ignored = c.result()
    return Source(path=path, format=name, fields=fields_, used=used, ignored=ignored, origin=dict(c.origin))


def combine(sources: Sequence[Source], overrides: Mapping[str, Any] | None = None) -> Combined:
    """Merge the sources' fields into one request; command-line ``overrides`` win."""
    _apply_precedence(sources)
    merged = _merge(sources)
    _settle_precision(merged)
    overridden: list[str] = []
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if k in merged and merged[k] != v:
            overridden.append(k)
        merged[k] = v
    return Combined(request=merged, sources=list(sources), overridden=overridden, defaults=_defaults(merged))


def _apply_precedence(sources: Sequence[Source]) -> None:
    """Where the format that decides a field (``PRECEDENCE``) sets it, the other files drop it."""
    for field_, fmt in PRECEDENCE.items():
        if any(s.format == fmt and field_ in s.fields for s in sources):
            for s in sources:
                if s.format != fmt and field_ in s.fields:
                    for f in (field_,) + COMPANIONS.get(field_, ()):
                        s.drop(f)


_CONFLICT = object()


def _merge(sources: Sequence[Source]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for s in sources:
        for k, v in s.fields.items():
            if k not in merged:
                merged[k], origin[k] = v, s.path
                continue
            old = merged[k]
            if old == v:
                continue
            new = _reconcile(k, old, v)
            if new is _CONFLICT:
                raise ConfigError(
                    "cfg_conflict", k, first=_show(old), first_file=origin[k], second=_show(v), second_file=s.path
                )
            merged[k] = new
    return merged


def _reconcile(k: str, old: Any, v: Any) -> Any:
    """The merged value when two files give ``k`` different values; ``_CONFLICT`` when they clash."""
    if k == "method" and {old, v} == {"lora", "qlora"}:
        return "qlora"
    if k == "precision" and _family(old) == _family(v):
        return old if "amp" not in str(old) else v  # a pure form wins; the method may change it below
    if k == "shard" and "ddp" in (old, v):
        return v if old == "ddp" else old  # "several GPUs" + a sharding strategy: the strategy
    return _CONFLICT


def _settle_precision(merged: dict[str, Any]) -> None:
    """Turn what the files say into the two axes transformers has (``dtype``, ``autocast``).

    The readers give ``precision`` the way each tool speaks: the Trainer's ``bf16=True`` / ``fp16=True``
    (and DeepSpeed's, accelerate's ``mixed_precision``) is autocast — ``bf16-amp`` / ``fp16-amp`` here —
    and the weights' dtype (``torch_dtype`` / ``dtype``, or the model itself for the callback) is
    ``_dtype``; torchtune's and axolotl's pure forms are 16-bit weights without autocast. Unsaid, the
    weights are ``auto`` (the checkpoint's, as transformers 5 loads them).
    """
    dtype = merged.pop("_dtype", None)
    prec = merged.pop("precision", None)
    shard = str(merged.get("shard", "none"))
    engine = merged.pop("_engine", None) or ("deepspeed" if shard.startswith("zero") else "fsdp")
    if prec in schema.PRECISIONS:
        implied_dtype, autocast = schema.PRECISIONS[prec]
        merged["autocast"] = autocast
        if prec.endswith("-amp") and shard.startswith(("zero", "fsdp")):
            _engine_precision(merged, engine, autocast, dtype)
        else:
            # "X-amp" says only that autocast is on: the weights are what was loaded (auto when unsaid)
            merged["dtype"] = dtype or (implied_dtype if not prec.endswith("-amp") else "auto")
    elif dtype is not None:
        merged["dtype"] = dtype
    if merged.get("method") == "qlora" and "compute_dtype" not in merged:
        half = next((v for v in (merged.get("autocast"), merged.get("dtype")) if v in ("bf16", "fp16")), None)
        if half:
            merged["compute_dtype"] = half


def _engine_precision(merged: dict[str, Any], engine: str, half: str, dtype: str | None) -> None:
    """bf16 / fp16 under a sharding engine is that engine's mixed precision (``param_dtype``):

    * FSDP through accelerate (1.16): ``MixedPrecision(Policy)(param_dtype=half)``, the trainable
      parameters upcast to fp32 (``utils/fsdp_utils.py:800-806``; FSDP1 ``accelerator.py:1969-2010``), the
      frozen ones left as loaded, and autocast around forward (``accelerator.py:1791-1799``).
    * DeepSpeed: the module cast to 16-bit, fp32 master partitions; accelerate turns its autocast off
      under DeepSpeed (``accelerator.py:556-559``: ``native_amp`` only outside DEEPSPEED / MEGATRON_LM).
    """
    merged["param_dtype"] = half
    if engine == "deepspeed":
        merged["autocast"] = "none"
    # the trainable weights are fp32 masters; under LoRA / prompt tuning the frozen base stays as loaded
    trains_base = merged.get("method", "full") in ("full", "freeze")
    merged["dtype"] = "fp32" if trains_base else (dtype or "auto")


def _defaults(merged: Mapping[str, Any]) -> list[str]:
    """The request fields cabe will fill with its defaults."""
    defaults: list[str] = []
    if "seq" not in merged:
        defaults.append("seq")
    if "model" not in merged and "config" not in merged:
        defaults.append("model")
    if merged.get("shard", "none") != "none" and "gpus" not in merged:
        defaults.append("gpus")
    return defaults


def from_files(items: Sequence[Any], *, fmt: str | None = None, overrides: Mapping[str, Any] | None = None) -> Combined:
    """Read, detect, map and merge several configs (paths or dicts)."""
    if not items:
        raise ConfigError("cfg_no_files", "file")
    return combine([read_source(i, fmt) for i in items], overrides)


def _family(precision: Any) -> str:
    return str(precision).replace("-amp", "")


def _show(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
