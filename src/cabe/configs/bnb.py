"""A ``BitsAndBytesConfig`` as a dict (``BitsAndBytesConfig(...).to_dict()``, or the
``quantization_config`` block of a quantized model's config.json)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "bnb"
TITLE = "BitsAndBytesConfig"


def read(path_or_dict: Any) -> Mapping[str, Any]:
    data = _base.read(path_or_dict)
    if isinstance(data.get("quantization_config"), Mapping) and "load_in_4bit" not in data:
        return dict(data["quantization_config"])
    return data


def looks_like(data: Mapping[str, Any]) -> bool:
    keys = set(data)
    return (
        bool(keys & {"load_in_4bit", "_load_in_4bit", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype"})
        or data.get("quant_method") == "bitsandbytes"
    )


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    four = data.get("load_in_4bit", data.get("_load_in_4bit"))
    eight = data.get("load_in_8bit", data.get("_load_in_8bit"))
    four = _base.as_bool(four, "load_in_4bit") if four is not None else False
    eight = _base.as_bool(eight, "load_in_8bit") if eight is not None else False
    if four and eight:
        raise ConfigError(
            "cfg_contradiction",
            "quant",
            first="load_in_4bit",
            second="load_in_8bit",
            source="load_in_4bit, load_in_8bit",
        )
    for key, value in data.items():
        k = key.lstrip("_")
        if k == "load_in_4bit":
            if four:
                c.set("method", "qlora", key)
            else:
                c.use(key)
        elif k == "load_in_8bit":
            c.ignore(key, "not_modeled" if eight else "no_effect")
        elif not four:
            c.ignore(key, "no_effect")
        elif k == "bnb_4bit_quant_type":
            if str(value) not in ("nf4", "fp4"):
                raise ConfigError("cfg_bad_value", key, value=str(value), expected="nf4 | fp4")
            c.set("quant", str(value), key)
        elif k == "bnb_4bit_use_double_quant":
            c.set("double_quant", _base.as_bool(value, key), key)
        elif k == "bnb_4bit_compute_dtype":
            d = _base.dtype(value)
            if d is None:
                c.ignore(key, "unsupported_value")
            else:
                c.set("compute_dtype", d, key)
        elif k == "bnb_4bit_quant_storage":
            c.ignore(key, "no_effect" if str(value) in ("uint8", "torch.uint8") else "not_modeled")
        elif k.startswith("llm_int8_skip_modules") and value:
            c.ignore(key, "not_modeled")
        else:
            c.ignore(key, "no_effect")
    return c
