"""An ``accelerate config`` YAML (``default_config.yaml``): FSDP, DeepSpeed or multi-GPU."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe.configs import _base, parallelism
from cabe.configs._base import Collector
from cabe.configs.deepspeed import shard_for_stage
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
PRECISION = {"bf16": "bf16-amp", "fp16": "fp16-amp", "no": "fp32"}


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
    for key, value in data.items():
        handler = HANDLERS.get(key)
        if handler is not None:
            handler(c, key, value, data)
        elif key == "use_cpu" and value:
            c.ignore(key, "not_modeled")
        else:
            _unmapped(c, key, value)
    return c


def _kind(data: Mapping[str, Any]) -> str:
    return str(data.get("distributed_type", "NO")).upper()


def _unmapped(c: Collector, key: str, value: Any) -> None:
    c.ignore(key, "null" if value is None else "no_effect")


def _distributed_type(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if _kind(data) == "MULTI_GPU":
        c.set("shard", "ddp", key)
    else:
        c.use(key)


def _num_processes(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    n = _base.as_int(value, key)
    if n > 1:
        c.set("gpus", n, key)
    else:
        c.use(key)


def _num_machines(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    m = _base.as_int(value, key)
    procs = data.get("num_processes")
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


def _mixed_precision(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if str(value).lower() == "fp8":
        # accelerate 1.16 always runs fp8 under bf16 autocast (accelerator.py:572-573 "We always enable native_amp
        # for FP8"; utils/modeling.py:2068) with the recipe of fp8_config's backend: AO, or unnamed with torchao
        # installed (accelerator.py:459-466), is AORecipeKwargs' default Float8LinearConfig, tensorwise; TE is
        # TERecipeKwargs: DelayedScaling, or MXFP8BlockScaling with use_mxfp8_block_scaling
        # (utils/transformer_engine.py:161-177)
        c.set("precision", "bf16-amp", key)
        block = data.get("fp8_config")
        block = block if isinstance(block, Mapping) else {}
        backend = str(block.get("backend") or "AO").upper()
        mx = _base.as_bool(block.get("use_mxfp8_block_scaling", False), "fp8_config.use_mxfp8_block_scaling")
        recipe = {"AO": "tensorwise", "TE": "te-mxfp8" if mx else "te-delayed"}.get(backend)
        c.set_known("fp8", recipe, "fp8_config.backend" if "backend" in block else key)
        return
    c.set_known("precision", PRECISION.get(str(value).lower()), key)


def _fp8_config(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``fp8_config``: its backend (and MXFP8 switch) read with ``mixed_precision: fp8``; the rest changes
    numerics or speed, not memory (margin, interval, amax_compute_algo, pad_inner_dim...)."""
    if not isinstance(value, Mapping):
        _unmapped(c, key, value)
        return
    fp8_on = str(data.get("mixed_precision", "")).lower() == "fp8"
    for k in value:
        if fp8_on and k in ("backend", "use_mxfp8_block_scaling"):
            c.use(f"{key}.{k}")
        else:
            c.ignore(f"{key}.{k}", "no_effect")


def _block(kind: str, read: Callable[[Collector, Mapping[str, Any]], None]) -> Handler:
    """A handler for the ``fsdp_config`` / ``deepspeed_config`` block, read only when
    ``distributed_type`` is ``kind`` (its keys have no effect otherwise)."""

    def handle(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
        if not isinstance(value, Mapping):
            _unmapped(c, key, value)
        elif _kind(data) == kind:
            read(c, value)
        else:
            for k in value:
                c.ignore(f"{key}.{k}", "no_effect")

    return handle


def _fsdp(c: Collector, f: Mapping[str, Any]) -> None:
    c.fields["_engine"] = "fsdp"  # mixed_precision becomes FSDP's MixedPrecision(Policy), not only autocast
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
            # FSDP2: a bool, fully_shard's reshard_after_forward on every unit but the root (accelerate 1.16
            # utils/fsdp_utils.py:765, 901-904); FSDP1 may spell a strategy here too
            text = str(value).upper()
            if text in STRATEGIES:
                c.set("shard", STRATEGIES[text], name)
            elif not has_strategy:
                c.set("reshard_after_forward", _base.as_bool(value, name), name)
            else:
                c.ignore(name, "no_effect")
        elif key == "fsdp_offload_params":
            if _base.as_bool(value, name):
                c.set("offload", "both", name)  # FSDP CPU offload moves parameters, gradients and optimizer state
            else:
                c.use(name)
        elif key == "fsdp_cpu_ram_efficient_loading":
            pass  # read after the loop, once the strategy is known
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
    _ram_efficient_loading(c, f)
    if str(version) == "1" and c.fields.get("shard") in ("fsdp", "fsdp-hybrid"):
        # FSDP1 (accelerate 1.16 utils/fsdp_utils.py: the plugin's transformer_based_wrap on each decoder layer, the
        # rest in the root unit): cabe's ``layers`` cut; FSDP2's is accelerate's own (cabe.trace.fsdp_wrap)
        c.set("fsdp_wrap", "layers", "fsdp_config.fsdp_version")


def _ram_efficient_loading(c: Collector, f: Mapping[str, Any]) -> None:
    """``fsdp_cpu_ram_efficient_loading``: how FSDP loads (cabe.parallel.loading); no effect unless the strategy
    shards (NO_SHARD / SHARD_GRAD_OP are planned as DDP / ZeRO-2, which load their own way)."""
    key = "fsdp_cpu_ram_efficient_loading"
    if key not in f:
        return
    name = f"fsdp_config.{key}"
    if c.fields.get("shard") in ("fsdp", "fsdp-hybrid"):
        c.set("cpu_ram_efficient_loading", _base.as_bool(f[key], name), name)
    else:
        c.ignore(name, "no_effect")


def _deepspeed(c: Collector, d: Mapping[str, Any]) -> None:
    c.fields["_engine"] = "deepspeed"  # mixed_precision becomes DeepSpeed's bf16 / fp16 mode
    for key, value in d.items():
        name = f"deepspeed_config.{key}"
        if key == "zero_stage":
            c.set("shard", shard_for_stage(value, name), name)
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


def _parallelism(c: Collector, key: str, value: Any) -> None:
    """``parallelism_config``: its context-parallel sizes (cabe.configs.parallelism)."""
    if isinstance(value, Mapping):
        parallelism.read(c, key, value)
    else:
        _unmapped(c, key, value)


Handler = Callable[[Collector, str, Any, Mapping[str, Any]], None]
#: Top-level keys and their readers.
HANDLERS: dict[str, Handler] = {
    "distributed_type": _distributed_type,
    "num_processes": _num_processes,
    "num_machines": _num_machines,
    "mixed_precision": _mixed_precision,
    "fp8_config": _fp8_config,
    "fsdp_config": _block("FSDP", _fsdp),
    "deepspeed_config": _block("DEEPSPEED", _deepspeed),
    "parallelism_config": lambda c, key, value, data: _parallelism(c, key, value),
}
