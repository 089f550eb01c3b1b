"""A torchtune recipe config YAML (``tune cp llama3_1/8B_qlora_single_device .``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from cabe import optimizer
from cabe.configs import _base
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "torchtune"
TITLE = "torchtune recipe"

#: torchtune model builder names (after ``lora_`` / ``qlora_``) -> cabe presets.
MODELS = {
    "llama3_1_8b": "llama-3.1-8b",
    "llama3_1_70b": "llama-3.1-70b",
    "llama3_1_405b": "llama-3.1-405b",
    "llama3_2_1b": "llama-3.2-1b",
    "llama3_2_3b": "llama-3.2-3b",
    "llama2_7b": "llama-2-7b",
    "llama2_13b": "llama-2-13b",
    "llama2_70b": "llama-2-70b",
    "mistral_7b": "mistral-7b-v0.1",
    "gemma2_2b": "gemma-2-2b",
    "gemma2_9b": "gemma-2-9b",
    "gemma2_27b": "gemma-2-27b",
    "phi3_mini": "phi-3-mini",
    "phi4_14b": "phi-4",
    "phi4": "phi-4",
    "qwen2_5_0_5b": "qwen2.5-0.5b",
    "qwen2_5_1_5b_base": "qwen2.5-1.5b",
    "qwen2_5_1_5b_instruct": "qwen2.5-1.5b",
    "qwen2_5_7b_base": "qwen2.5-7b",
    "qwen2_5_7b_instruct": "qwen2.5-7b",
    "qwen2_5_14b_base": "qwen2.5-14b",
    "qwen2_5_14b_instruct": "qwen2.5-14b",
    "qwen2_5_32b_base": "qwen2.5-32b",
    "qwen2_5_32b_instruct": "qwen2.5-32b",
    "qwen2_5_72b_base": "qwen2.5-72b",
    "qwen2_5_72b_instruct": "qwen2.5-72b",
    "qwen3_8b_base": "qwen3-8b",
    "qwen3_8b_instruct": "qwen3-8b",
}
#: torchtune's attention projection names -> PEFT's (what cabe's model specs use).
ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
MLP = ("gate_proj", "up_proj", "down_proj")
DTYPES = {"bf16": "bf16", "fp32": "fp32", "fp16": "fp16"}
NOT_MODELED = {
    "compile",
    "custom_sharded_layers",
    "activation_offloading_use_streams",  # the forward stash of 5 tensors (_check_offloading)
    "clip_grad_norm",
}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    model = data.get("model")
    return isinstance(model, Mapping) and "_component_" in model


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    _model(c, data.get("model") or {})
    for key, value in data.items():
        if key == "model":
            continue
        if key == "ac_option":
            _ac_option(c, key, value, data.get("ac_mode"))
            continue
        if c.convert(FIELDS, key, value):
            continue
        handler = HANDLERS.get(key)
        if handler is not None:
            handler(c, key, value)
        else:
            _unmapped(c, key, value)
    _check_offloading(c, data)
    _optimizer_in_bwd(c, data)
    if c.fields.get("shard") in ("fsdp", "fsdp-hybrid") and not data.get("custom_sharded_layers"):
        # shard_model wraps each decoder layer, then the root (torchtune training/_distributed.py): cabe's ``layers``
        # cut; with ``custom_sharded_layers`` (the embedding, the output) those get units too, nearest accelerate's
        c.fields.setdefault("fsdp_wrap", "layers")
    c.fields.setdefault("recipe", "torchtune")  # a torchtune config is a torchtune run (data/recipes/torchtune.json)
    return c


def _optimizer_in_bwd(c: Collector, data: Mapping[str, Any]) -> None:
    """``optimizer_in_bwd: True``: one optimizer per parameter, stepped in its post-accumulate-grad hook, its
    gradient freed there (torchtune/training/memory.py:58-240, recipes/full_finetune_single_device.py:151-160,
    commit bd2a0fc): cabe's ``optimizer_in_backward``, whatever the optimizer."""
    key = "optimizer_in_bwd"
    if key in data:
        c.set("optimizer_in_backward", _base.as_bool(data[key], key), key)


def _check_offloading(c: Collector, data: Mapping[str, Any]) -> None:
    """``enable_activation_offloading`` without ``enable_activation_checkpointing``: torchtune's recipes refuse it
    ("enable_activation_offloading should only be True when enable_activation_checkpointing is True",
    recipes/lora_finetune_single_device.py:186-193, full_finetune_single_device.py:172-180, commit bd2a0fc), and so
    does cabe, naming both keys.

    With checkpointing, torchtune's ``OffloadActivations`` (torchtune/training/_activation_offloading.py:24-211, a
    ``saved_tensors_hooks`` around the model's forward) sees what is saved outside the checkpointed layers: each
    layer's input (torch.utils.checkpoint saves it through the outer hooks, torch 2.13 checkpoint.py:842-847
    ``save_inputs``), which is what cabe's ``offload_activations`` moves to the host, and the final norm's saved
    tensors (``min_offload_size`` 1024 B; the output projection is left alone, l. 412-434), which cabe keeps on the
    device. NOTE: with streams (``activation_offloading_use_streams``, the default) the last
    ``max_fwd_stash_size`` = 5 offloaded tensors stay on the device until backward uses them (l. 165-204, 282-284):
    one or two layer inputs beside the norm's, which cabe does not count."""
    on = c.fields.get("offload_activations") is True
    if on and not c.fields.get("checkpointing"):
        raise ConfigError(
            "cfg_contradiction",
            "offload_activations",
            first="enable_activation_offloading: True",
            second=f"enable_activation_checkpointing: {data.get('enable_activation_checkpointing', False)}",
            source="enable_activation_offloading, enable_activation_checkpointing",
        )


def _model(c: Collector, model: Mapping[str, Any]) -> None:
    """The ``model`` block: the builder names the preset and the method; its keys the LoRA setup."""
    component = str(model.get("_component_", ""))
    builder = component.rsplit(".", 1)[-1]
    m = re.fullmatch(r"(q?lora_)?(.*)", builder)
    assert m is not None  # the pattern matches every string
    kind, base = (m.group(1) or ""), m.group(2)
    method = {"lora_": "lora", "qlora_": "qlora"}.get(kind, "full")
    c.set_known("model", MODELS.get(base), "model._component_")
    c.set("method", method, "model._component_")
    targets: list[str] = []
    for key, value in model.items():
        name = f"model.{key}"
        if key == "_component_" or c.convert(MODEL_FIELDS, key, value, name):
            continue
        if key == "lora_attn_modules":
            targets.extend(_attn_targets(value, name))
            c.use(name)
        elif key == "apply_lora_to_mlp":
            if _base.as_bool(value, name):
                targets.extend(MLP)
            c.use(name)
        elif key == "apply_lora_to_output":
            c.ignore(name, "not_modeled" if _base.as_bool(value, name) else "no_effect")
        else:
            c.ignore(name, "no_effect")
    if method != "full" and targets:
        c.fields["lora_targets"] = tuple(targets)


def _attn_targets(value: Any, name: str) -> list[str]:
    targets: list[str] = []
    for t in value or []:
        if str(t) not in ATTN:
            raise ConfigError("cfg_bad_value", name, value=str(t), expected=", ".join(ATTN))
        targets.append(ATTN[str(t)])
    return targets


def _unmapped(c: Collector, key: str, value: Any) -> None:
    if key in NOT_MODELED and value not in (None, False):
        c.ignore(key, "not_modeled")
    elif isinstance(value, Mapping) and "_component_" in value:
        c.ignore(f"{key}._component_", "no_effect")
    else:
        c.ignore(key, "null" if value is None else "no_effect")


def _dtype(c: Collector, key: str, value: Any) -> None:
    # torchtune trains in the recipe's dtype: bf16 weights, gradients and optimizer state (pure, not amp)
    c.set_known("precision", DTYPES.get(str(value).lower()), key)


def _tokenizer(c: Collector, key: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        _unmapped(c, key, value)
        return
    for k, v in value.items():
        name = f"tokenizer.{k}"
        if k == "max_seq_len":
            c.set("seq", _base.as_int(v, name), name) if v is not None else c.ignore(name, "null")
        else:
            c.ignore(name, "no_effect")


def _optimizer_block(c: Collector, key: str, value: Any) -> None:
    if isinstance(value, Mapping):
        _optimizer(c, value)
    else:
        _unmapped(c, key, value)


def _reshard(c: Collector, key: str, value: Any) -> None:
    """``fsdp_reshard_after_forward``: ``shard_model``'s argument to every ``fully_shard`` (torchtune
    training/_distributed.py)."""
    c.fields.setdefault("shard", "fsdp")
    c.set("reshard_after_forward", _base.as_bool(value, key), key)


def _cpu_offload(c: Collector, key: str, value: Any) -> None:
    c.fields.setdefault("shard", "fsdp")
    if _base.as_bool(value, key):
        c.set("offload", "both", key)
    else:
        c.use(key)


#: ``model`` keys that map to one request field through a converter.
MODEL_FIELDS: dict[str, _base.Field] = {
    "lora_rank": ("lora_rank", _base.as_int),
    "lora_alpha": ("lora_alpha", _base.as_number),
}
#: Top-level keys that map to one request field through a converter.
FIELDS: dict[str, _base.Field] = {
    "batch_size": ("batch", _base.as_int),
    "gradient_accumulation_steps": ("grad_accum", _base.as_int),
    "enable_activation_checkpointing": ("checkpointing", _base.as_bool),
}


def _ac_option(c: Collector, key: str, value: Any, mode: Any) -> None:
    """``ac_mode: selective`` with ``ac_option: k``: every k-th layer checkpointed
    (torchtune/training/activations.py:44-47). NOTE: torchtune counts from 1 (the k-th, 2k-th ... layer)
    where transformers counts from 0 (the bottom layer first); cabe places them as transformers does."""
    if mode != "selective":
        c.ignore(key, "no_effect")  # read only under ac_mode: selective
    elif str(value).isascii() and str(value).isdigit():  # ("²".isdigit() is True; int() refuses it)
        c.set("checkpoint_every", max(1, int(value)), key)
    else:
        c.ignore(key, "not_modeled")  # "op": per-operator selective checkpointing


#: Top-level keys that need more than a table entry.
def _loss(c: Collector, key: str, value: Any) -> None:
    """``loss._component_``: CEWithChunkedOutputLoss (modules/loss/ce_chunked_output_loss.py) is cabe's
    ``chunked`` loss with its ``num_output_chunks`` (default 8); other losses are not modelled."""
    comp = str(value.get("_component_", "")) if isinstance(value, Mapping) else ""
    if comp.endswith("CEWithChunkedOutputLoss"):
        c.set("loss", "chunked", f"{key}._component_")
        c.set("loss_chunks", _base.as_int(value.get("num_output_chunks", 8), f"{key}.num_output_chunks"), key)
    else:
        c.ignore(key, "not_modeled")


HANDLERS: dict[str, Callable[[Collector, str, Any], None]] = {
    "loss": _loss,
    "dtype": _dtype,
    "tokenizer": _tokenizer,
    "optimizer": _optimizer_block,
    "fsdp_cpu_offload": _cpu_offload,
    "fsdp_reshard_after_forward": _reshard,
    "enable_activation_offloading": lambda c, key, value: c.set("offload_activations", _base.as_bool(value, key), key),
    "ac_mode": lambda c, key, value: c.use(key),
    "optimizer_in_bwd": lambda c, key, value: (
        None
    ),  # read with the optimizer (_optimizer_in_bwd)  # "full" / "selective": ac_option is read with it
}


def _optimizer(c: Collector, opt: Mapping[str, Any]) -> None:
    comp = str(opt.get("_component_", ""))
    name = _base.CLASS_OPTIMIZERS.get(comp.lower())
    if name is not None and optimizer.get(name).with_momentum and float(opt.get("momentum") or 0) > 0:
        name = optimizer.get(name).with_momentum
    if name is None:
        c.ignore("optimizer._component_", "unsupported_value")
    else:
        c.set("optimizer", name, "optimizer._component_")
    for k, v in opt.items():
        if k == "_component_":
            continue
        if name is not None and k in optimizer.get(name).impl_flags:
            if _base.as_bool(v, f"optimizer.{k}"):
                c.set("optimizer_impl", k, f"optimizer.{k}")
            else:
                c.use(f"optimizer.{k}")
        elif k == "momentum":
            c.use(f"optimizer.{k}")
        else:
            c.ignore(f"optimizer.{k}", "no_effect")
