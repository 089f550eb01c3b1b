"""An axolotl YAML (``examples/llama-3/qlora.yml`` and the like)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.configs.training_args import fsdp_words
from cabe.errors import ConfigError

FORMAT = "axolotl"
TITLE = "axolotl config"

NOT_MODELED = {
    "sample_packing",
    "unsloth_lora_mlp",
    "unsloth_lora_qkv",
    "unsloth_lora_o",
    "liger_rms_norm",
    "liger_glu_activation",
    "liger_fused_linear_cross_entropy",
    "liger_cross_entropy",
    "torch_compile",
    "lora_modules_to_save",
    "peft_use_dora",
    "gradient_checkpointing_kwargs",
    "activation_offloading",
    "cut_cross_entropy",
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
    c = Collector()
    adapter = data.get("adapter")
    if adapter not in (None, "", "lora", "qlora"):
        raise ConfigError("cfg_unsupported", "adapter", value=str(adapter), allowed="lora, qlora")
    four = bool(data.get("load_in_4bit"))
    if adapter == "lora" and four:
        adapter = "qlora"  # axolotl: adapter lora + load_in_4bit is QLoRA
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
    pure = adapter is not None
    for key, value in data.items():
        if value is None or value == "":
            continue  # axolotl examples list every option with an empty value: nothing to say
        if key == "base_model":
            c.set("model", _base.model_name(value), key)
        elif key == "adapter":
            c.set("method", adapter, key)
        elif key == "load_in_4bit":
            if four:
                c.set("method", "qlora", key)
            else:
                c.use(key)
        elif key == "lora_r":
            c.set("lora_rank", _base.as_int(value, key), key)
        elif key == "lora_alpha":
            c.set("lora_alpha", _base.as_number(value, key), key)
        elif key == "lora_target_linear":
            if _base.as_bool(value, key):
                c.set("lora_targets", ("all-linear",), key)
            else:
                c.use(key)
        elif key == "lora_target_modules":
            if data.get("lora_target_linear") is True:
                c.ignore(key, "overridden")
            else:
                c.set("lora_targets", tuple(str(t) for t in ([value] if isinstance(value, str) else value)), key)
        elif key == "sequence_len":
            c.set("seq", _base.as_int(value, key), key)
        elif key == "micro_batch_size":
            c.set("batch", _base.as_int(value, key), key)
        elif key == "gradient_accumulation_steps":
            c.set("grad_accum", _base.as_int(value, key), key)
        elif key == "gradient_checkpointing":
            on = value if isinstance(value, bool) else str(value).lower() not in ("false", "no", "0")
            c.set("checkpointing", on, key)  # "unsloth" / "offload" also checkpoint
        elif key in ("bf16", "fp16"):
            if value is True or _base.is_auto(value):  # bf16: auto = bf16 where the GPU has it
                c.set("precision", (key if pure else f"{key}-amp"), key)
            else:
                c.use(key)
        elif key == "optimizer":
            opt = _base.optimizer_from_hf(value)
            if opt is None:
                c.ignore(key, "unsupported_value")
            else:
                c.set("optimizer", opt[0], key)
                if opt[1]:
                    c.set("optimizer_impl", opt[1], key)
        elif key == "flash_attention":
            c.set("attention", "flash", key) if _base.as_bool(value, key) else c.use(key)
        elif key == "sdp_attention":
            c.set("attention", "sdpa", key) if _base.as_bool(value, key) else c.use(key)
        elif key == "eager_attention":
            c.set("attention", "eager", key) if _base.as_bool(value, key) else c.use(key)
        elif key == "deepspeed":
            c.ignore(key, "other_file")
        elif key == "fsdp":
            shard, offload = fsdp_words(value)
            if shard:
                c.set("shard", shard, key)
            if offload:
                c.set("offload", offload, key)
            if not shard and not offload:
                c.use(key)
        elif key == "fsdp_version":
            c.use(key)
        elif key == "fsdp_config" and isinstance(value, Mapping):
            for k, v in value.items():
                name = f"fsdp_config.{k}"
                kk = k.removeprefix("fsdp_")
                if v is None:
                    continue
                if kk == "offload_params":
                    c.set("offload", "both", name) if _base.as_bool(v, name) else c.use(name)
                elif kk == "activation_checkpointing":
                    c.set("checkpointing", _base.as_bool(v, name), name)
                elif kk == "sharding_strategy":
                    from cabe.configs.accelerate import STRATEGIES

                    s = STRATEGIES.get(str(v).upper())
                    c.set("shard", s, name) if s else c.ignore(name, "unsupported_value")
                elif kk == "reshard_after_forward":
                    if not _base.as_bool(v, name):
                        c.fields.pop("shard", None)
                        c.set("shard", "zero2", name)
                    else:
                        c.fields.setdefault("shard", "fsdp")
                        c.use(name)
                else:
                    c.ignore(name, "no_effect")
        elif key in NOT_MODELED:
            if value is False or value == [] or value == {}:
                c.ignore(key, "no_effect")
            else:
                c.ignore(key, "not_modeled")
        else:
            c.ignore(key, "no_effect")
    if (
        data.get("fsdp_version") is not None
        and isinstance(data.get("fsdp_config"), Mapping)
        and "shard" not in c.fields
    ):
        c.fields["shard"] = "fsdp"
    return c
