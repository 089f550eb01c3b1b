"""The report's notes and JSON sections that are not figures: what is modelled rather than traced, what the
request asked that a recipe or the model does not have, the host memory, the model summary. Proved by
tests/test_silent_knobs.py, tests/test_recipes.py and tests/cli/test_notes_printed.py."""

from __future__ import annotations

from typing import Any

from cabe import memo, recipes, ssm, transformers_line
from cabe.analytic.runs import _Activations
from cabe.analytic.states import _States
from cabe.architecture import ModelSpec
from cabe.facts import attention_kind, sdpa_gqa_math
from cabe.method import moved_targets, unmatched_lora_targets
from cabe.optimizer import get as optimizer_entry
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup


def _model_notes(spec: ModelSpec, setup: TrainingSetup, states: _States) -> tuple[str, ...]:
    """The notes of the model and the request: independent of the batch and the sequence, so once per states and
    request less its shape (cabe.memo)."""
    key = ("notes", memo.request_key(setup))
    hit = states.memo.get(key)
    if hit is None:
        hit = states.memo[key] = _compute_model_notes(spec, setup, states)
    return hit


def _compute_model_notes(spec: ModelSpec, setup: TrainingSetup, states: _States) -> tuple[str, ...]:
    notes: list[str] = []
    if attention_kind(spec, setup) == "eager" and setup.attention != "eager":
        notes.append("gemma2_eager")
    if sdpa_gqa_math(spec, setup, dtypes_for(setup).compute):
        notes.append("sdpa_gqa_math")
    if states.opt.paged_bytes:
        notes.append("paged_outside_allocator")
    if setup.fp8 != "none":  # what the recipe keeps in fp8 and in high precision (cabe.fp8)
        notes.append("fp8_te" if setup.fp8.startswith("te-") else "fp8_torchao")
    opt = optimizer_entry(setup.optimizer)
    if opt.modelled:
        notes.append("optimizer_modelled")
    if opt.layerwise:
        notes.append("optimizer_layerwise")
    elif setup.optimizer_in_backward:
        notes.append("optimizer_in_backward")
    if setup.grad_accum > 1:
        notes.append("grad_accum_keeps_grads")
    if setup.checkpointing and setup.offload_activations:
        notes.append("activations_offloaded")
    if setup.packing != "none":
        notes.append("packing_modelled")
    notes += _loss_notes(setup)
    if setup.dora and setup.method == "qlora":
        notes.append("dora_qlora_modelled")  # the trace cannot dequantize its meta 4-bit weights
    if setup.method == "qlora" and not setup.kbit_prep:
        notes.append("qlora_no_kbit_prep")
    if setup.method == "qlora" and any(lin.role == "expert" and not lin.quantized_by_bnb for lin in spec.layer_linears):
        # transformers 5 stores MoE experts as fused 3-D parameters; its bitsandbytes integration replaces
        # only `type(module) is nn.Linear` and Conv1D (integrations/bitsandbytes.py, replace_with_bnb_linear),
        # and prepare_model_for_kbit_training casts what is left in 16 bits to fp32 (without it: 16 bits)
        notes.append("qlora_moe_experts_unquantized" if setup.kbit_prep else "qlora_moe_experts_16bit")
    if spec.vision is not None:  # a tower whose images cabe models (cabe.vision)
        kind = "" if spec.vision.kind == "qwen2_5_vl" else "_" + spec.vision.kind  # each processor its own words
        notes.append("vision_images" + kind if setup.images else "vision_text_only")
    elif spec.vision_parameters:  # Gemma 3's SigLIP tower: weights only, text-only batches never run it
        notes.append("vision_tower_weights_only")
        if spec.causal_lm_drops_tower:  # (Llama 4: cabe.families.llama4)
            notes.append("llama4_causal_lm_drops_tower")
    if setup.adapters and unmatched_lora_targets(spec, setup.lora_targets):
        notes.append("lora_target_unmatched")  # the names: extra["lora_unmatched"] (render fills the note)
    if setup.adapters and moved_targets(spec, setup.lora_targets):
        notes.append("lora_targets_moved_to_experts")
    if setup.adapters and not moved_targets(spec, setup.lora_targets) and _bare_experts(spec):
        # PEFT matches target_modules against modules (tuners_utils.py check_target_module_exists, 0.22.0) and wraps
        # nn.Linear / Conv1D ones; the fused 3-D experts and a bare router weight are neither, and for this model
        # type or these targets nothing moves onto them (transformers_weight_conversion.py _convert_peft_config_moe,
        # 0.22.0 :411-532; cabe.method.moved_targets)
        notes.append("lora_experts_not_adapted")
    if setup.transformers_line < 5:
        notes += _transformers4_notes(spec, setup)
    if any(g.mixer == "gated_deltanet" for g in spec.layer_groups):  # fla's / causal-conv1d's saved tensors
        notes.append("gated_deltanet_kernels_modelled")
    return tuple(notes + ssm.notes(spec))


def _transformers4_notes(spec: ModelSpec, setup: TrainingSetup) -> list[str]:
    """What a transformers 4.x run differs in (cabe.transformers_line); ``setup`` is resolved."""
    notes = []
    if setup.checkpointing:
        notes.append("transformers4_reentrant")
    if any(lin.role == "expert" and lin.is_module for lin in spec.layer_linears):
        notes.append("transformers4_moe_modules")
    return notes


def _bare_experts(spec: ModelSpec) -> bool:
    """Whether the model's routed experts are bare parameters (transformers 5's fused 3-D stacks), not modules."""
    return any(lin.role == "expert" and not lin.is_module for lin in spec.layer_linears)


def _loss_notes(setup: TrainingSetup) -> list[str]:
    """The loss and recipe the report assumed, and what of them is modelled rather than traced."""
    notes = []
    if setup.loss is None:
        notes.append("loss_assumed_hf")  # no --loss and no recipe that sets one: transformers' own loss
    if setup.resolved_loss in ("liger", "cce"):
        notes.append("loss_modelled")  # Triton kernels: modelled from their source, not traced
    if setup.recipe is not None and recipes.unmodelled(setup.recipe):
        notes.append("recipe_unmodelled")
    return notes


def _host_json(spec: ModelSpec, act: _Activations) -> dict[str, Any]:
    """Activation offloading: the host RAM the offloaded inputs take, all of it pinned (page-locked:
    ``save_on_cpu(pin_memory=True)``, torch/autograd/graph.py:400-414), held from forward to backward."""
    host = act.offloaded_bytes(spec.num_layers)
    if not host:
        return {}
    return {"host": {"offloaded_activations_bytes": host, "pinned_bytes": host}}


def _unmatched_json(spec: ModelSpec, setup: TrainingSetup) -> dict[str, Any]:
    """The LoRA targets that match no module (PEFT drops them), named for the note ``lora_target_unmatched``."""
    unmatched = unmatched_lora_targets(spec, setup.lora_targets) if setup.adapters else ()
    return {"lora_unmatched": ", ".join(unmatched)} if unmatched else {}


def _recipe_json(setup: TrainingSetup) -> dict[str, Any]:
    """What the report says of the recipe and loss: the recipe (or none), the loss, what was assumed."""
    return {
        "recipe": setup.recipe,
        "loss": setup.resolved_loss,
        "loss_chunks": setup.loss_chunks if setup.resolved_loss == "chunked" else None,
        "assumed": [k for k, v in (("recipe", setup.recipe), ("loss", setup.loss)) if v is None],
        "unmodelled": list(recipes.unmodelled(setup.recipe)) if setup.recipe else [],
    }


def _model_json(spec: ModelSpec, meta: dict[str, Any] | None) -> dict[str, Any]:
    """The model's summary: built once per model (cabe.memo), copied for each report (its caller may change it)."""
    m = memo.of(spec)
    base = m.get("model_json")
    if base is None:
        base = m["model_json"] = _build_model_json(spec)
    out = dict(base)
    out["parameter_breakdown"] = dict(base["parameter_breakdown"])
    if meta:
        out.update(meta)
    return out


def _build_model_json(spec: ModelSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "model_type": spec.model_type,
        "hidden_size": spec.hidden_size,
        "num_layers": spec.num_layers,
        "num_heads": spec.num_heads,
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "parameter_breakdown": spec.parameter_breakdown(),
    }


_SETUP_JSON: dict[Any, tuple[dict[str, Any], tuple[str, ...]]] = {}


def _setup_json(given: TrainingSetup, optimizer_given: str, tokens: int) -> dict[str, Any]:
    """The request as the report echoes it (``TrainingSetup.to_dict`` and what the estimate derived), a new dict each
    time: the fields but the batch and the sequence are read once per request less its shape (cabe.memo)."""
    key = memo.request_key(given)
    hit = _SETUP_JSON.get(key)
    if hit is None:
        if len(_SETUP_JSON) > memo.MAX_ENTRIES:
            _SETUP_JSON.clear()
        base: dict[str, Any] = given.to_dict()
        # the transformers the estimate assumed: the one given, else the installed version (cabe.transformers_line)
        base["transformers"] = given.transformers or transformers_line.resolved_version()
        hit = _SETUP_JSON[key] = (base, tuple(k for k, v in base.items() if isinstance(v, list)))
    base, lists = hit
    out = dict(base)
    out["batch"], out["seq"] = given.batch, given.seq
    for k in lists:
        out[k] = list(out[k])
    out["optimizer_given"] = optimizer_given
    out["effective_batch"] = given.effective_batch
    out["tokens"] = tokens
    return out
