"""A DeepSpeed config JSON (``ds_config.json``), ``"auto"`` values included."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe import optimizer
from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "deepspeed"
TITLE = "DeepSpeed config"

STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
#: zero_optimization fields that change memory but are not in cabe's model.
NOT_MODELED = {
    "reduce_bucket_size",
    "allgather_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_param_persistence_threshold",
    "sub_group_size",
    "contiguous_gradients",
    "overlap_comm",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "prefetch_bucket_size",
    "max_live_parameters",
    "max_reuse_distance",
    "param_persistence_threshold",
    "round_robin_gradients",
    "offload_optimizer.ratio",
}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    return bool(
        set(data)
        & {
            "zero_optimization",
            "train_micro_batch_size_per_gpu",
            "train_batch_size",
            "zero_allow_untested_optimizer",
            "steps_per_print",
        }
    )


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    bf = _enabled(data.get("bf16") or data.get("bfloat16"))
    fp = _enabled(data.get("fp16"))
    if bf is True and fp is True:
        raise ConfigError(
            "cfg_contradiction",
            "precision",
            first="bf16.enabled",
            second="fp16.enabled",
            source="bf16.enabled, fp16.enabled",
        )
    numbers: dict[str, int] = {}
    for key, value in data.items():
        if key in COUNTS:
            _count(c, key, value, numbers)
        else:
            HANDLERS.get(key, _unmapped)(c, key, value)
    _world(c, numbers)
    return c


def _unmapped(c: Collector, key: str, value: Any) -> None:
    c.ignore(key, "auto" if _base.is_auto(value) else "no_effect")


def _precision(c: Collector, key: str, value: Any) -> None:
    on = _enabled(value)
    name = f"{key}.enabled"
    if on == "auto":
        c.ignore(name, "auto")
    elif on:
        c.set("precision", "fp16-amp" if key == "fp16" else "bf16-amp", name)
        c.fields["_engine"] = "deepspeed"  # DeepSpeed's own bf16 / fp16 mode, not autocast
    else:
        c.use(name)
    if isinstance(value, Mapping):
        for k in value:
            if k != "enabled":
                c.ignore(f"{key}.{k}", "no_effect")


def _count(c: Collector, key: str, value: Any, numbers: dict[str, int]) -> None:
    """A batch count: kept in ``numbers`` for :func:`_world`, and mapped when ``COUNTS`` names a field."""
    if _base.is_auto(value):
        c.ignore(key, "auto")
    elif value is None:
        c.ignore(key, "null")
    else:
        numbers[key] = _base.as_int(value, key)
        field = COUNTS[key]
        if field:
            c.set(field, numbers[key], key)
        else:
            c.use(key)


def _world(c: Collector, numbers: Mapping[str, int]) -> None:
    """train_batch_size = micro-batch × accumulation × data-parallel world size."""
    if not {"train_batch_size", "train_micro_batch_size_per_gpu"} <= set(numbers):
        return
    per_step = numbers["train_micro_batch_size_per_gpu"] * numbers.get("gradient_accumulation_steps", 1)
    world, rest = divmod(numbers["train_batch_size"], per_step)
    if rest or world < 1:
        raise ConfigError(
            "cfg_contradiction",
            "gpus",
            first=f"train_batch_size {numbers['train_batch_size']}",
            second=f"micro-batch × accumulation {per_step}",
            source="train_batch_size",
        )
    c.set("gpus", world, "train_batch_size")


def _activation_checkpointing(c: Collector, key: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        _unmapped(c, key, value)
        return
    for k in value:
        c.ignore(f"{key}.{k}", "not_modeled" if value[k] else "no_effect")


def _optimizer(c: Collector, key: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        _unmapped(c, key, value)
        return
    kind = str(value.get("type", "")).lower()
    opt = optimizer.from_deepspeed(kind)
    c.set_known("optimizer", opt, "optimizer.type")
    for k in value:
        if k != "type":
            c.ignore(f"optimizer.{k}", "no_effect")


def _enabled(block: Any) -> Any:
    if block is None:
        return None
    if isinstance(block, Mapping):
        v = block.get("enabled")
    else:
        v = block
    if _base.is_auto(v):
        return "auto"
    return _base.as_bool(v, "enabled") if v is not None else None


def shard_for_stage(value: Any, name: str) -> str:
    """A ZeRO stage (0..3) -> cabe's ``shard``; any other number is ``cfg_bad_value``."""
    stage = _base.as_int(value, name)
    if stage not in STAGES:
        raise ConfigError("cfg_bad_value", name, value=str(value), expected="0, 1, 2 or 3")
    return STAGES[stage]


def _zero(c: Collector, z: Mapping[str, Any]) -> None:
    offloaded: set[str] = set()  # "optimizer", "parameters"
    for key, value in z.items():
        name = f"zero_optimization.{key}"
        if key == "stage":
            c.set("shard", shard_for_stage(value, name), name)
        elif key in OFFLOADS:
            if _offload_block(c, name, value):
                offloaded.add(OFFLOADS[key])
        elif key in OLD_OFFLOADS:  # deprecated spellings
            if _base.as_bool(value, name):
                offloaded.add(OLD_OFFLOADS[key])
            c.use(name)
        elif _base.is_auto(value):
            c.ignore(name, "auto")
        elif key in NOT_MODELED:
            c.ignore(name, "not_modeled")
        else:
            c.ignore(name, "no_effect")
    if offloaded:
        c.fields["offload"] = "both" if len(offloaded) == 2 else offloaded.pop()


def _offload_block(c: Collector, name: str, value: Any) -> bool:
    """``offload_optimizer`` / ``offload_param``: True when its device is the CPU or NVMe."""
    device = str(value.get("device", "none")).lower() if isinstance(value, Mapping) else str(value).lower()
    c.use(f"{name}.device")
    if isinstance(value, Mapping):
        for k in value:
            if k != "device":
                c.ignore(
                    f"{name}.{k}",
                    "not_modeled" if k in ("ratio", "buffer_count", "buffer_size") else "no_effect",
                )
    return device in ("cpu", "nvme")


#: Batch counts -> the request field each sets (train_batch_size only yields the world size).
COUNTS: dict[str, str | None] = {
    "train_micro_batch_size_per_gpu": "batch",
    "gradient_accumulation_steps": "grad_accum",
    "train_batch_size": None,
}
#: zero_optimization offload blocks (and their deprecated on/off spellings) -> what they offload.
OFFLOADS = {"offload_optimizer": "optimizer", "offload_param": "parameters"}
OLD_OFFLOADS = {"cpu_offload": "optimizer", "cpu_offload_params": "parameters"}
#: Top-level keys and their readers (any other key is ignored).
HANDLERS: dict[str, Callable[[Collector, str, Any], None]] = {
    "bf16": _precision,
    "bfloat16": _precision,
    "fp16": _precision,
    "zero_optimization": lambda c, key, value: _zero(c, value if isinstance(value, Mapping) else {}),
    "activation_checkpointing": _activation_checkpointing,
    "optimizer": _optimizer,
}
