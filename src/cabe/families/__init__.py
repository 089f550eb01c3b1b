"""Model families: one module per family, each turning a ``config.json`` into a :class:`ModelSpec`.

A family module declares ``MODEL_TYPES`` (the ``model_type`` values it reads) and ``read(r, name)``,
which builds the spec from a :class:`~cabe.families._common.Reader` — what its layers are made of
(attention, MLP and norm kinds, fused projections, biases, tied embeddings, PEFT names and default
targets), as data. Modules are found by name in this package: adding a family is adding a module
(see CONTRIBUTING.md). Nothing here imports torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache
from types import ModuleType
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader

__all__ = ["config_dtype", "config_weights_format", "from_config", "modules", "supported_model_types"]


@cache
def modules() -> tuple[ModuleType, ...]:
    """Every family module of this package (names not starting with ``_``), sorted by name."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{n}") for n in names)


@cache
def _readers() -> dict[str, Callable[[Reader, str], ModelSpec]]:
    out: dict[str, Callable[[Reader, str], ModelSpec]] = {}
    for mod in modules():
        for model_type in mod.MODEL_TYPES:
            if model_type in out:
                raise RuntimeError(f"model_type {model_type!r} declared by two family modules")
            out[model_type] = mod.read
    return out


def supported_model_types() -> tuple[str, ...]:
    """``model_type`` values cabe reads, sorted."""
    return tuple(sorted(_readers()))


def from_config(config: Mapping[str, Any], *, name: str = "") -> ModelSpec:
    """Build a spec from a Hugging Face ``config.json`` dict. Raises :class:`ConfigError`."""
    if not isinstance(config, Mapping):
        raise ConfigError("config_not_object", "model")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("config_missing_field", "model", key="model_type")
    readers = _readers()
    if model_type not in readers:
        raise ConfigError(
            "unsupported_architecture",
            "model",
            model_type=model_type,
            allowed=", ".join(supported_model_types()),
        )
    try:
        spec = readers[model_type](Reader(config, model_type), name or str(config.get("_name_or_path", "")))
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("config_bad_value", "model", detail=str(exc)) from None
    dtype = config_dtype(config)
    return replace(spec, dtype=dtype, weights_format=config_weights_format(config) or dtype)


#: config dtype names -> cabe's
_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def config_dtype(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's dtype from a config: ``dtype`` (transformers 5) or ``torch_dtype`` (before),
    as ``fp32`` / ``bf16`` / ``fp16``; None when absent or not one of these."""
    for key in ("dtype", "torch_dtype"):
        v = config.get(key)
        if isinstance(v, str):
            return _DTYPES.get(v.removeprefix("torch."))
    return None


def config_weights_format(config: Mapping[str, Any]) -> str | None:
    """The weight format a quantized checkpoint ships in, from its ``quantization_config`` (transformers'
    quantizers read the same keys: ``quant_method``, ``bits``, ``load_in_4bit`` / ``load_in_8bit``,
    ``bnb_4bit_quant_type``), as one of :data:`cabe.weights.FORMATS`; None for an unquantized checkpoint or a
    method cabe has no format for (compressed-tensors, HQQ, ...), which is then served in its dtype."""
    q = config.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in ("mxfp4", "fp8"):  # gpt-oss's experts; DeepSeek-V3 / R1 / V3.2's e4m3 weights, 128 × 128 blocks
        return method
    if method in ("gptq", "awq"):
        bits = q.get("bits", 4)
        fmt = f"{method}-{bits}bit"
        return fmt if fmt in ("gptq-2bit", "gptq-3bit", "gptq-4bit", "gptq-8bit", "awq-4bit") else None
    if method == "bitsandbytes":
        if q.get("load_in_4bit"):
            return "fp4" if str(q.get("bnb_4bit_quant_type", "fp4")).lower() == "fp4" else "nf4"
        if q.get("load_in_8bit"):
            return "int8"
    return None
