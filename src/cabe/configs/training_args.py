"""transformers ``TrainingArguments`` / TRL ``SFTConfig`` (JSON from ``args.to_json_string()``, or
the YAML ``trl sft --config`` reads, which may also carry TRL's ``ModelConfig`` fields)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from cabe import optimizer
from cabe.configs import _base, deepspeed, parallelism
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "training_args"
TITLE = "TrainingArguments / SFTConfig"

#: Fields that change GPU memory in ways cabe does not model (yet).
NOT_MODELED = {
    "torch_compile",
    "use_liger_kernel",
    "ddp_bucket_cap_mb",
    "padding_free",
    "torch_empty_cache_steps",
    "activation_offloading",
    "lora_modules_to_save",
    "neftune_noise_alpha",
    "auto_find_batch_size",
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
            _unmapped(c, key)
    if "precision" not in c.fields and any(k in fields_ for k in ("bf16", "fp16")):
        # bf16=False and fp16=False said outright: the Trainer runs no autocast
        c.fields["autocast"] = "none"
        c.origin.setdefault("autocast", c.name("bf16" if "bf16" in fields_ else "fp16"))
    return c


def _field(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> bool:
    """Map one field through the tables; False when none of them knows ``key``."""
    handler = HANDLERS.get(key)
    if handler is not None:
        handler(c, key, value, all_)
        return True
    return c.convert(FIELDS, key, value) or c.flag(FLAGS, key, value)


def _unmapped(c: Collector, key: str) -> None:
    c.ignore(key, "not_modeled" if key in NOT_MODELED else "no_effect")


def _train_batch_size(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    if "per_device_train_batch_size" in all_:
        _unmapped(c, key)
    else:
        c.set("batch", _base.as_int(value, key), key)


def _dtype(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    c.set_known("_dtype", _base.dtype(value), key)  # the loaded weights' dtype; combined with bf16/fp16 later


def _load_in_8bit(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    if _base.as_bool(value, key):
        c.ignore(key, "not_modeled")
    else:
        c.use(key)


def _parallelism(c: Collector, key: str, value: Any) -> None:
    """accelerate's ``ParallelismConfig``, as a mapping: its context-parallel sizes (cabe.configs.parallelism)."""
    if isinstance(value, Mapping):
        parallelism.read(c, key, value)
    else:
        c.ignore(key, "not_modeled")


def _deepspeed(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    if not isinstance(value, Mapping):
        c.ignore(key, "other_file")
        return
    sub, used, ignored = deepspeed.to_request(value)
    for f, v in sub.items():
        c.set(f, v, key)
    c.used = [u for u in c.used if u != key] + [f"{key}.{u}" for u in used]
    c.ignored += [(f"{key}.{f}", r) for f, r in ignored]


def _fsdp_config(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    if not isinstance(value, Mapping):
        _unmapped(c, key)
        return
    for k, v in value.items():
        name = f"fsdp_config.{k}"
        kk = k.removeprefix("fsdp_")
        if c.flag(FSDP_FLAGS, kk, v, name) or v is None:
            continue
        if kk == "activation_checkpointing":
            c.set("checkpointing", _base.as_bool(v, name), name)
        elif kk == "reshard_after_forward" and all_.get("fsdp"):
            # FSDP2's fully_shard argument, passed through accelerate (transformers' fsdp_config)
            c.set("reshard_after_forward", _base.as_bool(v, name), name)
        elif kk == "version" and str(v) == "1" and fsdp_words(all_.get("fsdp") or "")[0] in ("fsdp", "fsdp-hybrid"):
            # FSDP1 (TrainingArguments' fsdp_config "version", 2 by default in transformers 5.25): each decoder layer
            # wrapped, the rest in the root unit: cabe's ``layers`` cut
            c.set("fsdp_wrap", "layers", name)
        elif kk == "cpu_ram_efficient_loading" and fsdp_words(all_.get("fsdp") or "")[0] in ("fsdp", "fsdp-hybrid"):
            # TrainingArguments hands it to accelerate as FSDP_CPU_RAM_EFFICIENT_LOADING (transformers 5.25
            # training_args.py, ``fsdp_config``): how FSDP loads (cabe.parallel.loading)
            c.set("cpu_ram_efficient_loading", _base.as_bool(v, name), name)
        else:
            c.ignore(name, "not_modeled" if kk in FSDP_NOT_MODELED else "no_effect")


def _checkpointing_kwargs(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    """``activation_checkpointing_kwargs`` (or its old name ``gradient_checkpointing_kwargs``): the Trainer
    pops ``every_n_layers`` and ``offload`` for ``activation_checkpointing_enable`` and passes the rest to
    ``torch.utils.checkpoint`` (transformers 5.24 trainer.py:1503-1515)."""
    if isinstance(value, str):  # the command line gives it as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            raise ConfigError("cfg_bad_value", key, value=value[:80], expected="a JSON object") from None
    if not isinstance(value, Mapping):
        _unmapped(c, key)
        return
    for k, v in value.items():
        name = f"{key}.{k}"
        if k == "every_n_layers":
            c.set("checkpoint_every", _base.as_int(v, name), name)
        elif k == "offload":
            c.set("offload_activations", _base.as_bool(v, name), name)
        elif k == "use_reentrant" and not _base.as_bool(v, name):
            c.use(name)  # non-reentrant: what cabe models and traces
        else:
            c.ignore(name, "not_modeled" if k == "use_reentrant" else "no_effect")


def _packing(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    """TRL's SFTConfig ``packing`` (rows of max_length holding several documents) and ``padding_free`` (the
    batch flattened to one row, documents told apart by position_ids); padding-free decides when both are on,
    and TRL's default ``packing_strategy="bfd"`` turns it on (cabe/data/recipes/trl-sft.json, padding)."""
    on = _base.as_bool(value, key)
    bfd = str(all_.get("packing_strategy") or "bfd") == "bfd"
    free = key == "padding_free" or bfd or _base.as_bool(all_.get("padding_free") or False, "padding_free")
    if on:
        c.set("packing", "padding-free" if free else "packed", key)
    else:
        c.use(key)


def _gpus(c: Collector, key: str, value: Any, all_: Mapping[str, Any]) -> None:
    if _base.as_int(value, key) > 1:
        c.set("gpus", _base.as_int(value, key), key)
    else:
        _unmapped(c, key)


#: ``attn_implementation`` values -> cabe's attention kernels.
ATTENTION = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "kernels-community/flash-attn": "flash",
    "kernels-community/vllm-flash-attn3": "flash",
}
#: Keys that map to one request field through a converter.
FIELDS: dict[str, _base.Field] = {
    "per_device_train_batch_size": ("batch", _base.as_int),
    "gradient_accumulation_steps": ("grad_accum", _base.as_int),
    "gradient_checkpointing": ("checkpointing", _base.as_bool),
    "activation_checkpointing": ("checkpointing", _base.as_bool),  # transformers 5 renamed it
    "max_length": ("seq", _base.as_int),
    "max_seq_length": ("seq", _base.as_int),
    "model_name_or_path": ("model", _base.as_model),
    "lora_r": ("lora_rank", _base.as_int),
    "lora_alpha": ("lora_alpha", _base.as_number),
    "lora_target_modules": ("lora_targets", _base.as_targets),
    "use_dora": ("dora", _base.as_bool),  # TRL ModelConfig
    "lora_dropout": ("lora_dropout", _base.as_number),
    "bnb_4bit_quant_type": ("quant", _base.as_str),
    "use_bnb_nested_quant": ("double_quant", _base.as_bool),
}
#: On/off keys: the request field and its value when on.
FLAGS: dict[str, _base.Flag] = {
    "bf16": ("precision", "bf16-amp"),
    "fp16": ("precision", "fp16-amp"),
    "use_peft": ("method", "lora"),
    "load_in_4bit": ("method", "qlora"),
}
#: ``fsdp_config`` keys (without their ``fsdp_`` prefix).
FSDP_FLAGS: dict[str, _base.Flag] = {"offload_params": ("offload", "both")}
FSDP_NOT_MODELED = (
    "min_num_params",
    "transformer_layer_cls_to_wrap",
    "forward_prefetch",
    "backward_prefetch",
    "limit_all_gathers",
)
#: Keys that need more than a table entry.
HANDLERS: dict[str, Callable[[Collector, str, Any, Mapping[str, Any]], None]] = {
    "train_batch_size": _train_batch_size,
    "optim": lambda c, key, value, all_: _base.set_hf_optimizer(c, key, value),
    "optim_target_modules": lambda c, key, value, all_: _low_rank_only(c, key, value, all_, _galore_targets),
    "optim_args": lambda c, key, value, all_: _low_rank_only(c, key, value, all_, _galore_rank),
    "dtype": _dtype,
    "torch_dtype": _dtype,
    "attn_implementation": lambda c, key, value, all_: c.set_known("attention", ATTENTION.get(str(value)), key),
    "load_in_8bit": _load_in_8bit,
    "deepspeed": _deepspeed,
    "fsdp": lambda c, key, value, all_: set_fsdp(c, key, value),
    "fsdp_config": _fsdp_config,
    "world_size": _gpus,
    "activation_checkpointing_kwargs": _checkpointing_kwargs,
    "packing": _packing,
    "padding_free": _packing,
    "packing_strategy": lambda c, key, value, all_: c.use(key),  # read with packing
    "gradient_checkpointing_kwargs": _checkpointing_kwargs,
    "n_gpu": _gpus,
    "parallelism_config": lambda c, key, value, all_: _parallelism(c, key, value),
}


def _low_rank_only(
    c: Collector, key: str, value: Any, all_: Mapping[str, Any], read: Callable[[Collector, str, Any], None]
) -> None:
    """GaLore's keys act with a GaLore ``optim`` only: the Trainer reads ``optim_target_modules`` and the "rank"
    of ``optim_args`` in ``_setup_low_rank_optimizer`` alone (transformers trainer_optimizer.py:121, 370), so with
    another optimizer (``adamw_torch`` by default) they change nothing, and the request must not carry them
    (:func:`cabe.schema.inapplicable` refuses them)."""
    opt = _base.optimizer_from_hf(all_.get("optim", "adamw_torch"))
    if opt is not None and optimizer.get(opt[0]).low_rank:
        read(c, key, value)
    else:
        c.ignore(key, "no_effect")


def _galore_targets(c: Collector, key: str, value: Any) -> None:
    """``optim_target_modules`` -> ``galore_targets``: a list of names (matched as substrings of the module's
    path, transformers trainer_utils.py:1042-1048) or ``all-linear``; one other string is a regex cabe does not
    match."""
    if isinstance(value, str):
        if value.replace("_", "-") == "all-linear":
            c.set("galore_targets", ("all-linear",), key)
        else:
            c.ignore(key, "unsupported_value")
    elif isinstance(value, (list, tuple)) and value:
        c.set("galore_targets", tuple(str(v) for v in value), key)
    else:
        c.ignore(key, "unsupported_value")


def _galore_rank(c: Collector, key: str, value: Any) -> None:
    """``optim_args`` (``"rank=64,update_proj_gap=200"``, transformers ``TrainingArguments.optim_args``) ->
    ``galore_rank``; the other keys change no memory (update_proj_gap, scale, proj_type "std")."""
    pairs = dict(p.split("=", 1) for p in str(value).replace(" ", "").split(",") if "=" in p)
    rank = pairs.get("rank", "")
    if rank.isascii() and rank.isdigit():  # ("²".isdigit() is True; int() refuses it)
        c.set("galore_rank", int(rank), key)
    else:
        c.ignore(key, "unsupported_value")


def set_fsdp(c: Collector, key: str, value: Any) -> None:
    """TrainingArguments-style ``fsdp`` words -> ``shard`` and ``offload`` (only used when neither)."""
    shard, offload = fsdp_words(value)
    if shard:
        c.set("shard", shard, key)
        c.fields["_engine"] = "fsdp"  # whose mixed precision a bf16 / fp16 flag turns on
    if offload:
        c.set("offload", offload, key)
    if not shard and not offload:
        c.use(key)


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
