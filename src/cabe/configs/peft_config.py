"""PEFT ``adapter_config.json`` / a ``LoraConfig`` (``PromptTuningConfig``) as a dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "peft_config"
TITLE = "PEFT adapter config"

NOT_MODELED = {
    "layers_to_transform",
    "rank_pattern",
    "alpha_pattern",
    "layer_replication",
    "trainable_token_indices",
    "loftq_config",
    "target_parameters",
}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    return "peft_type" in data or ("r" in data and ("target_modules" in data or "lora_alpha" in data))


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    peft_type = str(data.get("peft_type") or "LORA").upper()
    peft_type = peft_type.split(".")[-1]  # "PeftType.LORA"
    if peft_type not in BY_TYPE:
        raise ConfigError("cfg_unsupported", "peft_type", value=peft_type, allowed="LORA, PROMPT_TUNING")
    for key, value in data.items():
        if key == "peft_type":
            c.set("method", "lora" if peft_type == "LORA" else "prompt-tuning", key)
        elif key == "base_model_name_or_path":
            if value:
                c.set("model", _base.model_name(value), key)
            else:
                c.ignore(key, "null")
        else:
            BY_TYPE[peft_type].get(key, _unmapped)(c, key, value)
    return c


def _unmapped(c: Collector, key: str, value: Any) -> None:
    if key in NOT_MODELED:
        if value in (None, False, {}, []):
            c.ignore(key, "null" if value is None else "no_effect")
        else:
            c.ignore(key, "not_modeled")
    elif key == "bias" and value not in (None, "none"):
        c.ignore(key, "not_modeled")
    else:
        c.ignore(key, "no_effect")


def _rank(c: Collector, key: str, value: Any) -> None:
    c.set("lora_rank", _base.as_int(value, key), key)
    c.set("method", "lora", key)


def _modules_to_save(c: Collector, key: str, value: Any) -> None:
    """Whole modules trained beside the adapters (cabe.method.saved_modules says which cabe models)."""
    if value in (None, []):
        c.ignore(key, "null" if value is None else "no_effect")
    else:
        c.set("modules_to_save", _base.as_targets(value, key), key)


def _target_modules(c: Collector, key: str, value: Any) -> None:
    if value is None:
        c.ignore(key, "null")  # PEFT's default for the model type: what cabe uses too
    elif isinstance(value, str):
        if value == "all-linear" or value.isidentifier():
            c.set("lora_targets", (value,), key)
        else:
            c.ignore(key, "unsupported_value")  # a regular expression
    elif isinstance(value, (list, tuple, set, frozenset)) and value and all(isinstance(t, str) for t in value):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        c.set("lora_targets", tuple(items), key)
    else:  # a number, a mapping, an empty list, a list of numbers: PEFT itself would refuse it
        raise ConfigError("cfg_bad_value", key, value=_base._show(value), expected="a list of module names")


#: The keys each PEFT type reads (any other key goes to :func:`_unmapped`).
BY_TYPE: dict[str, dict[str, Callable[[Collector, str, Any], None]]] = {
    "LORA": {
        "r": _rank,
        "lora_alpha": lambda c, key, value: c.set("lora_alpha", _base.as_number(value, key), key),
        "target_modules": _target_modules,
        "modules_to_save": _modules_to_save,
        # LoraConfig(use_dora=..., lora_dropout=...): DoRA's magnitude and products, dropout's masks and copies
        "use_dora": lambda c, key, value: c.set("dora", _base.as_bool(value, key), key),
        "lora_dropout": lambda c, key, value: c.set("lora_dropout", _base.as_number(value, key), key),
    },
    "PROMPT_TUNING": {
        "num_virtual_tokens": lambda c, key, value: c.set("prompt_tokens", _base.as_int(value, key), key),
    },
}
