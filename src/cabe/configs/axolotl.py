"""An axolotl YAML (``examples/llama-3/qlora.yml`` and the like)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.configs.accelerate import STRATEGIES
from cabe.configs.training_args import HANDLERS as TA
from cabe.configs.training_args import set_fsdp
from cabe.errors import ConfigError

FORMAT = "axolotl"
TITLE = "axolotl config"

NOT_MODELED = {
    "unsloth_lora_mlp",
    "unsloth_lora_qkv",
    "unsloth_lora_o",
    "liger_rms_norm",
    "liger_glu_activation",
    "liger_cross_entropy",
    "torch_compile",
    "lora_modules_to_save",
    "gradient_checkpointing_kwargs",
    "activation_offloading",
    "peft_use_dora",
    "lora_mlp_kernel",
    "lora_qkv_kernel",
    "lora_o_kernel",
    "unfrozen_parameters",
    "peft_layers_to_transform",
    "relora_steps",
    "load_in_8bit",
    "s2_attention",
}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    keys = set(data)
    return (
        "base_model" in keys
        or "micro_batch_size" in keys
        or "sequence_len" in keys
        or ("adapter" in keys and "datasets" in keys)
    )


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    _check(data)
    c = Collector()
    for key, value in data.items():
        if value is None or value == "":
            continue  # axolotl examples list every option with an empty value: nothing to say
        _field(c, key, value, data)
    if (
        data.get("fsdp_version") is not None
        and isinstance(data.get("fsdp_config"), Mapping)
        and "shard" not in c.fields
    ):
        c.fields["shard"] = "fsdp"
    c.fields.setdefault("recipe", "axolotl")  # an axolotl file is an axolotl run (cabe/data/recipes/axolotl.json)
    return c


def _adapter(data: Mapping[str, Any]) -> Any:
    """The ``adapter`` as cabe reads it: axolotl's adapter lora + load_in_4bit is QLoRA."""
    adapter = data.get("adapter")
    if adapter == "lora" and bool(data.get("load_in_4bit")):
        return "qlora"
    return adapter


def _check(data: Mapping[str, Any]) -> None:
    adapter = _adapter(data)
    if adapter not in (None, "", "lora", "qlora"):
        raise ConfigError("cfg_unsupported", "adapter", value=str(adapter), allowed="lora, qlora")
    if adapter == "qlora" and data.get("load_in_4bit") is False:
        raise ConfigError(
            "cfg_contradiction",
            "method",
            first="adapter: qlora",
            second="load_in_4bit: false",
            source="adapter, load_in_4bit",
        )
    if data.get("bf16") is True and data.get("fp16") is True:
        raise ConfigError("cfg_contradiction", "precision", first="bf16", second="fp16", source="bf16, fp16")


def _field(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if c.convert(FIELDS, key, value) or c.flag(FLAGS, key, value):
        return
    handler = HANDLERS.get(key)
    if handler is not None:
        handler(c, key, value, data)
    else:
        _unmapped(c, key, value)


def _unmapped(c: Collector, key: str, value: Any) -> None:
    if key in NOT_MODELED and not (value is False or value == [] or value == {}):
        c.ignore(key, "not_modeled")
    else:
        c.ignore(key, "no_effect")


def _checkpointing(value: Any, key: str) -> bool:
    return value if isinstance(value, bool) else str(value).lower() not in ("false", "no", "0")


def _gradient_checkpointing(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``true``, or ``offload`` / ``unsloth``: checkpointing whose layer inputs go to the host (axolotl's
    ``Unsloth_Offloaded_Gradient_Checkpointer``, src/axolotl/utils/gradient_checkpointing/__init__.py)."""
    on = _checkpointing(value, key)
    c.set("checkpointing", on, key)
    if on and str(value).lower() in ("offload", "unsloth"):
        c.set("offload_activations", True, key)


def _activation_offloading(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``activation_offloading: true``: axolotl's ActivationOffloadingMixin (TRL's OffloadActivations around
    checkpointed layers); modelled as the layers' inputs on the host."""
    on = _checkpointing(value, key)
    c.set("offload_activations", on, key)
    if on:
        c.set("checkpointing", True, key)


def _checkpointing_kwargs(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``gradient_checkpointing_kwargs``: the Trainer's (every_n_layers, offload, use_reentrant)."""
    TA["gradient_checkpointing_kwargs"](c, key, value, data)


def _method(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    c.set("method", _adapter(data), key)


def _load_in_4bit(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if value:
        c.set("method", "qlora", key)
    else:
        c.use(key)


def _target_modules(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if data.get("lora_target_linear") is True:
        c.ignore(key, "overridden")
    else:
        c.set("lora_targets", _base.as_targets(value, key), key)


def _precision(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if value is True or _base.is_auto(value):  # bf16: auto = bf16 where the GPU has it
        pure = _adapter(data) is not None
        c.set("precision", (key if pure else f"{key}-amp"), key)
    else:
        c.use(key)


def _fsdp_config(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if not isinstance(value, Mapping):
        _unmapped(c, key, value)
        return
    for k, v in value.items():
        name = f"fsdp_config.{k}"
        kk = k.removeprefix("fsdp_")
        if v is None:
            continue
        if c.flag(FSDP_FLAGS, kk, v, name) or c.convert(FSDP_FIELDS, kk, v, name):
            continue
        if kk == "sharding_strategy":
            c.set_known("shard", STRATEGIES.get(str(v).upper()), name)
        elif kk == "reshard_after_forward":
            _reshard(c, name, v)
        else:
            c.ignore(name, "no_effect")


def _reshard(c: Collector, name: str, v: Any) -> None:
    """FSDP2's ``reshard_after_forward`` (a bool, passed through accelerate)."""
    c.fields.setdefault("shard", "fsdp")
    c.set("reshard_after_forward", _base.as_bool(v, name), name)


#: Keys that map to one request field through a converter.
FIELDS: dict[str, _base.Field] = {
    "base_model": ("model", _base.as_model),
    "lora_r": ("lora_rank", _base.as_int),
    "lora_alpha": ("lora_alpha", _base.as_number),
    "lora_dropout": ("lora_dropout", _base.as_number),
    "peft_use_dora": ("dora", _base.as_bool),
    "sequence_len": ("seq", _base.as_int),
    "micro_batch_size": ("batch", _base.as_int),
    "gradient_accumulation_steps": ("grad_accum", _base.as_int),
}
#: On/off keys: the request field and its value when on.
FLAGS: dict[str, _base.Flag] = {
    "lora_target_linear": ("lora_targets", ("all-linear",)),
    "flash_attention": ("attention", "flash"),
    "sdp_attention": ("attention", "sdpa"),
    "eager_attention": ("attention", "eager"),
    # the loss plugins (axolotl/integrations/cut_cross_entropy/args.py:33, liger/args.py:59)
    "cut_cross_entropy": ("loss", "cce"),
    "liger_fused_linear_cross_entropy": ("loss", "liger"),
}
#: ``fsdp_config`` keys (without their ``fsdp_`` prefix).
FSDP_FLAGS: dict[str, _base.Flag] = {"offload_params": ("offload", "both")}
FSDP_FIELDS: dict[str, _base.Field] = {"activation_checkpointing": ("checkpointing", _base.as_bool)}


#: Keys that need more than a table entry.
def _context_parallel(c: Collector, key: str, value: Any) -> None:
    n = _base.as_int(value, key)
    if n > 1:
        c.set("cp", n, key)
    else:
        c.use(key)


HANDLERS: dict[str, Callable[[Collector, str, Any, Mapping[str, Any]], None]] = {
    "adapter": _method,
    "load_in_4bit": _load_in_4bit,
    "lora_target_modules": _target_modules,
    "bf16": _precision,
    "fp16": _precision,
    "optimizer": lambda c, key, value, data: _base.set_hf_optimizer(c, key, value),
    "deepspeed": lambda c, key, value, data: c.ignore(key, "other_file"),
    "fsdp": lambda c, key, value, data: set_fsdp(c, key, value),
    "fsdp_version": lambda c, key, value, data: c.use(key),
    "fsdp_config": _fsdp_config,
    "gradient_checkpointing": _gradient_checkpointing,
    "activation_offloading": _activation_offloading,
    "gradient_checkpointing_kwargs": _checkpointing_kwargs,
    # multipack: rows of sequence_len holding several samples, told apart by position_ids
    # axolotl's context parallelism (``context_parallel_size``; ``sequence_parallel_degree`` before it was renamed):
    # ring-flash-attn over the group, whose default ``varlen_llama3`` ring all-gathers the keys and values as torch's
    # ``allgather`` rotation does (cabe.parallel.context)
    "context_parallel_size": lambda c, key, value, data: _context_parallel(c, key, value),
    "sequence_parallel_degree": lambda c, key, value, data: _context_parallel(c, key, value),
    "sample_packing": lambda c, key, value, data: (
        c.set("packing", "packed", key) if _checkpointing(value, key) else c.use(key)
    ),
}
