"""A DeepSpeed config JSON (``ds_config.json``), ``"auto"`` values included."""

from __future__ import annotations

from collections.abc import Mapping
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
        if key in ("bf16", "bfloat16", "fp16"):
            on = _enabled(value)
            name = f"{key}.enabled"
            if on == "auto":
                c.ignore(name, "auto")
            elif on:
                c.set("precision", "fp16-amp" if key == "fp16" else "bf16-amp", name)
            else:
                c.use(name)
            if isinstance(value, Mapping):
                for k in value:
                    if k != "enabled":
                        c.ignore(f"{key}.{k}", "no_effect")
        elif key == "zero_optimization":
            _zero(c, value if isinstance(value, Mapping) else {})
        elif key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
            if _base.is_auto(value):
                c.ignore(key, "auto")
            elif value is None:
                c.ignore(key, "null")
            else:
                numbers[key] = _base.as_int(value, key)
                if key == "train_micro_batch_size_per_gpu":
                    c.set("batch", numbers[key], key)
                elif key == "gradient_accumulation_steps":
                    c.set("grad_accum", numbers[key], key)
                else:
                    c.use(key)
        elif key == "activation_checkpointing" and isinstance(value, Mapping):
            for k in value:
                c.ignore(f"{key}.{k}", "not_modeled" if value[k] else "no_effect")
        elif key == "optimizer" and isinstance(value, Mapping):
            kind = str(value.get("type", "")).lower()
            opt = optimizer.from_deepspeed(kind)
            if opt is None:
                c.ignore("optimizer.type", "unsupported_value")
            else:
                c.set("optimizer", opt, "optimizer.type")
            for k in value:
                if k != "type":
                    c.ignore(f"optimizer.{k}", "no_effect")
        else:
            c.ignore(key, "auto" if _base.is_auto(value) else "no_effect")
    # train_batch_size = micro-batch × accumulation × data-parallel world size
    if {"train_batch_size", "train_micro_batch_size_per_gpu"} <= set(numbers):
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
    return c


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


def _zero(c: Collector, z: Mapping[str, Any]) -> None:
    opt_off = par_off = False
    for key, value in z.items():
        name = f"zero_optimization.{key}"
        if key == "stage":
            stage = _base.as_int(value, name)
            if stage not in STAGES:
                raise ConfigError("cfg_bad_value", name, value=str(value), expected="0, 1, 2 or 3")
            c.set("shard", STAGES[stage], name)
        elif key in ("offload_optimizer", "offload_param"):
            device = str(value.get("device", "none")).lower() if isinstance(value, Mapping) else str(value).lower()
            if device in ("cpu", "nvme"):
                if key == "offload_optimizer":
                    opt_off = True
                else:
                    par_off = True
                c.use(f"{name}.device")
            else:
                c.use(f"{name}.device")
            if isinstance(value, Mapping):
                for k in value:
                    if k != "device":
                        c.ignore(
                            f"{name}.{k}",
                            "not_modeled" if k in ("ratio", "buffer_count", "buffer_size") else "no_effect",
                        )
        elif key in ("cpu_offload", "cpu_offload_params"):  # deprecated spellings
            if _base.as_bool(value, name):
                opt_off = opt_off or key == "cpu_offload"
                par_off = par_off or key == "cpu_offload_params"
            c.use(name)
        elif _base.is_auto(value):
            c.ignore(name, "auto")
        elif key in NOT_MODELED:
            c.ignore(name, "not_modeled")
        else:
            c.ignore(name, "no_effect")
    if opt_off or par_off:
        c.fields["offload"] = "both" if opt_off and par_off else "optimizer" if opt_off else "parameters"
