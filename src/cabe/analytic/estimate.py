"""The analytic estimate, composed (:func:`estimate_model`): (model, setup) -> Report, with the peak taken
where it really is — model states (:mod:`.states`), the activations of every run (:mod:`.runs`), the step's parts
(:mod:`.parts`) walked by :func:`cabe.step.timeline`, then the notes (:mod:`.notes`) and the explanation
(:mod:`.explain`). Proved by tests/test_estimate.py and every trace test."""

from __future__ import annotations

from typing import Any

from cabe import compressed_attention, fp8, objectives, ssm, transformers_line
from cabe.activations import (
    head_activations,
)
from cabe.analytic.explain import _explain_model, _packing_steps, _precision_step
from cabe.analytic.lesson import ALLOCATOR_SLACK_FRACTION, DEFAULT_CUDA_CONTEXT_BYTES
from cabe.analytic.notes import (
    _host_json,
    _model_json,
    _model_notes,
    _recipe_json,
    _setup_json,
    _unmatched_json,
)
from cabe.analytic.parts import _step_parts
from cabe.analytic.runs import _layer_activations, _row_shape
from cabe.analytic.states import _expert_copies, _logit_width, _model_states, _weight_copies
from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.optimizer import get as optimizer_entry
from cabe.optimizer_memory import layerwise_figures
from cabe.parallel import shard_parts
from cabe.precision import dtype_source, dtypes_for, resolve
from cabe.report import Report
from cabe.report.data import LazySteps, Step
from cabe.step import layerwise, timeline
from cabe.training import TrainingSetup
from cabe.units import round_alloc
from cabe.vision.training import with_images


def estimate_model(spec: ModelSpec, setup: TrainingSetup, *, model_meta: dict[str, Any] | None = None) -> Report:
    """Peak allocated bytes of a training step for an architecture and a setup."""
    if setup.objective != "sft":  # a preference / RL trainer's phases, each built from SFT estimates
        return objectives.estimate(spec, setup, _estimate_sft, model_meta)
    return _estimate_sft(spec, setup, model_meta=model_meta)


def _estimate_sft(spec: ModelSpec, setup: TrainingSetup, *, model_meta: dict[str, Any] | None = None) -> Report:
    """One supervised step: forward, backward and the optimizer."""
    if setup.method == "freeze" and setup.trainable_layers > spec.num_layers:
        raise InvalidValueError(
            "out_of_range", "trainable_layers", value=setup.trainable_layers, minimum=0, maximum=spec.num_layers
        )
    # the model as the run's transformers line builds it (4.x: MoE experts as nn.Linear modules, cabe.transformers_line)
    line = setup.transformers_line
    transformers_line.check_model_type(spec.model_type, line, setup.transformers)
    spec = transformers_line.as_line(spec, line, setup.transformers)
    source = dtype_source(setup, spec.dtype)
    optimizer_given = setup.optimizer_given  # an HF Trainer optim name, echoed beside the registry's
    setup = resolve(setup, spec.dtype)  # dtype="auto": the checkpoint's, as transformers 5 loads it
    if setup.fp8 != "none":
        fp8.setup_refusal(setup)  # (again: dtype "auto" may have resolved to fp16)
        fp8.model_refusal(spec, setup.fp8)
    trains_fp16 = setup.method == "full" or (setup.method == "freeze" and not setup.trainable_fp32)
    trains_fp16 = trains_fp16 or (setup.method == "lora" and setup.adapter_dtype == "model")  # fp16 adapters
    if setup.dtype == "fp16" and setup.autocast == "fp16" and trains_fp16:
        # torch.amp.GradScaler.unscale_ refuses fp16 gradients ("Attempting to unscale FP16 gradients"):
        # the Trainer's fp16=True cannot train weights loaded in fp16
        raise InvalidValueError("fp16_weights_fp16_autocast", "autocast", value="fp16", dtype=setup.dtype)
    if setup.attention == "flash" and not spec.flash_attention:
        # the model class sets _supports_flash_attn = False: from_pretrained refuses flash_attention_2
        # (transformers 5.24 modeling_utils.py:1592, "does not support Flash Attention")
        raise InvalidValueError("flash_unsupported", "attention", value="flash", model_type=spec.model_type)
    if setup.attention == "flash" and setup.method != "qlora" and setup.dtype == "fp32" and setup.autocast == "none":
        # flash-attn runs fp16 / bf16 only; transformers casts fp32 queries to the autocast dtype, or to a
        # quantized model's dtype, else to the linear layers' dtype (integrations/flash_attention.py,
        # get_target_dtype): fp32 here, which the kernel refuses
        raise InvalidValueError("flash_needs_16bit", "attention", value="flash", dtype=setup.dtype)
    ssm.refusal(spec, setup.method)
    compressed_attention.refusal(spec, setup.method)
    dt = dtypes_for(setup)
    states = _model_states(spec, setup)
    given, setup = setup, _row_shape(setup)  # padding-free: the batch as one row (the report keeps the request)
    act = _layer_activations(spec, setup, dt)
    copies = _weight_copies(spec, setup, dt)
    head = head_activations(spec, setup, dt)
    parts = _step_parts(spec, setup, dt, states, act, head, copies)
    if given.images:  # the vision tower's saved tensors and backward (cabe.vision.training)
        parts = with_images(parts, spec, given, dt, states.tensors, states.bytes_of)
    if optimizer_entry(setup.optimizer).layerwise or setup.optimizer_in_backward:  # one GPU (optimizer.refusal)
        lw = layerwise_figures(states.tensors, states.bytes_of, setup)
        parts = layerwise(parts, lw.gradient, lw.temporaries, lw.layer_gradient, lw.layer_temporaries)
    shard_info: dict[str, Any] = {}
    if setup.distributed:
        # Multi-GPU plans: sharding transforms the per-GPU parts run by run (cabe.parallel.runs); the walk of the
        # step is the same
        parts, shard_info = shard_parts(parts, spec, setup)
    moments = timeline(parts)
    totals: list[int] = []  # each moment's total (Moment.total, summed once here)
    phase_peaks: dict[str, int] = {}
    moments_json: list[dict[str, Any]] = []
    for m in moments:
        t = sum(m.components.values())
        totals.append(t)
        if t > phase_peaks.get(m.phase, -1):
            phase_peaks[m.phase] = t
        # (the moment's own dict, not a copy: what is live then, for the page's stacked timeline, cabe.web.timeline)
        moments_json.append({"phase": m.phase, "where": m.where, "total_bytes": t, "components": m.components})
    peak = moments[totals.index(max(totals))]  # the first of the largest, as max() picks it
    components = dict(peak.components)
    for k in ("weights", "gradients", "optimizer", "activations"):
        components.setdefault(k, 0)
    total = sum(components.values())
    tokens = act.tokens

    def explained() -> list[Step]:  # (the steps are worked out when read: report.data.LazySteps)
        copies_fwd = (
            sum(r.copies * r.count + r.copies_cached * r.cached_count for r in parts.layer_runs()) + parts.copies_head
        )
        # of them, every routed expert's (whole layers' copies, one GPU: the sharded figures are the plan's)
        experts = sum(
            r.count * _expert_copies(spec, setup, dt, r.group)
            for r in parts.layer_runs()
            if r.copies and r.group is not None and not setup.distributed
        )
        steps = [_precision_step(setup, source)] + _packing_steps(spec, given, setup)
        return steps + _explain_model(spec, setup, dt, states, act, (copies_fwd, experts), head, peak, total)

    return Report(
        mode="architecture",
        total_bytes=total,
        components=components,
        parameters=spec.parameter_count,
        trainable_parameters=states.n_train,
        peak_phase=peak.phase,
        phase_peaks=phase_peaks,
        steps=LazySteps(explained),
        setup=_setup_json(given, optimizer_given, tokens),
        model=_model_json(spec, model_meta),
        paged_bytes=states.opt.paged_bytes,
        cuda_context_bytes=DEFAULT_CUDA_CONTEXT_BYTES,
        allocator_slack_bytes=max(
            # the logits' fp32 blocks the caching allocator keeps; TRL's fused LM head (DPO, KTO, GRPO) makes none
            0 if setup.objective in ("dpo", "kto", "grpo") else round_alloc(4 * tokens * _logit_width(spec)),
            round(total * ALLOCATOR_SLACK_FRACTION),
        ),
        notes=_model_notes(spec, setup, states)
        + (("transformers4_dtype_default",) if source == "transformers4" else ()),
        extra={
            "peak_at": peak.where,
            "loss": _recipe_json(setup),
            **_unmatched_json(spec, setup),
            **_host_json(spec, act),
            **({"distributed": shard_info} if shard_info else {}),
            "moments": moments_json,
        },
    )
