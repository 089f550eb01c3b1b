"""An unsloth training script's arguments, written down as YAML or JSON (docs/unsloth-config.md).

unsloth has no config file: a run is a Python script. cabe reads the keyword arguments of its three calls,
one section each (the section names as the script spells the calls are accepted too)::

    from_pretrained:      # FastLanguageModel.from_pretrained(...)
      model_name: unsloth/Meta-Llama-3.1-8B-bnb-4bit
      max_seq_length: 2048
      load_in_4bit: true
    get_peft_model:       # FastLanguageModel.get_peft_model(model, ...)
      r: 16
      target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
      use_gradient_checkpointing: unsloth
    args:                 # SFTConfig(...) / TrainingArguments(...), read as cabe.configs.training_args reads them
      per_device_train_batch_size: 2
      gradient_accumulation_steps: 4
      bf16: true
      optim: adamw_8bit
    trainer:              # SFTTrainer(...)'s other keyword arguments (max_seq_length, packing), optional

Sources: unsloth commit 015bdef (2026.10), unsloth-zoo commit ce232d6.

* ``from_pretrained`` (unsloth/models/loader.py:410-440): ``load_in_4bit=True`` by default (QLoRA with
  bitsandbytes NF4 and double quantization, unsloth/models/llama.py:2620-2626), ``load_in_16bit`` /
  ``load_in_4bit: false`` a 16-bit base (LoRA), ``full_finetuning`` full fine-tuning; ``load_in_8bit`` and
  ``load_in_fp8`` are not modelled. ``dtype: null`` is bf16 where the GPU has it (llama.py:2434-2435);
  ``max_seq_length`` 2048 by default.
* ``get_peft_model`` (llama.py:3061-3090): ``r=16``, the seven projections, ``lora_alpha=16``,
  ``lora_dropout=0``; ``embed_tokens`` among the targets is trained whole as ``modules_to_save``
  (llama.py:3318-3328: cabe's ``modules_to_save``), ``lm_head`` is a LoRA target since unsloth #4106
  (llama.py:3302-3312, ``accepted_modules``; it was moved to ``modules_to_save`` before); ``modules_to_save``
  itself takes ``lm_head`` / ``embed_tokens`` only (llama.py:3380-3390). NOTE: with ``use_gradient_checkpointing=
  "unsloth"`` unsloth moves the frozen originals to disk (llama.py:3468-3483, ``offload_input_embeddings``) and an
  fp16 copy to fp32 (``_offload_frozen_module_for_training``, llama.py:162-189): cabe counts PEFT's own wrapper (the
  original beside the copy, in its dtype), listed as not modelled. ``use_dora`` arrives through its ``**kwargs``
  (llama.py:3166-3172).
* ``use_gradient_checkpointing`` (``"unsloth"`` by default in both calls): ``"unsloth"`` checkpoints every
  layer and copies its input to pinned host buffers (unsloth_zoo/gradient_checkpointing.py:705-886,
  ``UnslothCheckpointFunction``: ``x.copy_(arg, non_blocking=True)`` into ``CPU_BUFFERS``), cabe's
  ``offload_activations``; below 512 tokens it is plain checkpointing (unsloth/models/_utils.py:374-378);
  ``True`` plain checkpointing, ``False`` none. The model's setting wins over the Trainer's
  ``gradient_checkpointing`` (unsloth/models/rl.py:439-446, ``_unsloth_gradient_checkpointing``).
* The sequence: unsloth's SFTTrainer sets ``max_length`` to the Trainer's ``max_seq_length`` when given (capped
  at the model's), else to ``from_pretrained``'s ``max_seq_length`` (unsloth/models/rl.py:2509-2551): the
  SFTConfig's ``max_length`` is replaced.
* Batches: unsloth turns TRL's padding-free batching on when neither ``packing`` nor ``padding_free`` is
  said (unsloth/trainer.py:903-912, ``_should_auto_padding_free``; not for gemma2 / gpt_oss,
  trainer.py:102-105, which cabe cannot tell from a name): cabe's ``padding-free``.
* Loss and kernels: unsloth's fused cross-entropy and Triton kernels come with the recipe
  (cabe/data/recipes/unsloth.json): ``loss: liger`` stands for the chunked lm_head + cross-entropy, the rest is
  listed as not modelled by the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import models
from cabe.configs import _base, bnb, training_args
from cabe.configs._base import Collector
from cabe.errors import ConfigError

FORMAT = "unsloth"
TITLE = "unsloth training-script arguments"

#: the sections, each under the names a script might give it
SECTIONS: dict[str, tuple[str, ...]] = {
    "from_pretrained": ("from_pretrained", "FastLanguageModel.from_pretrained", "FastModel.from_pretrained"),
    "get_peft_model": ("get_peft_model", "FastLanguageModel.get_peft_model", "FastModel.get_peft_model"),
    "args": ("args", "SFTConfig", "TrainingArguments", "training_args"),
    "trainer": ("trainer", "SFTTrainer"),
}
#: unsloth's defaults (module docstring)
DEFAULT_MAX_SEQ = 2048
DEFAULT_RANK = 16
DEFAULT_ALPHA = 16.0
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: below this many tokens "unsloth" checkpointing does not offload (unsloth/models/_utils.py:374-378)
OFFLOAD_MIN_SEQ = 512
#: a target unsloth trains whole (modules_to_save), not as LoRA (llama.py:3318-3328)
WHOLE_MODULES = ("embed_tokens",)
#: what unsloth's modules_to_save accepts (llama.py:3380-3390)
SAVE_MODULES = ("embed_tokens", "lm_head")

#: from_pretrained keys that change memory in ways cabe does not model (loader.py:410-440)
PRETRAINED_NOT_MODELED = {
    "load_in_8bit",
    "load_in_fp8",
    "offload_embedding",
    "fast_inference",  # vLLM in the same process, gpu_memory_utilization of the card
    "float32_mixed_precision",
    "qat_scheme",
    "unsloth_tiled_mlp",
    "resize_model_vocab",
}
PEFT_NOT_MODELED = {
    "layers_to_transform",
    "layers_pattern",
    "finetune_last_n_layers",
    "target_parameters",
    "qat_scheme",
    "loftq_config",
}


def read(path_or_dict: Any) -> Mapping[str, Any]:
    return _base.read(path_or_dict)


def _section(data: Mapping[str, Any], name: str) -> tuple[str | None, Mapping[str, Any]]:
    for key in SECTIONS[name]:
        value = data.get(key)
        if isinstance(value, Mapping):
            return key, value
    return None, {}


def looks_like(data: Mapping[str, Any]) -> bool:
    return any(_section(data, s)[0] for s in ("from_pretrained", "get_peft_model"))


def to_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[tuple[str, str]]]:
    """Request fields, the fields used, and the ``(field, reason)`` pairs ignored."""
    return collect(data).result()


def collect(data: Mapping[str, Any]) -> Collector:
    c = Collector()
    known = {k for names in SECTIONS.values() for k in names}
    for key in data:
        if key not in known:
            c.ignore(key, "unknown")
    pre_name, pre = _section(data, "from_pretrained")
    peft_name, peft = _section(data, "get_peft_model")
    args_name, args = _section(data, "args")
    trainer_name, trainer = _section(data, "trainer")
    full = _base.as_bool(pre.get("full_finetuning", False), f"{pre_name}.full_finetuning")
    if not full and peft_name is None:
        raise ConfigError(
            "cfg_unsupported",
            "get_peft_model",
            value="(absent)",
            allowed="a get_peft_model section, or from_pretrained.full_finetuning: true",
        )
    model_seq = _from_pretrained(c, pre_name or "from_pretrained", pre, full)
    gc: Any = pre.get("use_gradient_checkpointing", "unsloth")
    gc_source = f"{pre_name}.use_gradient_checkpointing"
    if not full:
        _peft(c, peft_name or "get_peft_model", peft)
        gc, gc_source = peft.get("use_gradient_checkpointing", "unsloth"), f"{peft_name}.use_gradient_checkpointing"
    elif peft_name is not None:
        c.ignore(peft_name, "overridden")  # full_finetuning: no adapters
    seq = _trainer_args(c, args_name, args, trainer_name, trainer, model_seq)
    _checkpointing(c, gc, gc_source, seq)
    c.fields.setdefault("recipe", "unsloth")  # an unsloth script is an unsloth run (data/recipes/unsloth.json)
    return c


def _dtype(value: Any, source: str) -> str:
    d = _base.dtype(value)
    if d is None:
        raise ConfigError("cfg_bad_value", source, value=str(value), expected="null, bfloat16, float16, float32")
    return d


def _from_pretrained(c: Collector, name: str, pre: Mapping[str, Any], full: bool) -> int:
    """The base model and how it is loaded; returns its ``max_seq_length``."""
    p = f"{name}."
    four_bit = (
        _base.as_bool(pre.get("load_in_4bit", True), p + "load_in_4bit")
        and not _base.as_bool(pre.get("load_in_16bit", False), p + "load_in_16bit")
        and not full
    )
    method = "full" if full else "qlora" if four_bit else "lora"
    c.fields["method"] = method
    c.origin["method"] = p + ("full_finetuning" if full else "load_in_4bit")
    # dtype None: bf16 where supported (llama.py:2434-2435)
    c.fields["_dtype"] = "bf16" if pre.get("dtype") is None else _dtype(pre.get("dtype"), p + "dtype")
    c.origin["_dtype"] = p + "dtype"
    if four_bit:  # llama.py:2620-2626: NF4, double quantization
        c.fields.update({"quant": "nf4", "double_quant": True})
    max_seq = DEFAULT_MAX_SEQ
    for key, value in pre.items():
        source = p + key
        if key in ("model_name", "model"):
            c.set("model", _model_name(value), source)
        elif key == "max_seq_length":
            max_seq = _base.as_int(value, source)
            c.use(source)
        elif key in ("load_in_4bit", "load_in_16bit", "full_finetuning", "dtype", "use_gradient_checkpointing"):
            c.use(source)
        elif key == "quantization_config" and isinstance(value, Mapping) and four_bit:
            _quantization_config(c, source, value)
        elif key in PRETRAINED_NOT_MODELED and value not in (None, False, {}):
            c.ignore(source, "not_modeled")
        else:
            c.ignore(source, "no_effect")
    return max_seq


#: the suffixes of unsloth's own uploads of a model (pre-quantized 4-bit weights: the same architecture)
UPLOAD_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit", "-unsloth")


def _model_name(value: Any) -> str:
    """A preset for unsloth's mirrors of a model: ``unsloth/Meta-Llama-3.1-8B-bnb-4bit`` is Meta's
    ``Llama-3.1-8B`` (the Hub's older ``Meta-Llama-3.1`` name), 4-bit weights of the same architecture."""
    name = _base.model_name(str(value))
    org, _, repo = str(value).strip().partition("/")
    if name != str(value).strip() or org.lower() != "unsloth" or not repo:
        return name
    repo = repo.lower()
    for suffix in UPLOAD_SUFFIXES:
        repo = repo.removesuffix(suffix)
    return models.preset_for_repo(repo) or models.preset_for_repo(repo.removeprefix("meta-")) or name


def _quantization_config(c: Collector, source: str, value: Mapping[str, Any]) -> None:
    """A ``BitsAndBytesConfig`` handed to from_pretrained: read as :mod:`cabe.configs.bnb` reads one."""
    sub, used, ignored = bnb.to_request(value)
    for field, v in sub.items():
        if field != "method":
            c.fields[field] = v
    c.used += [f"{source}.{u}" for u in used]
    c.ignored += [(f"{source}.{f}", r) for f, r in ignored]


def _peft(c: Collector, name: str, peft: Mapping[str, Any]) -> None:
    """get_peft_model's keyword arguments over unsloth's defaults (llama.py:3061-3090)."""
    p = f"{name}."
    c.fields.update({"lora_rank": DEFAULT_RANK, "lora_alpha": DEFAULT_ALPHA, "lora_targets": DEFAULT_TARGETS})
    for key, value in peft.items():
        source = p + key
        if key == "r":
            c.fields["lora_rank"] = _base.as_int(value, source)
            c.use(source)
        elif key == "lora_alpha":
            c.fields["lora_alpha"] = _base.as_number(value, source)
            c.use(source)
        elif key == "lora_dropout":
            c.set("lora_dropout", _base.as_number(value, source), source)
        elif key == "use_dora":
            c.set("dora", _base.as_bool(value, source), source)
        elif key == "target_modules":
            _targets(c, source, value)
        elif key == "modules_to_save":
            _save(c, source, value)
        elif key == "use_gradient_checkpointing":
            c.use(source)  # read by _checkpointing
        elif key == "bias":
            if str(value) == "none":
                c.use(source)
            else:
                c.ignore(source, "not_modeled")
        elif key in PEFT_NOT_MODELED and value not in (None, False, {}, []):
            c.ignore(source, "not_modeled")
        else:
            c.ignore(source, "no_effect")  # random_state, use_rslora, init_lora_weights, max_seq_length (unused)


def _targets(c: Collector, source: str, value: Any) -> None:
    names = _base.as_targets(value, source)
    lora = tuple(n for n in names if n not in WHOLE_MODULES)
    whole = [n for n in names if n in WHOLE_MODULES]
    if not lora:
        raise ConfigError("cfg_bad_value", source, value=", ".join(names), expected="at least one LoRA target")
    c.fields["lora_targets"] = lora
    c.use(source)
    if whole:  # trained whole as modules_to_save (llama.py:3318-3328)
        _add_saved(c, whole)


def _save(c: Collector, source: str, value: Any) -> None:
    """``modules_to_save``: lm_head / embed_tokens trained whole (llama.py:3380-3390 refuses other names)."""
    if value in (None, [], ()):
        c.use(source)
        return
    names = list(_base.as_targets(value, source))
    bad = [n for n in names if n not in SAVE_MODULES]
    if bad:
        raise ConfigError("cfg_bad_value", source, value=", ".join(bad), expected=", ".join(SAVE_MODULES))
    _add_saved(c, names)
    c.use(source)


def _add_saved(c: Collector, names: list[str]) -> None:
    saved = tuple(dict.fromkeys((*c.fields.get("modules_to_save", ()), *names)))
    c.fields["modules_to_save"] = saved
    c.origin.setdefault("modules_to_save", "get_peft_model")
    # unsloth's own handling of them (the originals to disk, fp16 copies in fp32) is not PEFT's
    c.ignore("get_peft_model.modules_to_save.offload", "not_modeled")


def _trainer_args(
    c: Collector,
    args_name: str | None,
    args: Mapping[str, Any],
    trainer_name: str | None,
    trainer: Mapping[str, Any],
    model_seq: int,
) -> int:
    """The Trainer's arguments (SFTConfig over SFTTrainer's own keywords), the sequence length and the batch
    layout; returns the sequence length."""
    merged = {**trainer, **args}
    names = {k: f"{trainer_name}.{k}" for k in trainer} | {k: f"{args_name}.{k}" for k in args}
    asked = merged.get("max_seq_length")
    seq = min(_base.as_int(asked, names["max_seq_length"]), model_seq) if asked is not None else model_seq
    sub = training_args.collect({k: v for k, v in merged.items() if k not in _DECIDED_HERE})
    _absorb(c, sub, names)
    for k in merged:
        if k in ("max_seq_length",):
            c.use(names[k])
        elif k in _DECIDED_HERE:
            c.ignore(names[k], "overridden")
    _autocast(c)
    c.fields["seq"] = seq
    c.origin["seq"] = names.get("max_seq_length", "from_pretrained.max_seq_length")
    if "packing" not in c.fields and merged.get("padding_free") is None and not merged.get("packing"):
        c.fields["packing"] = "padding-free"  # trainer.py:903-912: padding-free auto-enabled
        c.origin["packing"] = "(unsloth default)"
    return seq


#: Trainer keys unsloth decides itself: the sequence (rl.py:2509-2551) and checkpointing (rl.py:439-446)
_DECIDED_HERE = ("max_seq_length", "max_length", "gradient_checkpointing", "activation_checkpointing")


def _absorb(c: Collector, sub: Collector, names: Mapping[str, str]) -> None:
    """The Trainer arguments' fields, their sources named by their section (``args.bf16``)."""

    def named(src: str) -> str:
        head, dot, rest = src.partition(".")
        return names.get(head, head) + dot + rest

    for field, value in sub.fields.items():
        c.fields[field] = value
        c.origin.setdefault(field, named(sub.origin.get(field, field)))
    c.used += [named(u) for u in sub.used]
    c.ignored += [(named(f), r) for f, r in sub.ignored]


def _autocast(c: Collector) -> None:
    """Neither bf16 nor fp16 on: unsloth turns autocast on in the model's 16-bit dtype (rl.py:2414-2420)."""
    if "precision" not in c.fields:
        c.fields["autocast"] = "fp16" if c.fields.get("_dtype") == "fp16" else "bf16"
        c.origin["autocast"] = "(unsloth default)"


def _checkpointing(c: Collector, value: Any, source: str, seq: int) -> None:
    """``use_gradient_checkpointing``: "unsloth" (offloaded from 512 tokens on), True, False."""
    if isinstance(value, str) and value.strip().lower() == "unsloth":
        c.fields["checkpointing"] = True
        c.fields["offload_activations"] = seq >= OFFLOAD_MIN_SEQ
    else:
        c.fields["checkpointing"] = _base.as_bool(value, source)
        c.fields["offload_activations"] = False
    c.origin.setdefault("checkpointing", source)
