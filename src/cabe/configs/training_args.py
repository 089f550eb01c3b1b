"""transformers ``TrainingArguments`` / TRL ``SFTConfig`` (JSON from ``args.to_json_string()``, or
the YAML ``trl sft --config`` reads, which may also carry TRL's ``ModelConfig`` fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.configs import _base
from cabe.configs._base import Collector

FORMAT = "training_args"
TITLE = "TrainingArguments / SFTConfig"

#: Fields that change GPU memory in ways cabe does not model (yet).
NOT_MODELED = {
    "torch_compile",
    "use_liger_kernel",
    "optim_target_modules",
    "optim_args",
    "ddp_bucket_cap_mb",
    "padding_free",
    "torch_empty_cache_steps",
    "activation_offloading",
    "use_dora",
    "lora_modules_to_save",
    "neftune_noise_alpha",
    "auto_find_batch_size",
    "parallelism_config",
    "completion_only_loss",
    "assistant_only_loss",
    "use_rslora",
    "tp_size",
    "fsdp_min_num_params",
    "fsdp_transformer_layer_cls_to_wrap",
}
#: Fields whose value names another file.
OTHER_FILE = {"deepspeed", "fsdp_config"}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    keys = set(data)
    return bool(
        keys
        & {
            "per_device_train_batch_size",
            "optim",
            "gradient_checkpointing",
            "output_dir",
            "max_seq_length",
            "learning_rate",
            "model_name_or_path",
        }
    )


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    fields_ = dict(data)
    bf16, fp16 = fields_.get("bf16"), fields_.get("fp16")
    if bf16 is not None and fp16 is not None and _base.as_bool(bf16, "bf16") and _base.as_bool(fp16, "fp16"):
        from cabe.errors import ConfigError

        raise ConfigError("cfg_contradiction", "precision", first="bf16", second="fp16", source="bf16, fp16")
    for key, value in fields_.items():
        if key.startswith("_"):
            continue
        if value is None:
            if key in ("max_length", "max_seq_length", "per_device_train_batch_size", "optim"):
                c.ignore(key, "null")
            continue
        if _base.is_auto(value):
            c.ignore(key, "auto")
            continue
        handled = _field(c, key, value, fields_)
        if not handled:
            c.ignore(key, "not_modeled" if key in NOT_MODELED else "no_effect")
    return c


def _field(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> bool:
    if key == "per_device_train_batch_size" or (
        key == "train_batch_size" and "per_device_train_batch_size" not in all_
    ):
        c.set("batch", _base.as_int(value, key), key)
    elif key == "gradient_accumulation_steps":
        c.set("grad_accum", _base.as_int(value, key), key)
    elif key in ("bf16", "fp16"):
        if _base.as_bool(value, key):
            c.set("precision", f"{key}-amp", key)
        else:
            c.use(key)
    elif key in ("gradient_checkpointing", "activation_checkpointing"):  # transformers 5 renamed it
        c.set("checkpointing", _base.as_bool(value, key), key)
    elif key == "optim":
        opt = _base.optimizer_from_hf(value)
        if opt is None:
            c.ignore(key, "unsupported_value")
        else:
            c.set("optimizer", opt[0], key)
            if opt[1]:
                c.set("optimizer_impl", opt[1], key)
    elif key in ("max_length", "max_seq_length"):
        c.set("seq", _base.as_int(value, key), key)
    elif key == "model_name_or_path":
        c.set("model", _base.model_name(value), key)
    elif key in ("dtype", "torch_dtype"):
        d = _base.dtype(value)
        if d is None:
            c.ignore(key, "unsupported_value")
        else:
            c.set("_dtype", d, key)  # the loaded weights' dtype; combined with bf16/fp16 later
    elif key == "attn_implementation":
        att = {
            "eager": "eager",
            "sdpa": "sdpa",
            "flash_attention_2": "flash",
            "flash_attention_3": "flash",
            "kernels-community/flash-attn": "flash",
            "kernels-community/vllm-flash-attn3": "flash",
        }.get(str(value))
        if att is None:
            c.ignore(key, "unsupported_value")
        else:
            c.set("attention", att, key)
    elif key == "use_peft":
        if _base.as_bool(value, key):
            c.set("method", "lora", key)
        else:
            c.use(key)
    elif key == "lora_r":
        c.set("lora_rank", _base.as_int(value, key), key)
    elif key == "lora_alpha":
        c.set("lora_alpha", _base.as_number(value, key), key)
    elif key == "lora_target_modules":
        targets = [value] if isinstance(value, str) else list(value)
        c.set("lora_targets", tuple(str(t) for t in targets), key)
    elif key == "load_in_4bit":
        if _base.as_bool(value, key):
            c.set("method", "qlora", key)
        else:
            c.use(key)
    elif key == "load_in_8bit":
        if _base.as_bool(value, key):
            c.ignore(key, "not_modeled")
        else:
            c.use(key)
    elif key == "bnb_4bit_quant_type":
        c.set("quant", str(value), key)
    elif key == "use_bnb_nested_quant":
        c.set("double_quant", _base.as_bool(value, key), key)
    elif key == "deepspeed":
        if isinstance(value, Mapping):
            from cabe.configs import deepspeed

            sub, used, ignored = deepspeed.to_request(value)
            for f, v in sub.items():
                c.set(f, v, key)
            c.used = [u for u in c.used if u != key] + [f"{key}.{u}" for u in used]
            c.ignored += [(f"{key}.{f}", r) for f, r in ignored]
        else:
            c.ignore(key, "other_file")
    elif key == "fsdp":
        shard, offload = fsdp_words(value)
        if shard is None and offload is None:
            c.use(key)
        if shard:
            c.set("shard", shard, key)
        if offload:
            c.set("offload", offload, key)
    elif key == "fsdp_config" and isinstance(value, Mapping):
        for k, v in value.items():
            name = f"fsdp_config.{k}"
            kk = k.removeprefix("fsdp_")
            if kk == "offload_params":
                if _base.as_bool(v, name):
                    c.set("offload", "both", name)
                else:
                    c.use(name)
            elif kk == "activation_checkpointing" and v is not None:
                c.set("checkpointing", _base.as_bool(v, name), name)
            elif kk == "reshard_after_forward" and v is not None and all_.get("fsdp"):
                if not _base.as_bool(v, name):
                    c.set("shard", "zero2", name)
                else:
                    c.use(name)
            elif v is not None:
                c.ignore(
                    name,
                    "not_modeled"
                    if kk
                    in (
                        "min_num_params",
                        "transformer_layer_cls_to_wrap",
                        "forward_prefetch",
                        "backward_prefetch",
                        "limit_all_gathers",
                    )
                    else "no_effect",
                )
    elif key in ("world_size", "n_gpu") and _base.as_int(value, key) > 1:
        c.set("gpus", _base.as_int(value, key), key)
    else:
        return False
    return True


def fsdp_words(value: Any) -> tuple[str | None, str | None]:
    """TrainingArguments ``fsdp``: ``"full_shard auto_wrap offload"`` or a list of those words."""
    words = (
        value.split() if isinstance(value, str) else [str(w) for w in value] if isinstance(value, (list, tuple)) else []
    )
    if isinstance(value, bool):
        words = ["full_shard"] if value else []
    words = [w.lower() for w in words]
    shard = None
    if "full_shard" in words:
        shard = "fsdp"
    elif "hybrid_shard" in words:
        shard = "fsdp-hybrid"
    elif "shard_grad_op" in words or "hybrid_shard_zero2" in words:
        shard = "zero2"
    elif "no_shard" in words:
        shard = "ddp"
    offload = "both" if "offload" in words else None
    return shard, offload
