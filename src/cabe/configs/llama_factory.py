"""A LLaMA-Factory training YAML (``llamafactory-cli train examples/train_lora/qwen3_lora_sft.yaml``).

The file is one flat mapping of LLaMA-Factory's own arguments (``ModelArguments``, ``DataArguments``,
``FinetuningArguments``) and transformers' ``Seq2SeqTrainingArguments``; the Trainer's keys
(``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``optim``, ``bf16`` / ``fp16``,
``deepspeed``, ``fsdp`` ...) are read as :mod:`cabe.configs.training_args` reads them. Sources: LLaMA-Factory
commit ff6d4d1 (0.9.6.dev0), files under ``src/llamafactory/``.

Where LLaMA-Factory's default differs from cabe's, the reader sets it when the file is silent:

==========================  ==========================  ======================================================
request field               LLaMA-Factory default       source
==========================  ==========================  ======================================================
``method``                  ``lora``                    hparams/finetuning_args.py:464-467 (finetuning_type)
``lora_targets``            ``all`` -> all-linear       hparams/finetuning_args.py:81-90; model/model_utils/
                                                        misc.py:28-52 (every Linear but lm_head)
``lora_alpha``              ``lora_rank * 2``           hparams/finetuning_args.py:69-72, 587
``trainable_layers``        2 (the last two)            hparams/finetuning_args.py:23-32; model/adapter.py:89-90
``galore_rank``             16                          hparams/finetuning_args.py:279-282
``galore_targets``          ``all`` -> all-but-lm-head hparams/finetuning_args.py:270-278; train/
                                                        trainer_utils.py:205-206
``seq``                     ``cutoff_len`` 2048         hparams/data_args.py:46-49
``checkpointing``           on                          hparams/model_args.py:145-148 (disable_gradient_
                                                        checkpointing); model/model_utils/checkpointing.py:184
``autocast``                none (bf16 / fp16 unsaid)   transformers TrainingArguments ``bf16=False``
==========================  ==========================  ======================================================

How the file's keys become a request:

* ``finetuning_type``: ``lora`` / ``freeze`` / ``full``; ``oft`` is refused (``cfg_unsupported``).
  ``quantization_bit: 4`` with ``quantization_method: bnb`` (the default, model_args.py:279-281) makes LoRA
  QLoRA, with ``quantization_type`` (nf4) and ``double_quantization`` (true) as given
  (model/model_utils/quantization.py:182-189); 8 bits, HQQ and EETQ are not modelled.
* The weights are loaded with ``torch_dtype="auto"`` (model/loader.py:154: the checkpoint's dtype) and
  ``init_adapter`` casts what trains to fp32 unless ``pure_bf16`` (model/adapter.py:337-349): full fine-tuning
  is fp32 weights under the Trainer's autocast (cabe's ``bf16-amp``); LoRA's adapters are fp32 as PEFT keeps
  them; under freeze only the trained layers are fp32 (the frozen ones stay 16-bit): cabe's ``trainable_fp32``
  (adapter.py:129-134).
* ``cutoff_len``: the SFT collator pads to a multiple of 8 (train/sft/workflow.py:65,
  ``pad_to_multiple_of=8``), so the longest row is ``cutoff_len`` rounded up to 8; with packing the rows are
  ``cutoff_len - 1`` long (hparams/data_args.py:188-189) before that padding.
* ``packing`` (without ``neat_packing``) fills rows of ``cutoff_len`` with several samples under an all-ones
  attention mask (data/processor/supervised.py:213-216): the attention runs across the samples, as in one
  long sequence, so cabe counts full rows (``packing: none``). ``neat_packing`` numbers each sample in the mask
  (supervised.py:213-214) and the collator turns it into a block-diagonal mask (data/collator.py:535-536):
  cabe's ``packed``. NOTE: under SDPA / eager that mask is 4-D in the compute dtype (collator.py:93-133), two
  bytes per (query, key) pair where transformers' own block-diagonal mask is a bool.
* ``use_unsloth_gc``: each checkpointed layer's input goes to the host (model_utils/checkpointing.py:63-97,
  ``hidden_states.to("cpu", non_blocking=True)``): cabe's ``offload_activations``.
* ``enable_liger_kernel``: Liger's fused linear cross-entropy for the ``pt`` / ``sft`` stages
  (model_utils/liger_kernel.py:97-110): ``loss: liger``. Its RMSNorm, SwiGLU and RoPE kernels are not
  modelled (listed as ignored under ``enable_liger_kernel.kernels``).
* ``use_galore``: LLaMA-Factory builds GaLore itself (train/trainer_utils.py:200-272): GaLoreAdamW for
  ``optim: adamw_torch``, GaLoreAdamW8bit for the 8-bit AdamW names, GaLoreAdafactor for ``adafactor``;
  ``galore_layerwise`` steps each parameter in a post-accumulate-grad hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe.configs import _base, training_args
from cabe.configs._base import Collector
from cabe.errors import ConfigError
from cabe.optimizer import ALL_BUT_HEAD

FORMAT = "llama_factory"
TITLE = "LLaMA-Factory config"

#: keys only a LLaMA-Factory file has (hparams/finetuning_args.py, model_args.py, data_args.py)
MARKERS = frozenset(
    {
        "finetuning_type",
        "cutoff_len",
        "lora_target",
        "quantization_bit",
        "freeze_trainable_layers",
        "disable_gradient_checkpointing",
        "use_unsloth_gc",
        "enable_liger_kernel",
        "neat_packing",
        "pure_bf16",
        "flash_attn",
    }
)
#: LLaMA-Factory's defaults (see the module docstring for each source)
DEFAULT_CUTOFF_LEN = 2048
DEFAULT_LORA_RANK = 8
DEFAULT_FREEZE_LAYERS = 2
DEFAULT_GALORE_RANK = 16
#: the SFT collator's ``pad_to_multiple_of`` (train/sft/workflow.py:65)
SFT_PAD_MULTIPLE = 8

#: LLaMA-Factory keys that change GPU memory in ways cabe does not model (yet)
NOT_MODELED = {
    "use_unsloth",  # unsloth's loader and kernels (model/model_utils/unsloth.py)
    "freeze_extra_modules",
    "use_llama_pro",
    "pissa_init",  # an SVD of every targeted weight at start (adapter.py, PiSSA)
    "upcast_layernorm",  # fp32 norm weights (checkpointing.py:171-175)
    "upcast_lmhead_output",  # an fp32 copy of the logits (checkpointing.py:200-204)
    "use_apollo",
    "use_badam",
    "use_adam_mini",
    "use_muon",
    "use_mca",
    "use_megatron_bridge",
    "use_hyper_parallel",
    "use_kt",
    "train_from_scratch",  # from_config: fp32 weights (loader.py:168-169)
    "resize_vocab",
    "add_tokens",
    "add_special_tokens",
    "mixture_of_depths",
    "shift_attn",
    "fp8",
    "use_v1_kernels",
    "use_dft_loss",
    "use_asft_loss",
    "use_eaft_loss",
    "ref_model",
    "reward_model",
    "upcast_logits",
}
#: LLaMA-Factory keys that change nothing on the GPU during a training step
NO_EFFECT = {
    "template",
    "dataset",
    "eval_dataset",
    "dataset_dir",
    "media_dir",
    "max_samples",
    "preprocessing_num_workers",
    "preprocessing_batch_size",
    "overwrite_cache",
    "tokenized_path",
    "val_size",
    "trust_remote_code",
    "plot_loss",
    "overwrite_output_dir",
    "save_only_model",
    "ddp_timeout",
    "train_on_prompt",
    "mask_history",
    "streaming",
    "buffer_size",
    "mix_strategy",
    "interleave_probs",
    "ignore_pad_token_for_loss",
    "tool_format",
    "default_system",
    "enable_thinking",
    "preserve_thinking",
    "rope_scaling",
    "moe_aux_loss_coef",
    "use_rslora",
    "loraplus_lr_ratio",
    "loraplus_lr_embedding",
    "create_new_adapter",
    "pissa_iter",
    "pissa_convert",
    "galore_update_interval",
    "galore_scale",
    "galore_proj_type",
    "quantization_device_map",
    "adapter_name_or_path",
    "cache_dir",
    "use_fast_tokenizer",
    "model_revision",
    "low_cpu_mem_usage",
    "print_param_status",
    "freeze_vision_tower",
    "freeze_multi_modal_projector",
    "compute_accuracy",
    "disable_shuffling",
    "use_swanlab",
    "include_effective_tokens_per_second",
    "export_dir",
    "infer_backend",
    "infer_dtype",
}
#: the stages cabe models: one causal-LM forward per batch (pt, sft); rm / ppo / dpo / kto add a value head, a
#: reference model or chosen / rejected pairs (hparams/finetuning_args.py:460-463)
STAGES = ("pt", "sft")
#: ``flash_attn`` (extras/constants.py:147-152, model_utils/attention.py:65-92) -> cabe's kernel; auto: transformers'
ATTENTION = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}
#: the Trainer's 8-bit AdamW names that make LLaMA-Factory's GaLore GaLoreAdamW8bit (trainer_utils.py:241-242)
GALORE_8BIT = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit")


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def looks_like(data: Mapping[str, Any]) -> bool:
    keys = set(data)
    return bool(keys & MARKERS) or ({"stage", "template"} <= keys)


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    _check(data)
    c = Collector()
    for key, value in data.items():
        if value is None:
            continue  # LLaMA-Factory's examples write ``resume_from_checkpoint: null``: its default
        handler = HANDLERS.get(key)
        if handler is not None:
            handler(c, key, value, data)
        elif key in NO_EFFECT:
            c.ignore(key, "no_effect")
        elif key in NOT_MODELED:
            c.ignore(key, "not_modeled" if _on(value) else "no_effect")
        elif not training_args._field(c, key, value, data):
            training_args._unmapped(c, key)
    _method(c, data)
    if _base.as_bool(data.get("use_galore") or False, "use_galore"):
        _default(c, "galore_rank", DEFAULT_GALORE_RANK)
        _default(c, "galore_targets", (ALL_BUT_HEAD,))
    _length(c, data)
    _checkpointing(c, data)
    _precision(c, data)
    c.fields.setdefault("recipe", "llama-factory")  # a LLaMA-Factory file is its run (data/recipes/llama-factory.json)
    return c


def _on(value: Any) -> bool:
    return not (value is False or value == 0 or value == "" or value == [] or value == {})


def _default(c: Collector, field: str, value: Any) -> None:
    """A LLaMA-Factory default the file does not state (the module docstring's table)."""
    if field not in c.fields:
        c.fields[field] = value
        c.origin.setdefault(field, "(LLaMA-Factory default)")


def _finetuning_type(data: Mapping[str, Any]) -> str:
    return str(data.get("finetuning_type") or "lora").strip().lower()


def _quantized(data: Mapping[str, Any]) -> bool:
    """bitsandbytes 4-bit on the fly: ``quantization_bit: 4`` with ``quantization_method: bnb``."""
    bits = data.get("quantization_bit")
    method = str(data.get("quantization_method") or "bnb").strip().lower()
    return bits is not None and _base.as_int(bits, "quantization_bit") == 4 and method == "bnb"


def _check(data: Mapping[str, Any]) -> None:
    kind = _finetuning_type(data)
    if kind not in ("lora", "freeze", "full"):
        raise ConfigError("cfg_unsupported", "finetuning_type", value=kind, allowed="lora, freeze, full")
    if data.get("quantization_bit") is not None and kind != "lora":
        # model/adapter.py:330-332: "Quantized models can only be used for the LoRA or OFT tuning."
        raise ConfigError(
            "cfg_contradiction",
            "method",
            first=f"finetuning_type: {kind}",
            second=f"quantization_bit: {data.get('quantization_bit')}",
            source="finetuning_type, quantization_bit",
        )
    if kind == "lora" and _base.as_bool(data.get("use_galore") or False, "use_galore"):
        # hparams/finetuning_args.py:615-616: "Cannot use LoRA with GaLore, APOLLO or BAdam together."
        raise ConfigError(
            "cfg_contradiction", "optimizer", first="finetuning_type: lora", second="use_galore", source="use_galore"
        )
    if _base.as_bool(data.get("bf16") or False, "bf16") and _base.as_bool(data.get("fp16") or False, "fp16"):
        raise ConfigError("cfg_contradiction", "precision", first="bf16", second="fp16", source="bf16, fp16")


def _method(c: Collector, data: Mapping[str, Any]) -> None:
    """``finetuning_type`` (lora by default) and the defaults of the method it names."""
    kind = _finetuning_type(data)
    method = "qlora" if kind == "lora" and _quantized(data) else kind
    if "finetuning_type" in data:
        c.set("method", method, "finetuning_type")
    else:
        _default(c, "method", method)
    if kind == "lora":
        _default(c, "lora_targets", ("all-linear",))
        rank = c.fields.get("lora_rank", DEFAULT_LORA_RANK)
        _default(c, "lora_alpha", float(2 * rank))
    elif kind == "freeze":
        _default(c, "trainable_layers", DEFAULT_FREEZE_LAYERS)


def _length(c: Collector, data: Mapping[str, Any]) -> None:
    """``cutoff_len`` -> ``seq``: the longest row the collator builds (module docstring)."""
    given = data.get("cutoff_len")
    cutoff = DEFAULT_CUTOFF_LEN if given is None else _base.as_int(given, "cutoff_len")
    stage = str(data.get("stage") or "sft")
    packing = _base.as_bool(data.get("packing") or False, "packing") or _base.as_bool(
        data.get("neat_packing") or False, "neat_packing"
    )
    if stage == "sft":
        rows = cutoff - 1 if packing else cutoff
        seq = -(-rows // SFT_PAD_MULTIPLE) * SFT_PAD_MULTIPLE
    else:
        seq = cutoff  # pt: blocks of cutoff_len (data/processor/pretrain.py), no pad_to_multiple_of
    if given is None:
        _default(c, "seq", seq)
    else:
        c.set("seq", seq, "cutoff_len")


def _checkpointing(c: Collector, data: Mapping[str, Any]) -> None:
    """On unless ``disable_gradient_checkpointing`` (model_args.py:145-148, checkpointing.py:184); the Trainer's own
    ``gradient_checkpointing: true`` calls the same patched method, so it turns it on as well."""
    disabled = _base.as_bool(data.get("disable_gradient_checkpointing") or False, "disable_gradient_checkpointing")
    asked = _base.as_bool(data.get("gradient_checkpointing") or False, "gradient_checkpointing")
    on = not disabled or asked
    source = "disable_gradient_checkpointing" if "disable_gradient_checkpointing" in data else None
    if source:
        c.set("checkpointing", on, source)
    elif asked:
        c.set("checkpointing", on, "gradient_checkpointing")
    else:
        _default(c, "checkpointing", on)
    if "gradient_checkpointing" in data:
        c.use("gradient_checkpointing")
    unsloth_gc = _base.as_bool(data.get("use_unsloth_gc") or False, "use_unsloth_gc")
    if unsloth_gc and on:
        c.set("offload_activations", True, "use_unsloth_gc")
    elif unsloth_gc:
        c.ignore("use_unsloth_gc", "no_effect")  # no checkpointing: nothing to offload
    elif "use_unsloth_gc" in data:
        c.use("use_unsloth_gc")


def _precision(c: Collector, data: Mapping[str, Any]) -> None:
    """The weights as loaded (``auto``) and cast (fp32 what trains, unless ``pure_bf16``), the Trainer's autocast
    (none when neither ``bf16`` nor ``fp16`` is on)."""
    pure = _base.as_bool(data.get("pure_bf16") or False, "pure_bf16")
    method = c.fields.get("method")
    # adapter.py:337-349: no fp32 cast under pure_bf16 / BAdam, nor under ZeRO-3 without quantization (its fp32
    # masters); full fine-tuning otherwise trains fp32 copies of every weight
    c.fields["_dtype"] = "fp32" if method == "full" and not pure else "auto"
    c.origin.setdefault("_dtype", "(LLaMA-Factory default)")
    amp = str(c.fields.get("precision", "")).endswith("-amp")  # the Trainer's bf16 / fp16: autocast
    if "precision" not in c.fields:
        c.fields["autocast"] = "none"  # TrainingArguments bf16 / fp16 are False by default
        c.origin.setdefault("autocast", "(LLaMA-Factory default)")
    if method == "freeze":  # adapter.py:129-134: the trained layers in fp32, the frozen ones as loaded
        # (without the Trainer's bf16 / fp16 nothing casts the fp32 layers' output back for the 16-bit lm_head)
        c.fields["trainable_fp32"] = not pure and amp
        c.origin.setdefault("trainable_fp32", "pure_bf16" if "pure_bf16" in data else "(LLaMA-Factory default)")


def _finetuning(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    c.use(key)  # read by _method, after every key


def _lora_target(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``lora_target``: ``all`` (every Linear but lm_head, misc.py:28-52) or names split on commas
    (finetuning_args.py:580-588)."""
    if _finetuning_type(data) != "lora":
        c.ignore(key, "no_effect")
        return
    names = [str(v).strip() for v in ([value] if isinstance(value, str) else value) for v in str(v).split(",")]
    names = [n for n in names if n]
    c.set("lora_targets", ("all-linear",) if names == ["all"] else tuple(names), key)


def _additional_target(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``additional_target``: PEFT's ``modules_to_save`` under LoRA (adapter.py:265, 273; names split on commas,
    hparams/finetuning_args.py:590): cabe's ``modules_to_save``."""
    if _finetuning_type(data) != "lora":
        c.ignore(key, "no_effect")
        return
    names = [str(v).strip() for v in ([value] if isinstance(value, str) else value) for v in str(v).split(",")]
    c.set("modules_to_save", tuple(n for n in names if n), key)


def _lora_only(convert: _base.Convert, field: str) -> Callable[[Collector, str, Any, Mapping[str, Any]], None]:
    """A LoRA key: read with ``finetuning_type: lora``; the other methods do not read it."""

    def handle(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
        if _finetuning_type(data) == "lora":
            c.set(field, convert(value, key), key)
        else:
            c.ignore(key, "no_effect")

    return handle


def _quantization(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``quantization_bit`` / ``quantization_method``: bitsandbytes 4-bit is QLoRA (read by _method)."""
    if _quantized(data):
        c.use(key)
    else:
        c.ignore(key, "not_modeled")


def _quant_detail(field: str, convert: _base.Convert) -> Callable[[Collector, str, Any, Mapping[str, Any]], None]:
    def handle(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
        if _quantized(data):
            c.set(field, convert(value, key), key)
        else:
            c.ignore(key, "no_effect")

    return handle


def _freeze_layers(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``freeze_trainable_layers``: n > 0 trains the last n layers (cabe's freeze); n < 0 the first |n|
    (adapter.py:89-92), which cabe does not model."""
    if _finetuning_type(data) != "freeze":
        c.ignore(key, "no_effect")
        return
    n = _base.as_int(value, key)
    if n <= 0:
        raise ConfigError("cfg_unsupported", key, value=str(n), allowed="a positive count (the last n layers)")
    c.set("trainable_layers", n, key)


def _freeze_modules(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``freeze_trainable_modules: all`` is what cabe's freeze trains; a subset of each layer is not modelled."""
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else map(str, value))]
    if names == ["all"]:
        c.use(key)
    else:
        c.ignore(key, "not_modeled")


def _stage(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if str(value) in STAGES:
        c.use(key)
    else:
        c.ignore(key, "not_modeled")


def _packing(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``neat_packing`` -> ``packed`` (block-diagonal attention); ``packing`` alone: full rows of one causal
    attention (module docstring), i.e. cabe's ``none`` at ``seq``."""
    neat = _base.as_bool(data.get("neat_packing") or False, "neat_packing")
    if key == "neat_packing" and neat:
        c.set("packing", "packed", key)
    else:
        c.use(key)


def _liger(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if not _base.as_bool(value, key):
        c.use(key)
        return
    if str(data.get("stage") or "sft") in STAGES:
        c.set("loss", "liger", key)  # liger_kernel.py:97-101: fused linear cross-entropy unless logits are needed
    c.ignore(f"{key}.kernels", "not_modeled")  # RMSNorm, SwiGLU, RoPE (apply_liger_kernel_to_<model> defaults)


def _attention(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    kind = str(value).strip().lower()
    if kind == "auto":
        c.use(key)  # transformers' own choice (sdpa): cabe's default
    else:
        c.set_known("attention", ATTENTION.get(kind), key)


def _galore(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``use_galore`` -> a GaLore optimizer named by ``optim`` and ``galore_layerwise`` (trainer_utils.py:239-248)."""
    if not _base.as_bool(value, key):
        c.use(key)
        return
    optim = str(data.get("optim") or "adamw_torch").strip().lower()
    base = (
        "galore-adamw-8bit" if optim in GALORE_8BIT else "galore-adafactor" if optim == "adafactor" else "galore-adamw"
    )
    layerwise = _base.as_bool(data.get("galore_layerwise") or False, "galore_layerwise")
    c.set("optimizer", base + ("-layerwise" if layerwise else ""), key)


def _galore_key(field: str, convert: _base.Convert) -> Callable[[Collector, str, Any, Mapping[str, Any]], None]:
    def handle(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
        if _base.as_bool(data.get("use_galore") or False, "use_galore"):
            c.set(field, convert(value, key), key)
        else:
            c.ignore(key, "no_effect")

    return handle


def _galore_target(value: Any, key: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (value.split(",") if isinstance(value, str) else map(str, value)) if n.strip())
    return (ALL_BUT_HEAD,) if names == ("all",) else names


def _optim(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    if _base.as_bool(data.get("use_galore") or False, "use_galore"):
        c.use(key)  # names GaLore's inner optimizer (_galore)
    else:
        _base.set_hf_optimizer(c, key, value)


def _checkpointing_kwargs(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """LLaMA-Factory's patched ``gradient_checkpointing_enable`` hands these to ``torch.utils.checkpoint`` as they are
    (checkpointing.py:140-146): no ``offload`` / ``every_n_layers`` reading as the Trainer's has."""
    c.ignore(key, "not_modeled")


def _use_reentrant(c: Collector, key: str, value: Any, data: Mapping[str, Any]) -> None:
    """``use_reentrant_gc`` (true by default, model_args.py:149-152): cabe models non-reentrant checkpointing."""
    if _base.as_bool(value, key):
        c.ignore(key, "not_modeled")
    else:
        c.use(key)


#: keys that need more than the Trainer's tables
HANDLERS: dict[str, Callable[[Collector, str, Any, Mapping[str, Any]], None]] = {
    "model_name_or_path": lambda c, key, value, data: c.set("model", _base.as_model(value, key), key),
    "finetuning_type": _finetuning,
    "stage": _stage,
    "lora_rank": _lora_only(_base.as_int, "lora_rank"),
    "lora_alpha": _lora_only(_base.as_number, "lora_alpha"),
    "lora_dropout": _lora_only(_base.as_number, "lora_dropout"),
    "use_dora": _lora_only(_base.as_bool, "dora"),
    "lora_target": _lora_target,
    "additional_target": _additional_target,
    "quantization_bit": _quantization,
    "quantization_method": _quantization,
    "quantization_type": _quant_detail("quant", _base.as_str),
    "double_quantization": _quant_detail("double_quant", _base.as_bool),
    "freeze_trainable_layers": _freeze_layers,
    "freeze_trainable_modules": _freeze_modules,
    "cutoff_len": lambda c, key, value, data: c.use(key),  # read by _length
    "packing": _packing,
    "neat_packing": _packing,
    "disable_gradient_checkpointing": lambda c, key, value, data: c.use(key),  # read by _checkpointing
    "gradient_checkpointing": lambda c, key, value, data: c.use(key),
    "use_unsloth_gc": lambda c, key, value, data: None,  # read by _checkpointing
    "use_reentrant_gc": _use_reentrant,
    "gradient_checkpointing_kwargs": _checkpointing_kwargs,
    "pure_bf16": lambda c, key, value, data: c.use(key),  # read by _precision
    "enable_liger_kernel": _liger,
    "flash_attn": _attention,
    "use_galore": _galore,
    "galore_rank": _galore_key("galore_rank", _base.as_int),
    "galore_target": _galore_key("galore_targets", _galore_target),
    "galore_layerwise": lambda c, key, value, data: c.use(key),  # read by _galore
    "optim": _optim,
}
