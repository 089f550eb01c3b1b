"""An ``accelerate config`` YAML (``default_config.yaml``): FSDP, DeepSpeed or multi-GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "accelerate"
TITLE = "accelerate config"

#: FSDP sharding strategies, by name and by accelerate's old numbering (1..5).
STRATEGIES = {
    "FULL_SHARD": "fsdp",
    "SHARD_GRAD_OP": "zero2",
    "NO_SHARD": "ddp",
    "HYBRID_SHARD": "fsdp-hybrid",
    "1": "fsdp",
    "2": "zero2",
    "3": "ddp",
    "4": "fsdp-hybrid",
}
PRECISION = {"bf16": "bf16-amp", "fp16": "fp16-amp", "no": "fp32", "fp8": None}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    return (
        "distributed_type" in data
        or "compute_environment" in data
        or ("fsdp_config" in data and "num_processes" in data)
    )


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    kind = str(data.get("distributed_type", "NO")).upper()
    procs = data.get("num_processes")
    machines = data.get("num_machines")
    for key, value in data.items():
        if key == "distributed_type":
            if kind == "MULTI_GPU":
                c.set("shard", "ddp", key)
            else:
                c.use(key)
        elif key == "num_processes":
            n = _base.as_int(value, key)
            if n > 1:
                c.set("gpus", n, key)
            else:
                c.use(key)
        elif key == "num_machines":
            m = _base.as_int(value, key)
            if m > 1 and procs is not None:
                per, rest = divmod(_base.as_int(procs, "num_processes"), m)
                if rest or per < 1:
                    raise ConfigError(
                        "cfg_contradiction",
                        "gpus_per_node",
                        first=f"num_processes {procs}",
                        second=f"num_machines {m}",
                        source=key,
                    )
                c.set("gpus_per_node", per, key)
            else:
                c.use(key)
        elif key == "mixed_precision":
            p = PRECISION.get(str(value).lower())
            if p is None:
                c.ignore(key, "unsupported_value")
            else:
                c.set("precision", p, key)
        elif key == "fsdp_config" and isinstance(value, Mapping):
            if kind == "FSDP":
                _fsdp(c, value)
            else:
                for k in value:
                    c.ignore(f"{key}.{k}", "no_effect")
        elif key == "deepspeed_config" and isinstance(value, Mapping):
            if kind == "DEEPSPEED":
                _deepspeed(c, value)
            else:
                for k in value:
                    c.ignore(f"{key}.{k}", "no_effect")
        elif key == "use_cpu" and value:
            c.ignore(key, "not_modeled")
        else:
            c.ignore(key, "null" if value is None else "no_effect")
    del machines
    return c


def _fsdp(c: Collector, f: Mapping[str, Any]) -> None:
    version = f.get("fsdp_version", 1)
    has_strategy = "fsdp_sharding_strategy" in f
    if not has_strategy:
        c.fields.setdefault("shard", "fsdp")
    for key, value in f.items():
        name = f"fsdp_config.{key}"
        if key == "fsdp_sharding_strategy":
            s = STRATEGIES.get(str(value).upper())
            if s is None:
                c.ignore(name, "unsupported_value")
                c.fields.setdefault("shard", "fsdp")
            else:
                c.set("shard", s, name)
        elif key == "fsdp_reshard_after_forward":
            # FSDP2: True = FULL_SHARD, False = SHARD_GRAD_OP; FSDP1 may spell a strategy here too
            text = str(value).upper()
            if text in STRATEGIES:
                c.set("shard", STRATEGIES[text], name)
            elif not has_strategy:
                c.fields.pop("shard", None)
                c.set("shard", "fsdp" if _base.as_bool(value, name) else "zero2", name)
            else:
                c.ignore(name, "no_effect")
        elif key == "fsdp_offload_params":
            if _base.as_bool(value, name):
                c.set("offload", "both", name)  # FSDP CPU offload moves parameters, gradients and optimizer state
            else:
                c.use(name)
        elif key == "fsdp_activation_checkpointing":
            c.set("checkpointing", _base.as_bool(value, name), name)
        elif key in (
            "fsdp_backward_prefetch",
            "fsdp_forward_prefetch",
            "fsdp_auto_wrap_policy",
            "fsdp_transformer_layer_cls_to_wrap",
            "fsdp_min_num_params",
        ):
            c.ignore(name, "not_modeled")
        elif key == "fsdp_version":
            c.use(name) if version in (1, 2, "1", "2") else c.ignore(name, "unsupported_value")
        else:
            c.ignore(name, "no_effect")


def _deepspeed(c: Collector, d: Mapping[str, Any]) -> None:
    for key, value in d.items():
        name = f"deepspeed_config.{key}"
        if key == "zero_stage":
            from cabe.configs.deepspeed import STAGES

            stage = _base.as_int(value, name)
            if stage not in STAGES:
                raise ConfigError("cfg_bad_value", name, value=str(value), expected="0, 1, 2 or 3")
            c.set("shard", STAGES[stage], name)
        elif key in ("offload_optimizer_device", "offload_param_device"):
            c.use(name)
        elif key == "gradient_accumulation_steps":
            if _base.is_auto(value):
                c.ignore(name, "auto")
            else:
                c.set("grad_accum", _base.as_int(value, name), name)
        elif key == "deepspeed_config_file":
            c.ignore(name, "other_file")
        else:
            c.ignore(name, "no_effect")
    opt = str(d.get("offload_optimizer_device", "none")).lower() in ("cpu", "nvme")
    par = str(d.get("offload_param_device", "none")).lower() in ("cpu", "nvme")
    if opt or par:
        c.fields["offload"] = "both" if opt and par else "optimizer" if opt else "parameters"
