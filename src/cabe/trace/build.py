"""Building what a trace runs: the transformers model on ``meta`` with the training method applied
(full, freeze, LoRA, QLoRA, prompt tuning). Torch is imported inside the functions.

What a trace needs installed is in :mod:`cabe.trace.deps`; the batch, the optimizer and autocast a traced step runs
with are in :mod:`cabe.trace.inputs`.
"""

from __future__ import annotations

from typing import Any

from cabe.errors import CabeError, ConfigError
from cabe.trace.inputs import has_documents
from cabe.trace.optim import LEARNING_RATE  # noqa: F401  (re-exported)
from cabe.training import TrainingSetup
from cabe.transformers_line import reentrant_checkpointing

_DROP_KEYS = (
    "quantization_config",
    "auto_map",
    "_name_or_path",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "_commit_hash",
    "attn_implementation",
    "_attn_implementation",
)


# ---- the config -------------------------------------------------------------------------------
def hf_config(config: dict[str, Any]) -> Any:
    """A transformers config from a config.json dict; bad input raises :class:`ConfigError`."""
    from transformers import AutoConfig

    if not isinstance(config, dict):
        raise ConfigError("config_not_object", "config")
    model_type = config.get("model_type")
    if not model_type or not isinstance(model_type, str):
        raise ConfigError("missing_model_type", "model_type")
    kwargs = {k: v for k, v in config.items() if k not in _DROP_KEYS and k != "model_type"}
    kwargs["use_cache"] = False
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except ValueError as exc:
        if "Unrecognized model identifier" in str(exc) or model_type in str(exc):
            raise ConfigError("unknown_architecture", "model_type", model_type=model_type) from None
        raise ConfigError("bad_config", None, model_type=model_type, reason=str(exc)[:300]) from None
    except Exception as exc:
        raise ConfigError("bad_config", None, model_type=model_type, reason=str(exc)[:300]) from None
    return cfg


def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def load_dtype(setup: TrainingSetup) -> Any:
    """The dtype the model's parameters are created in (before any method-specific casts)."""
    import torch

    if setup.method == "qlora":
        # QLoRA loads the non-quantised modules in the compute dtype (prepare_model_for_kbit_training
        # then upcasts them to fp32); the 4-bit weights dequantise to it.
        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[setup.compute_dtype]
    return _torch_dtype(setup.dtype)


def _check_documents(model: Any, cfg: Any, setup: TrainingSetup) -> None:
    """Packed rows and padding-free batches tell the documents apart by position_ids (:func:`packed_positions`). A
    model whose ``forward`` takes none (BLOOM's, which positions by ALiBi; transformers 5.24 BloomForCausalLM.forward
    takes them only into ``**kwargs`` and drops them) would run one causal attention across the documents: the
    trace would report an unpacked row as if packed, so it refuses."""
    import inspect

    if has_documents(setup) and "position_ids" not in inspect.signature(model.forward).parameters:
        raise ConfigError("packing_needs_position_ids", "packing", value=setup.packing, model_type=cfg.model_type)


def decoder_layers(model: Any, cfg: Any) -> Any:
    """The ModuleList of decoder layers: the first list of the configured length, else the longest list.

    The length is the config's ``num_hidden_layers`` (``n_layer``), else its text config's, else its
    ``decoder_layers`` / ``num_decoder_layers`` (Blenderbot's and ProphetNet's causal LMs, whose
    ``num_hidden_layers`` counts the encoder they do not build). Among lists of that length a vision or
    audio tower's comes last (Mllama's vision encoder has as many layers as its language model)."""
    import torch

    lists = [(path, mod) for path, mod in model.named_modules() if isinstance(mod, torch.nn.ModuleList) and len(mod)]
    counts = _layer_counts(cfg)
    for n in counts:
        same = [(path, mod) for path, mod in lists if len(mod) == n]
        if same:
            return min(same, key=lambda pm: _is_tower(pm[0]))[1]  # min keeps the first of equals
    if counts or not lists:
        raise ConfigError("no_decoder_layers", None)
    return max(lists, key=lambda pm: len(pm[1]))[1]  # max keeps the first of equals


def _layer_counts(cfg: Any) -> list[int]:
    """The decoder-layer counts a config may give, in the order :func:`decoder_layers` tries them."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    own = _fact(cfg, "num_hidden_layers") or _fact(cfg, "n_layer")
    found = [own, _fact(text, "num_hidden_layers"), _fact(cfg, "decoder_layers"), _fact(cfg, "num_decoder_layers")]
    return [n for n in dict.fromkeys(found) if isinstance(n, int) and not isinstance(n, bool) and n > 0]


def _is_tower(path: str) -> bool:
    """A module path inside a vision or audio tower."""
    return any(word in path.lower() for word in ("vision", "visual", "audio", "speech", "image"))


# ---- the model ----------------------------------------------------------------------------
def build_model(
    config: dict[str, Any], setup: TrainingSetup, notes: list[str], facts: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """The model on ``meta`` with the training method applied. Returns (model, hf config).

    ``notes`` receives the codes of what was done differently from what was asked
    (:func:`cabe.trace.result.note_text` says them); ``facts``, when given, the built model's own facts
    (:func:`model_facts`, read before the method wraps it)."""
    from cabe.trace.attention import register_flash

    cfg = hf_config(config)
    attn = {"eager": "eager", "sdpa": "sdpa", "flash": register_flash()}[setup.attention]
    if setup.attention == "flash":
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg  # a vision-language model's decoder
        head_dim = getattr(text, "head_dim", None) or (text.hidden_size // text.num_attention_heads)
        if head_dim > 256:
            raise ConfigError("flash_head_dim", "attention", head_dim=head_dim, maximum=256)
    dtype = load_dtype(setup)
    model = _from_config(cfg, setup, attn, dtype, notes, _head_kind(config))
    _check_documents(model, cfg, setup)
    if facts is not None:
        facts.update(model_facts(model, cfg))
    model.train()
    if setup.attention == "flash":
        _set_flash_dtype(model, setup)
    model = _METHODS[setup.method](model, cfg, setup, dtype, notes)
    if setup.fp8 != "none":  # torchao's Float8Linear swap, after the method (cabe.trace.fp8)
        from cabe.trace import fp8

        if fp8.convert(model, setup):
            notes.append("trace_fp8_torchao")
    if has_documents(setup) and setup.attention == "flash":
        notes.append("trace_packed_flash_dense")  # flash-attn's varlen kernel is not on this machine
    unmatched = _unmatched_targets(model) if setup.adapters else ()
    if unmatched:  # PEFT dropped them without a word (cabe.method.unmatched_lora_targets says the same)
        notes.append("lora_target_unmatched")
        if facts is not None:
            facts["lora_unmatched"] = ", ".join(unmatched)
    model.train()
    return model, cfg


def _unmatched_targets(model: Any) -> tuple[str, ...]:
    """The names of the adapter's ``target_modules`` (as PEFT kept them: the MoE names it moved onto parameters
    only are gone) that no module matched: PEFT matches a name as the module path or its last part
    (tuners_utils.py ``check_target_module_exists``) and raises only when nothing matches."""
    config = getattr(model, "peft_config", {}).get("default")
    targets = getattr(config, "target_modules", None)
    if not targets or isinstance(targets, str):  # "all-linear" or a regex
        return ()
    names = list(getattr(model, "targeted_module_names", []))
    return tuple(sorted(t for t in targets if not any(n == t or n.endswith("." + t) for n in names)))


def model_facts(model: Any, cfg: Any) -> dict[str, Any]:
    """What the report says about a model, read from the model transformers built (on meta, before any
    training method wraps it) and its config: what a family module's spec says where none exists.

    ``num_layers`` is the length of the decoder-layer list (:func:`decoder_layers`, what ``freeze`` trains
    the top of), ``parameters`` the model's own count (``nn.Module.parameters`` lists a tied embedding
    once), the shape fields the config's (``get_text_config``: the language model of a multimodal one)."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    try:
        num_layers: int | None = len(decoder_layers(model, text))
    except ConfigError:
        num_layers = None
    heads = _fact(text, "num_attention_heads")
    hidden = _fact(text, "hidden_size")
    head_dim = _fact(text, "head_dim") or (hidden // heads if hidden and heads else None)
    return {
        "model_type": cfg.model_type,
        "architecture": type(model).__name__,
        "hidden_size": hidden,
        "num_layers": num_layers,
        "num_heads": heads,
        "num_kv_heads": _fact(text, "num_key_value_heads") or heads,
        "head_dim": head_dim,
        "intermediate_size": _fact(text, "intermediate_size"),
        "vocab_size": _fact(text, "vocab_size"),
        "max_positions": _fact(text, "max_position_embeddings"),
        "tie_word_embeddings": bool(_fact(text, "tie_word_embeddings")),
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def _fact(cfg: Any, name: str) -> Any:
    """A whole number of the config, or None: absent, not one number, or one that varies by layer (transformers
    5.24's heterogeneous configs raise ``AmbiguousGlobalPerLayerAttributeError``, not an AttributeError, for
    ``head_dim`` on Gemma 4: integrations/heterogeneity/configuration_utils.py)."""
    try:
        value = getattr(cfg, name, None)
    except Exception:  # the per-layer attribute error, or any property that refuses
        return None
    return value if isinstance(value, (int, bool)) else None


def _head_kind(config: dict[str, Any]) -> str:
    """The spec's ``head`` kind for this config (``lm`` when no family module reads it)."""
    from cabe import families

    try:
        return families.from_config(config).head
    except CabeError:
        return "lm"


def _auto_class(head: str, cfg: Any) -> Any:
    """The transformers Auto class that builds the spec's head: a causal LM, or (``sequence_classification``)
    ``AutoModelForSequenceClassification``, whose loss is a cross-entropy over ``num_labels`` once
    ``problem_type`` says single-label (what integer labels of shape (batch,) select)."""
    import transformers

    if head == "sequence_classification":
        cfg.problem_type = "single_label_classification"
        return transformers.AutoModelForSequenceClassification
    return _image_text_class(cfg) or transformers.AutoModelForCausalLM


def _image_text_class(cfg: Any) -> Any:
    """``AutoModelForImageTextToText`` for a vision-language model transformers 5.24 does not build as a causal LM
    (Qwen2.5-VL: models/auto/modeling_auto.py maps ``qwen2_5_vl`` to ``Qwen2_5_VLForConditionalGeneration`` only
    there); None otherwise."""
    import transformers
    from transformers.models.auto import modeling_auto as ma

    mt = getattr(cfg, "model_type", "")
    if mt in _PUBLISHED_IMAGE_TEXT:
        return transformers.AutoModelForImageTextToText
    if mt in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or mt not in ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return None
    return transformers.AutoModelForImageTextToText


#: vision-language types transformers 5.24 also maps to a text-only causal LM "for VLM compatibility"
#: (models/auto/modeling_auto.py:941-942: ``Qwen3_5ForCausalLM``, which drops the tower on load), whose
#: checkpoints are published as ``...ForConditionalGeneration``: traced as that class, the tower included
#: (cabe.families.qwen3_5 counts it)
_PUBLISHED_IMAGE_TEXT = ("qwen3_5", "qwen3_5_moe")


def _from_config(cfg: Any, setup: TrainingSetup, attn: str, dtype: Any, notes: list[str], head: str = "lm") -> Any:
    """``AutoModelForCausalLM.from_config`` (or the spec's head's class) on meta; eager attention where
    ``attn`` is not supported."""
    import torch

    auto = _auto_class(head, cfg)
    try:
        with torch.device("meta"):
            try:
                return auto.from_config(cfg, dtype=dtype, attn_implementation=attn)
            except (ValueError, ImportError) as exc:
                if attn == "eager" or ("attn" not in str(exc).lower() and "attention" not in str(exc).lower()):
                    raise
                notes.append("trace_eager_fallback")
                return auto.from_config(cfg, dtype=dtype, attn_implementation="eager")
    except CabeError:
        raise
    except ValueError as exc:
        msg = str(exc)
        if "Unrecognized configuration class" in msg:
            published = _published_class(cfg, dtype, attn)
            if published is not None:
                return published
            raise ConfigError("not_causal_lm", "model_type", model_type=cfg.model_type) from None
        raise ConfigError("bad_config", None, model_type=cfg.model_type, reason=msg[:300]) from None
    except (TypeError, AttributeError, RuntimeError, KeyError, ImportError) as exc:
        raise ConfigError("bad_config", None, model_type=cfg.model_type, reason=str(exc)[:300]) from None


def _published_class(cfg: Any, dtype: Any, attn: str) -> Any:
    """The config's own ``...ForConditionalGeneration`` class (its ``architectures``), for a vision-language model
    ``AutoModelForCausalLM`` does not map (Mistral Small 3.x, ``mistral3``: only AutoModelForImageTextToText builds
    it): the model people load, with its vision tower, fed text alone; None when there is no such class."""
    import torch
    import transformers

    arch = (getattr(cfg, "architectures", None) or [""])[0]
    cls = getattr(transformers, arch, None) if arch.endswith("ForConditionalGeneration") else None
    if cls is None:
        return None
    with torch.device("meta"):
        return cls._from_config(cfg, dtype=dtype, attn_implementation=attn)


def _set_flash_dtype(model: Any, setup: TrainingSetup) -> None:
    """The dtype :func:`cabe.trace.attention.flash_attention_forward` casts fp32 inputs to."""
    import torch

    for m in model.modules():
        m._cabe_flash_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.compute_dtype, torch.bfloat16)


def _full(model: Any, cfg: Any, setup: TrainingSetup, dtype: Any, notes: list[str]) -> Any:
    if setup.checkpointing:
        _enable_checkpointing(model, setup)
    return model


def _enable_checkpointing(model: Any, setup: TrainingSetup) -> None:
    """Gradient checkpointing as transformers 5.24 applies it: non-reentrant ``torch.utils.checkpoint`` on
    every ``checkpoint_every``-th decoder layer (modeling_utils.py:3221-3247, ``every_n_layers``: the layers
    whose index is a multiple of it, the bottom one first), their saved inputs in pinned host memory with
    ``offload_activations`` (modeling_utils.py:3161-3167: ``save_on_cpu(pin_memory=True)`` around each
    checkpoint). torchtune wraps its layers the same way (non-reentrant ``checkpoint``,
    torchtune/training/activations.py:19-57), but counts them from 1: its ``ac_option: k`` checkpoints the
    k-th, 2k-th ... layer (activations.py:44-47)."""
    from cabe.trace import compat

    reentrant = reentrant_checkpointing(setup.transformers_line)  # the Trainer passes no kwargs: the line's default
    if not hasattr(model, "activation_checkpointing_enable"):
        # transformers 4.57.6: gradient_checkpointing_enable(gradient_checkpointing_kwargs) checkpoints every
        # decoder layer (modeling_utils.py:3674-3725), with no every_n_layers and no offload
        if setup.checkpoint_every != 1 or setup.offload_activations:
            field = "checkpoint_every" if setup.checkpoint_every != 1 else "offload_activations"
            raise compat.refuse_option(field, "PreTrainedModel.activation_checkpointing_enable")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        return
    # (the Trainer's call: trainer.py:1503-1515; gradient_checkpointing_enable is its deprecated alias; reentrant
    # on 4.x, cabe.transformers_line)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": reentrant},
        every_n_layers=setup.checkpoint_every,
        offload=setup.offload_activations,
    )


def _freeze(model: Any, cfg: Any, setup: TrainingSetup, dtype: Any, notes: list[str]) -> Any:
    import torch

    for p in model.parameters():
        p.requires_grad_(False)
    layers = decoder_layers(model, cfg)
    k = min(setup.trainable_layers, len(layers))
    for layer in list(layers)[len(layers) - k :]:
        for p in layer.parameters():
            p.requires_grad_(True)
            if setup.trainable_fp32:  # LLaMA-Factory's cast_trainable_params_to_fp32 (model/adapter.py:129-134)
                p.data = p.data.to(torch.float32)
    if setup.checkpointing:
        _enable_checkpointing(model, setup)
    return model


def _lora(model: Any, cfg: Any, setup: TrainingSetup, dtype: Any, notes: list[str]) -> Any:
    """LoRA, or QLoRA (the linear layers quantised to 4 bits on meta first)."""
    from peft import LoraConfig

    if setup.method == "qlora":
        from cabe.trace.quant import quantize_on_meta

        quantize_on_meta(model, setup, dtype)
    if setup.method == "qlora" and setup.kbit_prep:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=setup.checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": reentrant_checkpointing(setup.transformers_line)},
        )
        if setup.checkpointing and (setup.checkpoint_every > 1 or setup.offload_activations):
            _enable_checkpointing(model, setup)  # PEFT enabled it on every layer, without offloading
    elif setup.checkpointing:
        # LoRA, and QLoRA without k-bit preparation (unsloth, LLaMA-Factory): the rest of the model stays as loaded
        _enable_checkpointing(model, setup)
        model.enable_input_require_grads()
    if setup.dora and setup.method == "qlora":
        # DoRA dequantizes each 4-bit weight in every forward (peft/utils/integrations.py,
        # dequantize_module_weight), which the 4-bit weights quantized on meta cannot do
        raise ConfigError("dora_qlora_not_traceable", "dora")
    targets: Any = list(setup.lora_targets) or None  # None: PEFT's default for the model type
    if targets == ["all-linear"]:
        targets = "all-linear"
    elif targets and "all-linear" in targets:
        targets = _all_linear_and(model, cfg, targets)
    lcfg = LoraConfig(
        r=setup.lora_rank,
        lora_alpha=setup.lora_alpha,  # type: ignore[arg-type]  # PEFT annotates int, uses it as a float scale
        target_modules=targets,
        lora_dropout=setup.lora_dropout,
        use_dora=setup.dora,
        modules_to_save=list(setup.modules_to_save) or None,  # trained whole beside the adapters
        bias="none",
        task_type=_peft_task(cfg),
    )
    try:
        return _peft_model(model, lcfg, targets, notes, _default_targets(cfg), setup.adapter_dtype == "fp32")
    except CabeError:
        raise
    except ValueError as exc:
        raise ConfigError(
            "bad_lora_targets",
            "lora_targets",
            targets=",".join(setup.lora_targets) or "(peft default)",
            reason=str(exc)[:300],
        ) from None


def _all_linear_and(model: Any, cfg: Any, targets: list[str]) -> list[str]:
    """``all-linear`` beside other names (``all-linear,lm_head``): PEFT reads the shorthand only as the whole
    ``target_modules`` string (peft tuners/tuners_utils.py, ``_maybe_include_all_linear_layers``); in a list it is
    one more module name that matches nothing. The user means every linear layer and the others, so the
    shorthand is expanded here with PEFT's own function and the other names added."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import _maybe_include_all_linear_layers

    probe = LoraConfig(target_modules="all-linear", task_type=_peft_task(cfg))
    linear = set(_maybe_include_all_linear_layers(probe, model).target_modules)  # type: ignore[attr-defined]
    return sorted(linear | _moe_all_linear_names(model) | {t for t in targets if t != "all-linear"})


def _moe_all_linear_names(model: Any) -> set[str]:
    """For a model type whose experts transformers 5 fused (PEFT's ``_MOE_TARGET_MODULE_MAPPING``), the v4 names
    ``all-linear`` alone resolves to besides the linears: the experts' projections and the router (peft 0.22.0
    utils/transformers_weight_conversion.py:370-374, ``_resolve_string_target_modules``), which PEFT then turns into
    targets on the fused parameters (keeping the names on the linears where every module they match is one,
    :492-503). The table is PEFT's own copy of transformers' (0.22.0 adds qwen2_moe, :46). Expanded by hand beside other names, the shorthand must reach them too (Qwen3-MoE QLoRA
    ``all-linear,embed_tokens`` traced without the experts' LoRA: the estimate read +30%)."""
    from peft.utils import transformers_weight_conversion as twc

    base = twc._MODEL_TO_CONVERSION_PATTERN.get(str(getattr(model.config, "model_type", "")))
    if base is None or not twc._MOE_FUSED_TARGETS.get(base):
        return set()
    return set(twc._MOE_TARGET_MODULE_MAPPING.get(base) or {})


def _default_targets(cfg: Any) -> tuple[str, ...]:
    """The spec's PEFT default targets for this config, or () when no family module reads it."""
    from cabe import families

    try:
        return families.from_config(cfg.to_dict()).peft_default_targets
    except CabeError:
        return ()


def _peft_task(cfg: Any) -> str:
    """PEFT's task type for the head :func:`_auto_class` built: ``SEQ_CLS`` wraps a classifier (and makes
    its ``classifier`` a trainable module to save, peft/utils/constants.py), ``CAUSAL_LM`` a causal LM."""
    return "SEQ_CLS" if getattr(cfg, "problem_type", None) == "single_label_classification" else "CAUSAL_LM"


def _peft_model(
    model: Any, lcfg: Any, targets: Any, notes: list[str], default: tuple[str, ...] = (), fp32_adapters: bool = True
) -> Any:
    """``default``: the family's PEFT targets (``ModelSpec.peft_default_targets``), for a model whose config type
    PEFT does not key (AutoModelForCausalLM builds Llama 4's decoder as ``llama4_text``, PEFT keys ``llama4``).
    ``fp32_adapters``: PEFT's ``autocast_adapter_dtype`` (False: the adapters in the base weights' dtype)."""
    import functools

    from peft import get_peft_model as _get

    get_peft_model = functools.partial(_get, autocast_adapter_dtype=fp32_adapters)

    try:
        _check_wrappable(model, lcfg.target_modules)
        return get_peft_model(model, lcfg)
    except ValueError as exc:
        if targets is not None or "target_modules" not in str(exc):
            raise
        if default and default != ("all-linear",):
            notes.append("trace_lora_family_default")
            lcfg.target_modules = list(default)
            _check_wrappable(model, lcfg.target_modules)
            return get_peft_model(model, lcfg)
        # PEFT knows no default targets for this architecture: adapt every linear layer
        notes.append("trace_lora_all_linear")
        lcfg.target_modules = "all-linear"
        _check_wrappable(model, lcfg.target_modules)
        return get_peft_model(model, lcfg)


def _check_wrappable(model: Any, target_modules: Any) -> None:
    """Refuse, before the step, an ``nn.Linear`` subclass PEFT would wrap whose forward is not a linear map of its
    last dimension. PEFT wraps every ``isinstance(m, nn.Linear)`` (peft/tuners/lora/model.py 0.21.2,
    ``_create_new_module``) and adds ``lora_B(lora_A(x))``, (…, out_features), to what the module returns
    (tuners/lora/layer.py ``Linear.forward``, :1102): DeepSeek-V4's ``DeepseekV4GroupedLinear`` (``o_a_proj``, a
    block-diagonal projection returning (…, groups, out_features / groups)) cannot take it, nor Llama 4's router
    (a tuple). Probed on meta: the module's forward on (2, in_features) must give (2, out_features)."""
    import torch

    if target_modules is None:  # PEFT's own default names for the model type
        return
    wanted = (
        None
        if target_modules == "all-linear"
        else set([target_modules] if isinstance(target_modules, str) else target_modules)
    )
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    broken: dict[str, str] = {}
    for name, m in model.named_modules():
        if type(m) is torch.nn.Linear or not isinstance(m, torch.nn.Linear) or m is head:
            continue
        if type(m).__module__.startswith("bitsandbytes"):  # QLoRA's 4-bit layers: PEFT has its own wrapper for them
            continue
        leaf = name.rsplit(".", 1)[-1]
        if (wanted is not None and leaf not in wanted and name not in wanted) or leaf in broken:
            continue
        try:
            with torch.no_grad():
                out = m(torch.empty(2, m.in_features, device="meta", dtype=m.weight.dtype))
            ok = isinstance(out, torch.Tensor) and tuple(out.shape) == (2, m.out_features)
        except Exception:  # its forward wants another input shape: not a linear map PEFT can add to
            ok = False
        if not ok:
            broken[leaf] = type(m).__name__
    if broken:
        raise ConfigError(
            "lora_target_not_linear",
            "lora_targets",
            value=", ".join(f"{n} ({c})" for n, c in sorted(broken.items())),
        )


def _prompt_tuning(model: Any, cfg: Any, setup: TrainingSetup, dtype: Any, notes: list[str]) -> Any:
    from peft import PromptTuningConfig, get_peft_model

    if setup.checkpointing:
        _enable_checkpointing(model, setup)
        model.enable_input_require_grads()
    return get_peft_model(model, PromptTuningConfig(task_type=_peft_task(cfg), num_virtual_tokens=setup.prompt_tokens))


_METHODS = {"full": _full, "freeze": _freeze, "lora": _lora, "qlora": _lora, "prompt-tuning": _prompt_tuning}
