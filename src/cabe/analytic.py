"""The analytic estimate (module cabe.analytic; the function cabe.estimate is the public face): (model, setup) -> Report, with the peak taken where it really is.

The training step is walked at layer granularity, steady state (step 2 onwards: optimizer state
exists from the start; ``zero_grad(set_to_none=True)`` frees gradients after each step):

1. forward: weights + optimizer state (+ gradients when accumulating) + autocast weight copies +
   saved activations of every layer + the loss head (logits, fp32 upcast, log-softmax);
2. backward at the head: log-softmax gradients (fp32) on top of everything saved;
3. backward through layer i (both ends are checked; in between it is linear in i): gradients of
   layers ≥ i exist, activations and weight copies of layers ≤ i are still saved, plus the
   layer's backward workspace (with checkpointing, the layer's recomputed activations);
4. optimizer step: weights + gradients + state + step temporaries.

The peak is the largest of these moments; its components are what is live then, and they sum
to ``total_bytes``. CUDA context and allocator slack are reported beside it, never inside.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cabe import compressed_attention, recipes, ssm
from cabe.activations import (
    HeadActivations,
    LayerActivations,
    checkpointed_layer_bytes_per_token,
    dora_stray_parameter,
    embedding_lora_saved,
    head_activations,
    layer_activations,
)
from cabe.architecture import LayerGroup, ModelSpec
from cabe.errors import InvalidValueError
from cabe.facts import attention_kind, sdpa_gqa_math, sdpa_masked_layers
from cabe.method import (
    VISION_PREFIX,
    head_targets,
    layer_tensors,
    lora_parameter_targets,
    lora_targets,
    moved_targets,
    parameter_tensors,
    quantized_bytes,
    running_lora_targets,
    saved_modules,
    stored_bytes,
    unmatched_lora_targets,
)
from cabe.optimizer import get as optimizer_entry
from cabe.optimizer_memory import layerwise_figures, optimizer_memory
from cabe.parallel import shard_parts
from cabe.precision import Dtypes, dtype_source, dtypes_for, resolve
from cabe.report import Report, Step
from cabe.schema import state_fields
from cabe.step import LayerRun, StepParts, layerwise, timeline
from cabe.tensors import Tensor
from cabe.training import TrainingSetup, number
from cabe.units import CUDA_WORKSPACES, GB, GiB, round_alloc
from cabe.vision_memory import with_images

#: The seed calculator's presets for bytes per parameter (mixed-precision Adam, 8-bit Adam, SGD+momentum).
BYTES_PER_PARAM_PRESETS = {"adam-mixed": 16.0, "adam-8bit": 12.0, "sgd-momentum": 8.0}

#: What PyTorch's caching allocator holds on top of the peak (cached free blocks, split blocks, 2 MiB /
#: 20 MiB segments) is modelled as the larger of one fp32 logits buffer (b·s×V×4 bytes: the loss's fp32
#: buffers are freed and reallocated around the peak and stay cached) and 5% of the peak. Basis: the
#: trace's replay of CUDACachingAllocator over the 84 configurations of benchmarks/accuracy, where
#: reserved / allocated − 1 ranges 0.2–30% (median 9.7%). Against that replay this model is within 3.9% at
#: the median and 13.8% at worst (a flat 10% gave 5.7% and 15.5%).
ALLOCATOR_SLACK_FRACTION = 0.05
DEFAULT_CUDA_CONTEXT_BYTES = 600 * 2**20


# =============================================================================================
# simple mode (seed 004): V = N·B + A
# =============================================================================================


def estimate_simple(params_billion: float, bytes_per_param: float, activations_gb: float = 0.0) -> Report:
    """The seed calculator: model states M = N·B (GB), total V = M + A."""
    n = number("params", params_billion, minimum=0.0, maximum=1e6, strict=True)
    b = number("bytes_per_param", bytes_per_param, minimum=0.0, maximum=1024, strict=True)
    a = number("activations_gb", activations_gb, minimum=0.0, maximum=1e7)
    states = round(n * b * GB)
    act = round(a * GB)
    steps = (
        Step("simple.model_states", "M = N·B = {n} × {b} = {m} GB", states, {"n": n, "b": b, "m": states / GB}),
        Step(
            "simple.total",
            "V = M + A = {m} + {a} = {v} GB",
            states + act,
            {"m": states / GB, "a": a, "v": (states + act) / GB},
        ),
    )
    return Report(
        mode="simple",
        total_bytes=states + act,
        components={"model_states": states, "activations": act},
        parameters=round(n * 1e9),
        trainable_parameters=round(n * 1e9),
        peak_phase="optimizer" if act == 0 else "forward",
        phase_peaks={},
        steps=steps,
        setup={"params": n, "bytes_per_param": b, "activations_gb": a},
        notes=("simple_mode",),
    )


# =============================================================================================
# lesson mode: a parameter count, a precision and an optimizer, no architecture
# =============================================================================================


# NOTE: long but flat (radon C or better): one Step literal per explained figure, read top to bottom.
def estimate_lesson(params_billion: float, setup: TrainingSetup, activations_gb: float = 0.0) -> Report:
    """Model states from a parameter count alone, component by component, as the lesson does.

    fp32: weights 4 + gradients 4 + optimizer. Mixed precision (the lesson's "BF16"): 16-bit
    weights 2 + 16-bit gradients 2 + fp32 master copy 4 + optimizer; the lesson leaves the
    master copy out (78.4 instead of 104.3 GiB for 7B with Adam). Pure 16-bit: everything 2 B.
    """
    n_b = number("params", params_billion, minimum=0.0, maximum=1e6, strict=True)
    a_gb = number("activations_gb", activations_gb, minimum=0.0, maximum=1e7)
    n = round(n_b * 1e9)
    opt = optimizer_entry(setup.optimizer)
    state_per = opt.lesson_bytes_per_param  # optimizer state bytes per parameter, for fp32 moments
    # the lesson's three regimes: fp32; mixed precision (any autocast); pure 16-bit weights
    if setup.autocast == "none" and setup.dtype in ("fp32", "auto"):
        w, g, master = 4, 4, 0
    elif setup.autocast != "none":
        w, g, master = 2, 2, 4
    else:
        w, g, master = 2, 2, 0
        if opt.lesson_follows_dtype:
            state_per //= 2  # moments in the parameter dtype
    comps = {
        "weights": n * w,
        "gradients": n * g,
        "master_weights": n * master,
        "optimizer": n * state_per,
        "activations": round(a_gb * GB),
    }
    steps = [
        Step(
            "lesson.weights",
            "{n} × {b} B = {bytes} B = {gib} GiB",
            comps["weights"],
            {"n": n, "b": w, "bytes": comps["weights"], "gib": comps["weights"] / GiB},
        ),
        Step(
            "lesson.gradients",
            "{n} × {b} B = {bytes} B = {gib} GiB",
            comps["gradients"],
            {"n": n, "b": g, "bytes": comps["gradients"], "gib": comps["gradients"] / GiB},
        ),
    ]
    if master:
        steps.append(
            Step(
                "lesson.master_weights",
                "{n} × {b} B = {bytes} B = {gib} GiB",
                comps["master_weights"],
                {"n": n, "b": master, "bytes": comps["master_weights"], "gib": comps["master_weights"] / GiB},
            )
        )
    steps.append(
        Step(
            "lesson.optimizer." + setup.optimizer,
            "{n} × {b} B = {bytes} B = {gib} GiB",
            comps["optimizer"],
            {"n": n, "b": state_per, "bytes": comps["optimizer"], "gib": comps["optimizer"] / GiB},
        )
    )
    total = sum(comps.values())
    lesson = None
    if master:
        seed_figure = comps["weights"] + comps["gradients"] + comps["optimizer"]
        lesson = {
            "lesson_bytes": seed_figure,
            # the lesson halves its rounded fp32 figure (26.1 -> 13.1) and adds: 13.1 + 13.1 + 52.2 = 78.4
            "lesson_gib": round(2 * _half_up(round(n * 4 / GiB, 1) / 2) + round(comps["optimizer"] / GiB, 1), 1),
            "correct_bytes": seed_figure + comps["master_weights"],
            "correct_gib": round((seed_figure + comps["master_weights"]) / GiB, 1),
            "bytes_per_param": w + g + master + state_per,
            "reason": "lesson_drops_master",
        }
        steps.append(
            Step(
                "lesson.correction",
                "{lesson} GiB + {master} GiB = {correct} GiB",
                seed_figure + comps["master_weights"],
                {
                    "lesson": seed_figure / GiB,
                    "master": comps["master_weights"] / GiB,
                    "correct": (seed_figure + comps["master_weights"]) / GiB,
                },
            )
        )
    steps.append(
        Step(
            "lesson.total",
            "{total} B = {gb} GB = {gib} GiB",
            total,
            {"total": total, "gb": total / GB, "gib": total / GiB},
        )
    )
    comps = {k: v for k, v in comps.items() if v or k in ("weights", "gradients", "optimizer", "activations")}
    return Report(
        mode="lesson",
        total_bytes=total,
        components=comps,
        parameters=n,
        trainable_parameters=n,
        peak_phase="optimizer",
        phase_peaks={},
        steps=tuple(steps),
        setup={"params": n_b, "activations_gb": a_gb, **setup.to_dict()},
        lesson=lesson,
        notes=("lesson_mode",),
    )


def _half_up(x: float) -> float:
    """Round to one decimal, halves up (13.05 -> 13.1), as the lesson does by hand."""
    import math

    return math.floor(x * 10 + 0.5 + 1e-9) / 10


# =============================================================================================
# architecture mode
# =============================================================================================


@dataclass(frozen=True)
class _States:
    tensors: list
    bytes_of: dict
    weights: int
    quant: int
    grads: int
    opt: Any
    n_train: int


#: the setup fields that change model states (cabe.schema, ``states=True``): the cache key
_STATE_FIELDS = state_fields()
_STATES_CACHE: dict[tuple, _States] = {}


def _model_states(spec: ModelSpec, setup: TrainingSetup) -> _States:
    """Weights, gradients and optimizer state: independent of batch and sequence, so cached by the
    fields they depend on (a solver sweeping batch or sequence pays for them once)."""
    key = (spec, *(getattr(setup, f) for f in _STATE_FIELDS))
    hit = _STATES_CACHE.get(key)
    if hit is None:
        if len(_STATES_CACHE) > 512:
            _STATES_CACHE.clear()
        hit = _STATES_CACHE[key] = _compute_model_states(spec, setup)
    return hit


def _compute_model_states(spec: ModelSpec, setup: TrainingSetup) -> _States:
    dt = dtypes_for(setup)
    tensors = parameter_tensors(spec, setup)
    kinds = {t.kind for t in tensors}
    bytes_of = dict.fromkeys(kinds, 0)
    weights = 0
    quant = 0
    for t in tensors:
        if t.kind == "quantized":
            quant += quantized_bytes(t.numel, setup.double_quant) * t.count
            continue
        b = stored_bytes(t, setup, dt)
        bytes_of[t.kind] = b
        weights += round_alloc(t.numel * b) * t.count
    bytes_of_trainable = dict(bytes_of)
    grads = sum(round_alloc(t.numel * bytes_of_trainable[t.kind]) * t.count for t in tensors if t.trainable)
    opt = optimizer_memory(tensors, setup, bytes_of_trainable)
    n_train = sum(t.total for t in tensors if t.trainable)
    return _States(tensors, bytes_of_trainable, weights, quant, grads, opt, n_train)


def estimate_model(spec: ModelSpec, setup: TrainingSetup, *, model_meta: dict[str, Any] | None = None) -> Report:
    """Peak allocated bytes of a training step for an architecture and a setup."""
    if setup.method == "freeze" and setup.trainable_layers > spec.num_layers:
        raise InvalidValueError(
            "out_of_range", "trainable_layers", value=setup.trainable_layers, minimum=0, maximum=spec.num_layers
        )
    source = dtype_source(setup, spec.dtype)
    optimizer_given = setup.optimizer_given  # an HF Trainer optim name, echoed beside the registry's
    setup = resolve(setup, spec.dtype)  # dtype="auto": the checkpoint's, as transformers 5 loads it
    trains_fp16 = setup.method == "full" or (setup.method == "freeze" and not setup.trainable_fp32)
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
    if given.images:  # the vision tower's saved tensors and backward (cabe.vision_memory)
        parts = with_images(parts, spec, given, dt, states.tensors, states.bytes_of)
    if optimizer_entry(setup.optimizer).layerwise:  # single-GPU only (optimizer.refusal)
        lw = layerwise_figures(states.tensors, states.bytes_of, setup)
        parts = layerwise(parts, lw.gradient, lw.temporaries, lw.layer_gradient, lw.layer_temporaries)
    shard_info: dict[str, Any] = {}
    if setup.distributed:
        # Multi-GPU plans: sharding transforms the per-GPU parts; the walk of the step is the same.
        # NOTE: the plans share out the per-layer figures; where the layers differ they take the mean layer
        # of the gradient's path (StepParts' scalar fields), not each run
        parts, shard_info = shard_parts(replace(parts, runs=()), spec, setup)
    moments = timeline(parts)
    copies_fwd = (
        sum(r.copies * r.count + r.copies_cached * r.cached_count for r in parts.layer_runs()) + parts.copies_head
    )
    peak = max(moments, key=lambda m: m.total)
    phase_peaks: dict[str, int] = {}
    for m in moments:
        phase_peaks[m.phase] = max(phase_peaks.get(m.phase, 0), m.total)
    components = dict(peak.components)
    for k in ("weights", "gradients", "optimizer", "activations"):
        components.setdefault(k, 0)
    total = sum(components.values())
    tokens = act.tokens
    steps = [_precision_step(setup, source)] + _packing_steps(spec, given, setup)
    steps += _explain_model(spec, setup, dt, states, act, copies_fwd, head, peak, total)
    return Report(
        mode="architecture",
        total_bytes=total,
        components=components,
        parameters=spec.parameter_count,
        trainable_parameters=states.n_train,
        peak_phase=peak.phase,
        phase_peaks=phase_peaks,
        steps=tuple(steps),
        setup={
            **given.to_dict(),
            "optimizer_given": optimizer_given,
            "effective_batch": given.effective_batch,
            "tokens": tokens,
        },
        model=_model_json(spec, model_meta),
        paged_bytes=states.opt.paged_bytes,
        cuda_context_bytes=DEFAULT_CUDA_CONTEXT_BYTES,
        allocator_slack_bytes=max(
            round_alloc(4 * tokens * _logit_width(spec)), round(total * ALLOCATOR_SLACK_FRACTION)
        ),
        notes=_model_notes(spec, setup, states),
        extra={
            "peak_at": peak.where,
            "loss": _recipe_json(setup),
            **_unmatched_json(spec, setup),
            **_host_json(spec, act),
            **({"distributed": shard_info} if shard_info else {}),
            "moments": [{"phase": m.phase, "where": m.where, "total_bytes": m.total} for m in moments],
        },
    )


def _row_shape(setup: TrainingSetup) -> TrainingSetup:
    """The shape the layers see: padding-free flattens the batch to one row of batch × seq tokens (TRL's
    ``padding_free``, transformers' DataCollatorWithFlattening, data/data_collator.py:1261-1290). One sequence
    flattened is a plain row: its position_ids never restart, transformers finds no documents
    (masking_utils.py:761-762) and SDPA keeps ``is_causal`` (flash), as unpacked."""
    if setup.packing != "padding-free":
        return setup
    if setup.batch == 1:
        return setup.with_(packing="none")
    return setup.with_(batch=1, seq=setup.batch * setup.seq)


def _packed_mask(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Packed or padding-free rows under SDPA: position_ids that restart per document and no attention mask
    make transformers find the documents (masking_utils.py:862-870, ``find_packed_sequence_indices``) and
    build a block-diagonal mask, never ``is_causal`` (masking_utils.py:990-1002: ``allow_is_causal_skip =
    False``); with a mask SDPA cannot run flash (activations.masked_sdpa_kind). flash-attn takes the varlen
    path instead (modeling_flash_attention_utils.py:564, ``_is_packed_sequence``): no mask, memory per token."""
    return setup.packing != "none" and setup.attention == "sdpa" and not spec.sdpa_fallback


def _masked_layers(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Layers whose SDPA gets a mask: every one for packed rows, or with images a tower makes the decoder attend
    both ways (Gemma 3's token_type_ids: :attr:`cabe.architecture.VisionTower.image_mask`), else the sliding /
    windowed ones."""
    images = setup.images and setup.attention == "sdpa" and spec.vision is not None and spec.vision.image_mask
    return spec.num_layers if _packed_mask(spec, setup) or images else sdpa_masked_layers(spec, setup)


def _packing_steps(spec: ModelSpec, given: TrainingSetup, shaped: TrainingSetup) -> list[Step]:
    """Which sequence length sets the peak: the row the attention spans (``seq``; batch × seq padding-free)."""
    if given.packing == "none":
        return []
    kernel = "sdpa_masked" if _packed_mask(spec, shaped) else shaped.attention
    return [
        Step(
            "setup.packing",
            "{rows} × {row} tokens, attention over {row} ({kernel})",
            None,
            {"packing": given.packing, "rows": shaped.batch, "row": shaped.seq, "kernel": kernel},
        )
    ]


def _precision_step(setup: TrainingSetup, source: str) -> Step:
    """Which dtype and autocast the estimate assumed, and where the dtype came from."""
    return Step(
        "setup.precision",
        "dtype {dtype} ({source}), autocast {autocast}",
        None,
        {"dtype": setup.dtype, "source": source, "autocast": setup.autocast, "precision": setup.precision},
    )


@dataclass(frozen=True)
class _RunActivations:
    """What one layer of a run of like layers in the gradient's path saves."""

    group: LayerGroup
    count: int  # layers of the run in the gradient's path
    per_layer: LayerActivations
    full_layer_bytes: int  # what one layer saves without checkpointing
    saved_layer_bytes: int  # what it keeps through the forward (its input, under checkpointing)
    plain_layer_bytes: int = 0  # what a layer left out of selective checkpointing keeps (its full activations)
    recompute_bytes: int = 0  # checkpointing: what recomputing one layer allocates (its input is there already)


@dataclass(frozen=True)
class _Activations:
    """What one step saves, run by run of like layers, and through how many layers the gradient flows."""

    tokens: int  # batch × tokens per sequence
    runs: tuple[_RunActivations, ...]  # the gradient's path, bottom first (the top run alone when empty)
    rotary: int  # cos and sin tables, shared by every layer
    grad_layers: int
    first: int = 0  # the model's index of the gradient path's bottom layer
    every: int = 0  # checkpointing: every ``every``-th layer is checkpointed (1: all; 0: no checkpointing)
    offload: bool = False  # the checkpointed layers' inputs wait on the host
    #: checkpointing layers other modules come before in ``model.modules()``: transformers counts every
    #: GradientCheckpointingLayer for ``every_n_layers`` (modeling_utils.py:3239-3247), a vision tower's blocks first
    index_offset: int = 0

    @property
    def per_layer(self) -> LayerActivations:
        """The top run's layer: the one figure of a model whose layers are alike."""
        return self.runs[-1].per_layer

    def pieces(self) -> list[tuple[_RunActivations, int, bool]]:
        """The gradient's path, bottom first, as (run, layers, checkpointed) pieces: under selective
        checkpointing transformers checkpoints the layers whose index is a multiple of ``every``
        (transformers 5.24 modeling_utils.py:3245-3247, ``layer_index % every_n_layers == 0``)."""
        return list(self._pieces)

    @functools.cached_property
    def _pieces(self) -> tuple[tuple[_RunActivations, int, bool], ...]:
        # computed once per estimate (several parts walk the path); without selective checkpointing each run is
        # one piece, so the walk is per run rather than per layer
        if self.every in (0, 1):
            return tuple((r, r.count, self.every == 1) for r in self.runs if r.count)
        out: list[tuple[_RunActivations, int, bool]] = []
        i = self.first
        for r in self.runs:
            for _ in range(r.count):
                ckpt = self.checkpointed(i)
                if out and out[-1][0] is r and out[-1][2] == ckpt:
                    out[-1] = (r, out[-1][1] + 1, ckpt)
                else:
                    out.append((r, 1, ckpt))
                i += 1
        return tuple(out)

    def checkpointed(self, i: int) -> bool:
        """Whether the model's layer ``i`` (from the bottom) is checkpointed."""
        return self.every > 0 and (i + self.index_offset) % self.every == 0

    def kept(self, r: _RunActivations, ckpt: bool) -> int:
        """What one layer keeps on the device through the forward: its input when checkpointed (nothing when
        that input is offloaded), its full activations when left out of selective checkpointing."""
        if not ckpt:
            return r.plain_layer_bytes
        return 0 if self.offload else r.saved_layer_bytes

    @property
    def saved_bytes(self) -> int:
        """What every layer of the gradient's path keeps through the forward (on the device)."""
        return sum(n * self.kept(r, ckpt) for r, n, ckpt in self.pieces())

    @property
    def checkpointed_layers(self) -> int:
        """Layers of the gradient's path that are checkpointed."""
        return sum(n for _, n, ckpt in self.pieces() if ckpt)

    def offloaded_bytes(self, layers: int) -> int:
        """Host bytes of the inputs of the checkpointed layers among the model's ``layers`` (offloading)."""
        if not self.offload:
            return 0
        return sum(1 for i in range(layers) if self.checkpointed(i)) * self.runs[-1].saved_layer_bytes

    @property
    def saved_layer_bytes(self) -> int:
        """What one layer keeps (the mean over the gradient's path when the layers differ)."""
        return self.saved_bytes // self.grad_layers if self.grad_layers else self.runs[-1].saved_layer_bytes

    def mean(self, of: Callable[[_RunActivations], int]) -> int:
        """A per-layer figure over the gradient's path (exact when the layers are alike)."""
        if not self.grad_layers:
            return of(self.runs[-1])
        return sum(r.count * of(r) for r in self.runs) // self.grad_layers


def _layer_activations(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> _Activations:
    layers = spec.num_layers
    if setup.method == "freeze":
        grad_layers = min(setup.trainable_layers, layers)
        trainable_layers = grad_layers
    else:
        grad_layers = layers - _below_adapters(spec, setup)
        trainable_layers = layers if setup.method == "full" else 0
    tokens = setup.batch * setup.tokens_per_sequence
    path = [(run, n) for run, n, trained in spec.top_split(grad_layers) if trained]
    # runs of one kind of layer (dense, MoE, dense, MoE ...) share their figures: worked out once per kind
    kinds: dict[tuple[Any, ...], _RunActivations] = {}
    for run, _ in path:
        if _kind(run) not in kinds:
            kinds[_kind(run)] = _run_activations(spec, setup, dt, run, 0, tokens, trainable_layers > 0)
    runs = tuple(replace(kinds[_kind(run)], group=run, count=n) for run, n in path)
    if runs and not trainable_layers and _input_needs_no_grad(spec, setup):
        # the path's lowest layer saves only from its first adapted module on (activations.state.LayerState.live)
        low = _run_activations(spec, setup, dt, path[0][0], 1, tokens, False, bottom=True)
        runs = (low, *((replace(runs[0], count=runs[0].count - 1),) if runs[0].count > 1 else ()), *runs[1:])
    if not runs:  # no layer in the gradient's path: the top layer, for the figures that explain it
        runs = (_run_activations(spec, setup, dt, spec.runs[-1], 0, tokens, False),)
    # cos and sin tables, (1, s, rotary_dim) in the residual dtype, shared by every layer
    seq_total = tokens // setup.batch
    rotary = 2 * seq_total * spec.rotary_dim * dt.residual if spec.position == "rotary" else 0
    ckpt = setup.checkpointing
    return _Activations(
        tokens,
        runs,
        rotary,
        grad_layers,
        first=layers - grad_layers,
        every=setup.checkpoint_every if ckpt else 0,
        offload=ckpt and setup.offload_activations,
        index_offset=spec.vision.depth if spec.vision is not None else 0,  # Qwen2.5-VL's tower blocks come first
    )


def _input_needs_no_grad(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Whether the decoder's first layer gets an input that requires no grad: LoRA / QLoRA without checkpointing
    (with it ``enable_input_require_grads`` makes every layer's input require grad), no adapted or trained
    embedding, no images (a vision tower's LoRA, PEFT's default on Gemma 3, makes the image features require grad)."""
    if not setup.adapters or setup.checkpointing or setup.images:
        return False
    return not any(t.kind == "embedding" for t in head_targets(spec, setup.lora_targets) + saved_modules(spec, setup))


def _below_adapters(spec: ModelSpec, setup: TrainingSetup) -> int:
    """LoRA without checkpointing: the bottom layers with no adapter that runs carry no gradient (no tensor in
    them requires grad, so autograd records nothing there). A hybrid whose targets sit only in some layers
    (q_proj, v_proj: Granite-4.0-H's attention layers) trains from its lowest adapted layer. With checkpointing
    ``enable_input_require_grads`` makes every layer's input require grad (transformers' Trainer, PEFT's
    prepare_model_for_kbit_training); an adapted embedding does the same. A Mamba-2 layer's out_proj (slot ``o``)
    runs inside the fused kernel, which multiplies its base weight: its adapter never runs (cabe.ssm)."""
    if not setup.adapters or setup.checkpointing:
        return 0
    if any(t.kind == "embedding" for t in head_targets(spec, setup.lora_targets) + saved_modules(spec, setup)):
        return 0
    # an adapted lm_head alone trains above every layer: none of them carries a gradient (phi-3-mini LoRA on
    # lm_head only, no checkpointing: +23% with every layer in the gradient's path)
    below = 0
    for run in spec.runs:
        if running_lora_targets(spec, setup.lora_targets, run) or lora_parameter_targets(spec, setup.lora_targets, run):
            return below
        below += run.count
    return below


def _kind(run: LayerGroup) -> tuple[Any, ...]:
    """What a run's per-layer figures depend on: its tensors, not its length or attention span."""
    # NOTE: by identity, so as not to hash every Linear of every run: a family builds the runs of one kind
    # from one tuple of linears (two equal tuples only cost a second, equal computation)
    return (id(run.linears), run.mlp, run.intermediate_size, run.rope)


def _run_activations(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    run: LayerGroup,
    count: int,
    tokens: int,
    trained: bool,
    bottom: bool = False,
) -> _RunActivations:
    kw: dict[str, bool] = (
        {"base_trainable": True, "adapters": False}
        if trained
        else {"base_trainable": False, "adapters": setup.adapters, "bottom": bottom}
    )
    per_layer = layer_activations(spec, setup, dt, group=run, **kw)
    full_layer_bytes = tokens * per_layer.bytes_per_token + per_layer.constant_bytes
    mean_layer_bytes = full_layer_bytes
    masked = _masked_layers(spec, setup)
    if masked:  # layers whose SDPA gets a mask run another kernel (activations.sdpa_masked_layers)
        # NOTE: each run is given the model's share of masked layers: exact when the model is one run (every
        # family with masked layers today); a model with several runs and masked layers gets their mean
        layers = spec.num_layers
        per_masked = layer_activations(spec, setup, dt, group=run, masked=True, **kw)
        masked_bytes = tokens * per_masked.bytes_per_token + per_masked.constant_bytes
        # the mean over the layers, and the larger layer for the one being recomputed
        mean_layer_bytes = round((full_layer_bytes * (layers - masked) + masked_bytes * masked) / layers)
        full_layer_bytes = max(full_layer_bytes, masked_bytes)
        per_layer = per_masked if 2 * masked >= layers else per_layer
    if setup.checkpointing:
        saved_layer_bytes = tokens * checkpointed_layer_bytes_per_token(dt) * spec.residual_width
    else:
        saved_layer_bytes = mean_layer_bytes
    recompute_bytes = full_layer_bytes - tokens * per_layer.input_alias_per_token
    return _RunActivations(
        run, count, per_layer, full_layer_bytes, saved_layer_bytes, mean_layer_bytes, recompute_bytes
    )


@dataclass(frozen=True)
class _Copies:
    """Autocast's 16-bit copies of matmul weights (aten/src/ATen/autocast_mode.cpp, ``cached_cast``), per
    layer of one run.

    ``layer``: every copy one layer makes (each saved by autograd for backward when the layer is in the
    gradient's path); ``cached``: the part autocast's cache keeps until forward ends — only casts of fp32
    leaves that require grad (``arg.requires_grad() && arg.is_leaf()`` with ``scalar_type == kFloat``);
    ``trained_layers``: layers with such leaves (in the whole model); ``head``: the lm_head's copy."""

    layer: int = 0
    cached: int = 0
    trained_layers: int = 0
    head: int = 0


def _weight_copies(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, run: LayerGroup | None = None) -> _Copies:
    """The copies of one layer of ``run`` (the top run's when None)."""
    if not dt.autocast:
        return _Copies()
    layer = run or spec.runs[-1]
    # QLoRA's 4-bit layers dequantize per use and keep nothing; every other matmul weight is cast when
    # it is not in the autocast dtype already
    # The 3-D experts get no copy when transformers' grouped_mm runs them in their own dtype, outside autocast
    # (activations._moe); Llama 4's dense dispatch runs them through torch.bmm, which autocast casts
    experts_cast = spec.expert_dispatch == "dense"
    # nor are a Mamba-2 mixer's conv1d, dt_bias, A_log, D and norm weights: the fused kernel reads them as they are
    # nor DeepSeek-V4's bare fp32 vectors (norm weights, hyper-connections' base and scale, position biases), which
    # only element-wise ops read
    uncast = ("ssm", "vector") if experts_cast else ("ssm", "experts", "vector")
    base = sum(
        round_alloc(lin.weight_count * 2)
        for lin in layer.linears
        if dt.weight_copies and not (setup.method == "qlora" and lin.quantized_by_bnb) and lin.slot not in uncast
    )
    adapters = 0
    if setup.adapters:  # the fp32 LoRA matrices are cast too (r × in and out × r per target)
        adapters = sum(
            round_alloc(setup.lora_rank * lin.in_features * 2) + round_alloc(setup.lora_rank * lin.out_features * 2)
            for lin in running_lora_targets(spec, setup.lora_targets, layer)
        )
    if setup.method in ("full", "freeze"):  # the trained layers' weights, when they are fp32 leaves
        cached = base if dt.cached_copies else 0
        trained = spec.num_layers if setup.method == "full" else min(setup.trainable_layers, spec.num_layers)
    else:  # LoRA / QLoRA: only the adapters train; prompt tuning: nothing in the layers
        cached, trained = adapters, (spec.num_layers if setup.adapters else 0)
        if setup.dora and setup.lora_dropout > 0 and dt.cached_copies:
            # DoRA + dropout on Conv1D: PEFT's throwaway Parameter(W.T) is an fp32 leaf that requires grad, so
            # autocast caches its cast until forward ends (activations.dora_stray_parameter); without
            # checkpointing that cast is the one the matmul saves (counted with the layer's saved tensors)
            quantized = setup.method == "qlora"
            cached += sum(
                round_alloc(lin.weight_count * 2)
                for lin in lora_targets(spec, setup.lora_targets, layer)
                if dora_stray_parameter(spec, quantized, dt.adapter, dt.frozen, lin)
            )
    # (freeze with fp32 trained layers: the frozen head stays as loaded, cast only when that is not autocast's dtype)
    head_cast = dt.weight_copies and not (
        setup.trainable_fp32 and setup.method == "freeze" and setup.dtype == setup.autocast
    )
    head = sum(round_alloc(n * 2) for n in _head_matrices(spec)) if head_cast else 0
    head += _head_adapter_copies(spec, setup)
    if setup.resolved_loss == "chunked" and not (setup.method == "full" and dt.cached_copies):
        # torchtune's chunked output calls the lm_head once per chunk: autocast casts a weight that is not
        # a trained fp32 leaf anew on each call (cached_cast), and each chunk's mm saves its own copy
        head *= setup.loss_chunks
    return _Copies(base + adapters, cached, trained, head)


def _head_adapter_copies(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Under autocast, the 16-bit casts of the embedding's and the lm_head's LoRA matrices that their matmuls
    save: lora_A and lora_B of the lm_head (fp32 leaves: cached, peft tuners/lora/layer.py ``Linear``), and the
    embedding's ``lora_embedding_B.T`` (``Embedding.forward``; ``F.embedding`` is not on autocast's lists, so
    lora_embedding_A is read as it is)."""
    if not setup.adapters:
        return 0
    r, h, v = setup.lora_rank, spec.hidden_size, spec.vocab_size
    out = 0
    for t in head_targets(spec, setup.lora_targets):
        out += round_alloc(r * h * 2) + (round_alloc(v * r * 2) if t.kind == "lm_head" else 0)
    return out


def _logit_width(spec: ModelSpec) -> int:
    """Logits per token: the vocabulary under an lm_head; none under a sequence-classification head."""
    return spec.vocab_size if spec.head == "lm" else 0


def _head_matrices(spec: ModelSpec) -> tuple[int, ...]:
    """Elements of the head's matmul weights, which autocast casts to 16 bits: the lm_head (or the tied
    embedding), or the pooler and the classifier."""
    if spec.head == "sequence_classification":
        return (spec.hidden_size * spec.hidden_size, spec.num_labels * spec.hidden_size)
    return (spec.vocab_size * spec.hidden_size,)


def _grad_bytes(states: _States, keep: Callable[[Tensor], bool]) -> int:
    """Gradient bytes (allocator-rounded) of the trainable tensors ``keep`` selects."""
    b = states.bytes_of
    return sum(round_alloc(t.numel * b[t.kind]) * t.count for t in states.tensors if t.trainable and keep(t))


def _tied_grad_pending(spec: ModelSpec, setup: TrainingSetup, states: _States) -> int:
    """The lm_head's gradient of a tied, trained embedding, held through the layers' backward.

    The engine collects the gradients of one AccumulateGrad node in its ``InputBuffer`` until every
    producer has run (torch/csrc/autograd/engine.cpp, ``Engine::evaluate_function``: ``not_ready``
    buffers; input_buffer.cpp ``InputBuffer::add``); the tied weight's two producers are the lm_head's
    ``MmBackward0`` (first) and the embedding's backward (last), so one gradient-sized tensor waits."""
    if setup.method != "full" or not spec.tie_word_embeddings:
        return 0
    return round_alloc(spec.embedding_count * states.bytes_of["embedding"])


def _head_weight_grad_bytes(spec: ModelSpec, states: _States) -> int:
    """The gradient of the lm_head's weight: the embedding's when the two are tied."""
    kind = "embedding" if spec.tie_word_embeddings else "lm_head"
    return _grad_bytes(states, lambda t: t.kind == kind)


def _head_weight_grads(spec: ModelSpec, states: _States, copies: _Copies) -> tuple[int, int]:
    """An fp32 lm_head (or tied embedding) trained under autocast: ``MmBackward0`` writes the gradient of
    its 16-bit copy, ``ToCopyBackward0`` casts it to fp32 (torch/csrc/autograd/FunctionsManual.cpp,
    ``_to_copy_backward``: ``grad.to(self.options())``) while the 16-bit one is still referenced."""
    grad = _head_weight_grad_bytes(spec, states)
    if not (grad and copies.head):
        return 0, 0
    return copies.head, grad  # (the 16-bit gradient of the copy, the cast)


def _chunked_head_grads(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: _States, copies: _Copies
) -> tuple[int, int]:
    """torchtune's chunked loss on a trained lm_head (or tied embedding) in the compute dtype: the moment
    its weight gradient is first summed across chunks. Returns (gradient bytes, logits-gradient bytes).

    ``chunked_output`` builds every chunk's ``mm`` before the loss, so the ``MmBackward0`` nodes have lower
    sequence numbers than every loss node, and the engine runs them after the whole loss backward
    (torch/csrc/autograd/engine.cpp, ``CompareNodeTaskTime``: higher ``sequence_nr`` first): the
    gradients of all chunks' logits exist, and each ``mm`` consumes one. The second ``mm``'s weight
    gradient meets the first in the weight's ``InputBuffer``, summed out of place (input_buffer.cpp,
    ``accumulate``: ``old_var + var`` when it cannot steal the buffer): three weight-sized gradients, while
    the logits gradients of the n−2 chunks not yet reached (the first n−2 of ``tensor_split``) wait.
    With an autocast copy of an fp32 head the summed gradients are the copy's: autocast caches the cast of a
    leaf that requires grad (aten/src/ATen/autocast_mode.cpp, ``cached_cast``), so every chunk's ``mm`` uses
    the same 16-bit tensor, and their weight gradients meet in its one ``ToCopyBackward0``'s buffer: three
    16-bit weight-sized gradients (gpt2-medium full fp32 under bf16 autocast, chunked 8: −2.7% without them).
    The cast to fp32 comes after (:func:`_head_weight_grads`). A cast that is not cached (16-bit weights of the
    other half type) is made anew for every chunk, each with its own ``ToCopyBackward0``: not modelled here."""
    n = setup.loss_chunks
    if setup.resolved_loss != "chunked" or n < 2:
        return 0, 0
    grad = _head_weight_grad_bytes(spec, states)
    if not grad or (copies.head and not dt.cached_copies):
        return 0, 0
    if copies.head:  # the one cached 16-bit copy's gradient
        grad = round_alloc(dt.compute * spec.vocab_size * spec.hidden_size)
    s = setup.tokens_per_sequence
    waiting = sum(s // n + (1 if i < s % n else 0) for i in range(n - 2))  # positions of chunks 0 .. n−3
    return 3 * grad, dt.compute * spec.vocab_size * setup.batch * waiting


def _step_parts(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    states: _States,
    act: _Activations,
    head: HeadActivations,
    copies: _Copies,
) -> StepParts:
    tokens, grad_layers = act.tokens, act.grad_layers
    grads_head = _grad_bytes(states, lambda t: t.kind == "lm_head" or t.name == "final_norm")
    grads_layer = states.grads - grads_head - _grad_bytes(states, lambda t: t.kind in ("embedding", "prompt"))
    grads_layer -= _grad_bytes(states, lambda t: t.name.startswith(VISION_PREFIX))  # the tower's (images)
    # per kind of layer (and checkpointed or not): runs of one kind share their per-layer figures (one object), the
    # gradient path's lowest layer has its own when its input requires no grad (see _input_needs_no_grad)
    kinds: dict[tuple[Any, ...], LayerRun] = {}
    for r, _, ck in act.pieces():
        if (id(r.per_layer), ck) not in kinds:
            kinds[(id(r.per_layer), ck)] = _layer_run(spec, setup, states, act, r, ck)
    ckpt_cached = setup.checkpointing and copies.trained_layers
    # under selective checkpointing, runs of checkpointed and of plain layers alternate
    runs = tuple(
        replace(kinds[(id(r.per_layer), ck)], count=n, cached_count=n if ckpt_cached and ck else 0)
        for r, n, ck in act.pieces()
    )

    def mean(of: Callable[[LayerRun], int]) -> int:  # a per-layer figure (exact when the layers are alike)
        return sum(r.count * of(r) for r in runs) // grad_layers if runs else 0

    ckpt = setup.checkpointing
    head_copy_grad, head_weight_grad = _head_weight_grads(spec, states, copies)
    chunk_grads, chunk_logits = _chunked_head_grads(spec, setup, dt, states, copies)
    return StepParts(
        weights=states.weights + states.quant + spec.buffer_bytes,
        optimizer=states.opt.state_bytes,
        grads=states.grads,
        grads_head=grads_head,
        grads_per_layer=grads_layer // grad_layers if grad_layers else 0,
        grad_layers=grad_layers,
        # with checkpointing nothing is saved in the forward: the cache holds the trained leaves' copies,
        # and the layer being recomputed makes its own again
        copies_layer=mean(lambda r: r.copies) if runs else (0 if ckpt else copies.layer),
        copies_head=copies.head,
        copies_cached_layer=mean(lambda r: r.copies_cached) if runs else (copies.cached if ckpt else 0),
        cached_layers=copies.trained_layers if ckpt else 0,
        copies_recompute=mean(lambda r: r.copies_recompute),
        frozen_inputs=(_frozen_inputs(spec, setup, dt, act) + _offload_leaf(spec, dt, states, act)) if ckpt else 0,
        frozen_copies=_frozen_copies(spec, setup, dt, act) if ckpt else 0,
        saved_layer=act.saved_layer_bytes,
        recompute_layer=act.mean(lambda r: r.recompute_bytes) if ckpt else 0,
        recompute_transient_layer=act.mean(lambda r: _recompute_transient(r.per_layer, tokens)) if ckpt else 0,
        dispatch_workspace_layer=max((tokens * r.per_layer.dispatch_workspace_per_token for r in act.runs), default=0),
        workspace_layer=act.mean(
            lambda r: tokens * r.per_layer.mlp_workspace_per_token + r.per_layer.mlp_workspace_constant
        ),
        forward_transient=_forward_transient(act),
        rotary=act.rotary if grad_layers else 0,
        head_saved=tokens * head.saved_logsoftmax,
        final_norm_saved=tokens * head.final_norm,
        head_forward_extra=tokens * (head.logits + head.forward_peak_extra) + head.forward_fixed,
        head_backward_extra=tokens * head.backward_peak_extra + head.backward_fixed,
        optimizer_temporaries=states.opt.temp_bytes,
        grads_in_forward=setup.grad_accum > 1,
        tied_grad_pending=_tied_grad_pending(spec, setup, states),
        head_copy_grad=head_copy_grad,
        head_weight_grad=head_weight_grad,
        head_chunk_grads=chunk_grads,
        head_chunk_logits=chunk_logits,
        # NOTE: with tied embeddings the embedding's gradient arrives second and AccumulateGrad adds it
        # out of place: the new gradient and the sum coexist with the old one for a moment. Accumulating
        # into the previous micro-batch's .grad keeps one more gradient-sized tensor alive at that moment
        # (three, as the trace shows, not two).
        embedding_backward_workspace=(
            (3 if setup.grad_accum > 1 else 2) * round_alloc(spec.embedding_count * states.bytes_of["embedding"])
            if setup.method == "full" and spec.tie_word_embeddings
            else 0
        ),
        runs=runs,
        grads_mlp_layer=mean(lambda r: r.grads_mlp),
        mlp_saved_layer=mean(lambda r: r.mlp_saved),
        attention_workspace_layer=mean(lambda r: r.attention_workspace),
        cuda_workspaces=CUDA_WORKSPACES,
        embedding_saved=tokens * embedding_lora_saved(spec, setup, dt),
        embedding_grad_input=(
            tokens * dt.residual * spec.residual_width
            if not spec.tie_word_embeddings and _grad_bytes(states, lambda t: t.kind == "embedding")
            else 0
        ),
    )


def _forward_transient(act: _Activations) -> int:
    """The largest transient of a layer's forward (DoRA's weight norms, an adapted module's output arithmetic,
    DeepSeek-V3.2's indexer) beyond everything
    the layers save, as :func:`cabe.step.timeline` adds it to all of them: a layer's moment comes while only the
    layers below it have saved theirs, so each run's (at its top layer) is less what the layers above it keep. (A
    tiny V3.2 with a dense first layer under MoE layers: the dense layer's indexer moment is the larger, but three
    layers' activations are not there yet; +2.8% with them, traced.)"""
    best = above = 0
    for r, n, ck in reversed(act.pieces()):
        moment = max(
            r.per_layer.dora_norm_bytes,
            act.tokens * r.per_layer.indexer_moment_per_token,
            r.per_layer.dora_result_bytes,  # an adapted module's forward (PEFT's copies, the output arithmetic)
        )
        best = max(best, moment - above)
        above += n * act.kept(r, ck)
    return best


def _frozen_inputs(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, act: _Activations) -> int:
    """Checkpointing: what the layers below the gradient's path (freeze's frozen bottom) keep on the device.

    transformers' checkpointing makes the embeddings' output require grad (modeling_utils.py:3189-3198,
    ``enable_input_require_grads``), so every frozen layer is in autograd's graph: a checkpointed one keeps
    its input (none on the device when offloaded), one left out of selective checkpointing keeps what a
    layer with frozen weights saves."""
    ckpt = sum(1 for i in range(act.first) if act.checkpointed(i))
    kept = 0 if act.offload else ckpt * act.runs[0].saved_layer_bytes
    fdt = _frozen_dtypes(setup, dt)
    plain: dict[int, int] = {}  # each frozen plain layer as its own run saves (DeepSeek-V4's kinds differ)
    index = 0
    for run in spec.runs:
        for _ in range(run.count):
            if index < act.first and not act.checkpointed(index):
                if id(run) not in plain:
                    plain[id(run)] = _run_activations(spec, setup, fdt, run, 0, act.tokens, False).plain_layer_bytes
                kept += plain[id(run)]
            index += 1
    return kept


def _frozen_dtypes(setup: TrainingSetup, dt: Dtypes) -> Dtypes:
    """The dtypes of freeze's frozen layers: the setup's, except with fp32 trained layers (``trainable_fp32``),
    where the frozen ones stay as loaded (16-bit weights: no casts of their weights or inputs under the same
    autocast dtype)."""
    if setup.method == "freeze" and setup.trainable_fp32:
        return dtypes_for(replace(setup, trainable_fp32=False))
    return dt


def _frozen_copies(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, act: _Activations) -> int:
    """Checkpointing under autocast: the frozen layers left out of selective checkpointing are in autograd's
    graph (see :func:`_frozen_inputs`), so each of their matmuls saves autocast's 16-bit cast of its frozen weight
    (not cached: ``cached_cast`` caches only leaves that require grad). olmo-2-7b freeze, fp32 weights under
    bf16 autocast, every 4th layer checkpointed: 24 frozen plain layers' copies, 5.8 GB (−17% without)."""
    plain = sum(1 for i in range(act.first) if not act.checkpointed(i))
    return plain * _weight_copies(spec, setup, _frozen_dtypes(setup, dt), spec.runs[0]).layer if plain else 0


def _offload_leaf(spec: ModelSpec, dt: Dtypes, states: _States, act: _Activations) -> int:
    """Offloading with frozen embeddings: their output stays on the device though layer 0's saved copy is on
    the host. ``enable_input_require_grads`` makes it a leaf that requires grad (transformers 5.24
    modeling_utils.py:2153-2154, ``make_inputs_require_grads``: ``output.requires_grad_(True)``), and the leaf's
    ``AccumulateGrad`` node holds it until backward reaches it (torch/csrc/autograd/functions/accumulate_grad.h,
    ``variable``). (Under checkpointing without offloading it is layer 0's saved input, counted there.)"""
    if not act.offload or _grad_bytes(states, lambda t: t.kind == "embedding"):
        return 0
    return act.tokens * dt.residual * spec.residual_width


def _layer_run(
    spec: ModelSpec, setup: TrainingSetup, states: _States, act: _Activations, r: _RunActivations, ckpt: bool
) -> LayerRun:
    """One run of like layers in the gradient's path: its per-layer gradients, copies and saved tensors
    (``ckpt``: the layers are checkpointed)."""
    c = _weight_copies(spec, setup, dtypes_for(setup), r.group)
    trained = setup.method in ("full", "freeze")
    per_role: dict[str, int] = {}
    largest: dict[bool, int] = {}  # the largest single gradient of the MLP block (True) and of attention (False)
    for t in layer_tensors(spec, setup, r.group, trained):
        if t.trainable:
            per_role[t.role] = per_role.get(t.role, 0) + round_alloc(t.numel * states.bytes_of[t.kind]) * t.count
            # a fused expert stack is one 3-D parameter (its count is the experts): one gradient of all of them
            one = round_alloc(t.numel * (t.count if t.role == "expert" else 1) * states.bytes_of[t.kind])
            mlp = t.role in ("mlp", "router", "expert")
            largest[mlp] = max(largest.get(mlp, 0), one)
    grads = sum(per_role.values())
    # gradient accumulation: AccumulateGrad adds each new gradient into the previous micro-batch's .grad in place
    # (torch/csrc/autograd/functions/accumulate_grad.h, accumulateGrad: ``variable_grad += new_grad`` when it cannot
    # steal it), so the new one lives beside it until then
    accum = setup.grad_accum > 1
    tokens = act.tokens
    return LayerRun(
        count=r.count,
        grads=grads,
        copies=0 if ckpt else c.layer,
        saved=act.kept(r, ckpt),
        # offloaded: the layer's input comes back from the host (a new device tensor: torch/autograd/graph.py,
        # save_on_cpu.unpack_from_cpu ``tensor.to(device)``) while the layer is recomputed
        recompute=(r.recompute_bytes + (r.saved_layer_bytes if act.offload else 0)) if ckpt else 0,
        # checkpointing recomputes each layer's forward in backward: DoRA's weight norms run again there
        workspace=max(
            act.tokens * r.per_layer.mlp_workspace_per_token + r.per_layer.mlp_workspace_constant,
            r.per_layer.dora_norm_bytes if ckpt else 0,
        ),
        copies_recompute=c.layer if ckpt else 0,
        copies_cached=c.cached if ckpt else 0,
        recompute_transient=_recompute_transient(r.per_layer, act.tokens) if ckpt else 0,
        cached_count=r.count if ckpt and c.trained_layers else 0,
        # the MLP block's gradients: its linears' (router and experts included), not the norms'
        grads_mlp=sum(b for role, b in per_role.items() if role in ("mlp", "router", "expert")),
        mlp_saved=tokens * r.per_layer.mlp_saved_per_token,
        attention_workspace=tokens * r.per_layer.attention_workspace_per_token,
        stray_grads=r.per_layer.stray_grad_bytes,
        stray_grads_mlp=r.per_layer.stray_grad_mlp_bytes,
        accum_grad_mlp=largest.get(True, 0) if accum else 0,
        accum_grad_attention=largest.get(False, 0) if accum else 0,
        dispatch_workspace=tokens * r.per_layer.dispatch_workspace_per_token,
        experts_freed=tokens * r.per_layer.experts_freed_per_token,
    )


def _recompute_transient(per_layer: LayerActivations, tokens: int) -> int:
    """A checkpointed layer's largest transient while it is recomputed: PEFT's casts of an adapted module's input
    (at the end of the recompute, all the layer saves is back), DeepSeek-V3.2's indexer or a DoRA module's output
    arithmetic (inside it: less what the layer saves after it), beside the gradient of the layer's output that waits
    for it (``LayerActivations.output_grad_per_token``)."""
    per_token = max(per_layer.lora_forward_transient_per_token, per_layer.indexer_moment_per_token)
    return max(tokens * per_token, per_layer.dora_result_bytes) + tokens * per_layer.output_grad_per_token


def _temporaries_key(setup: TrainingSetup) -> str:
    """The catalog key of the optimizer step's temporaries: GaLore's own, else the implementation's."""
    return "low_rank" if optimizer_entry(setup.optimizer).low_rank else setup.resolved_optimizer_impl


def _model_notes(spec: ModelSpec, setup: TrainingSetup, states: _States) -> tuple[str, ...]:
    notes: list[str] = []
    if attention_kind(spec, setup) == "eager" and setup.attention != "eager":
        notes.append("gemma2_eager")
    if sdpa_gqa_math(spec, setup, dtypes_for(setup).compute):
        notes.append("sdpa_gqa_math")
    if states.opt.paged_bytes:
        notes.append("paged_outside_allocator")
    opt = optimizer_entry(setup.optimizer)
    if opt.modelled:
        notes.append("optimizer_modelled")
    if opt.layerwise:
        notes.append("optimizer_layerwise")
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
        # PEFT matches target_modules against modules (tuners_utils.py check_target_module_exists, 0.21.2) and wraps
        # nn.Linear / Conv1D ones; the fused 3-D experts and a bare router weight are neither, and for this model
        # type or these targets nothing moves onto them (transformers_weight_conversion.py _convert_peft_config_moe)
        notes.append("lora_experts_not_adapted")
    if any(g.mixer == "gated_deltanet" for g in spec.layer_groups):  # fla's / causal-conv1d's saved tensors
        notes.append("gated_deltanet_kernels_modelled")
    return tuple(notes + ssm.notes(spec))


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
        **(meta or {}),
    }


def _explain_model(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    states: _States,
    act: _Activations,
    copies: int,
    head: HeadActivations,
    peak: Any,
    total: int,
) -> list[Step]:
    """The report's explanation, figure by figure: model states, then activations and the peak."""
    return _explain_states(spec, setup, dt, states, copies) + _explain_activations(
        spec, setup, dt, act, head, peak, total
    )


# NOTE: long but flat (radon C or better): one Step literal per explained figure, read top to bottom.
def _explain_states(spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: _States, copies: int) -> list[Step]:
    tensors, weights, quant, grads, opt = states.tensors, states.weights, states.quant, states.grads, states.opt
    n_params, n_train = spec.parameter_count, states.n_train
    steps: list[Step] = []
    pos = " + {p}·{h}" if spec.position_embedding_count else ""
    # one "count × per layer" term per run of like layers (one term when the layers are alike)
    runs = spec.runs
    sfx = [""] if len(runs) == 1 else [f"_{i}" for i in range(len(runs))]
    layer_terms = " + ".join(f"{{layers{x}}} × {{per_layer{x}}}" for x in sfx)
    per_run = {f"layers{x}": run.count for x, run in zip(sfx, runs)}
    per_run.update({f"per_layer{x}": spec.layer_count(run) for x, run in zip(sfx, runs)})
    pos += " + {t}·{h}" if spec.token_type_count else ""
    lm_head = "" if spec.tie_word_embeddings or spec.head != "lm" else " + {v}·{h}"
    lm_head += " + {head}" if spec.classifier_count else ""
    lm_head += " + {vision}" if spec.vision_parameters else ""  # a vision tower and its projector (Gemma 3, Llama 4)
    steps.append(
        Step(
            "model.parameters",
            "{v}·{h}" + pos + " + " + layer_terms + " + {norm}" + lm_head + " = {n}",
            None,
            {
                "v": spec.vocab_size,
                "h": spec.hidden_size,
                "p": spec.max_positions,
                **per_run,
                "norm": spec.norm_param_count,
                "n": n_params,
                # an encoder's token types and classifier head (BERT), only where the model has them
                **({"t": spec.token_types} if spec.token_type_count else {}),
                **({"head": spec.classifier_count} if spec.classifier_count else {}),
                **({"vision": spec.vision_parameters} if spec.vision_parameters else {}),
            },
        )
    )
    frozen = n_params - sum(t.total for t in tensors if t.trainable and t.kind not in ("adapter", "prompt"))
    if quant:
        qn = sum(t.total for t in tensors if t.kind == "quantized")
        steps.append(
            Step(
                "weights.quantized",
                "{n} × {per} B = {bytes} B = {gib} GiB",
                quant,
                {"n": qn, "per": round(quant / qn, 4), "bytes": quant, "gib": quant / GiB},
            )
        )
    dense_n = sum(t.total for t in tensors if t.kind != "quantized")
    steps.append(
        Step(
            "weights.dense",
            "{n} × {per} B = {bytes} B = {gib} GiB",
            weights,
            {
                "n": dense_n,
                "per": round(weights / max(dense_n, 1), 3),
                "bytes": weights,
                "gib": weights / GiB,
                "frozen": frozen,
            },
        )
    )
    if spec.buffer_bytes:
        steps.append(
            Step(
                "weights.buffers",
                "{bytes} B = {gib} GiB",
                spec.buffer_bytes,
                {"bytes": spec.buffer_bytes, "gib": spec.buffer_bytes / GiB},
            )
        )
    steps.append(
        Step(
            "gradients",
            "{n} × {per} B = {bytes} B = {gib} GiB",
            grads,
            {
                "n": n_train,
                "per": dt.grad if setup.method in ("full", "freeze") else dt.adapter,
                "bytes": grads,
                "gib": grads / GiB,
            },
        )
    )
    steps.append(
        Step(
            "optimizer." + setup.optimizer,
            "{n} × {per} B = {bytes} B = {gib} GiB",
            opt.state_bytes,
            {
                "n": n_train,
                "per": round(opt.state_bytes_per_param, 3),
                "bytes": opt.state_bytes,
                "gib": opt.state_bytes / GiB,
            },
        )
    )
    if opt.paged_bytes:
        steps.append(
            Step(
                "optimizer.paged",
                "{bytes} B = {gib} GiB",
                opt.paged_bytes,
                {"bytes": opt.paged_bytes, "gib": opt.paged_bytes / GiB},
            )
        )
    steps.append(
        Step(
            "cuda_workspaces",
            "2 × 32 MiB = {bytes} B = {gib} GiB",
            CUDA_WORKSPACES,
            {"bytes": CUDA_WORKSPACES, "gib": CUDA_WORKSPACES / GiB},
        )
    )
    if opt.temp_bytes:
        steps.append(
            Step(
                "optimizer_temporaries." + _temporaries_key(setup),
                "{bytes} B = {gib} GiB",
                opt.temp_bytes,
                {"bytes": opt.temp_bytes, "gib": opt.temp_bytes / GiB},
            )
        )
    if copies:
        steps.append(
            Step(
                "weight_copies",
                "2 B × {n} = {bytes} B = {gib} GiB",
                copies,
                {"n": copies // 2, "bytes": copies, "gib": copies / GiB},
            )
        )
    return steps


def _checkpointed_steps(spec: ModelSpec, dt: Dtypes, act: _Activations) -> list[Step]:
    """Checkpointing: the inputs the checkpointed layers keep (on the host when offloaded) and, under
    selective checkpointing, the full activations of the layers left out."""
    ckpt_layers = act.checkpointed_layers
    inputs = sum(n * r.saved_layer_bytes for r, n, ck in act.pieces() if ck)
    # (the residual's width: h, or DeepSeek-V4's hc_mult streams of it)
    params = {"layers": ckpt_layers, "tokens": act.tokens, "rho": dt.residual, "h": spec.residual_width}
    formula = "{layers} × {tokens} tokens × {rho}·{h} = {bytes} B = {gib} GiB"
    code = "activations.offloaded" if act.offload else "activations.checkpointed"
    steps = [Step(code, formula, 0 if act.offload else inputs, {**params, "bytes": inputs, "gib": inputs / GiB})]
    plain = [(r, n) for r, n, ck in act.pieces() if not ck]
    if plain:
        layers = sum(n for _, n in plain)
        kept = sum(n * r.plain_layer_bytes for r, n in plain)
        steps.append(
            Step(
                "activations.selective",
                "{layers} × {per_layer} B = {bytes} B = {gib} GiB",
                kept,
                {"layers": layers, "every": act.every, "per_layer": kept // layers, "bytes": kept, "gib": kept / GiB},
            )
        )
    return steps


def _per_layer_step(per_layer: LayerActivations, layers: int | None) -> Step:
    """The saved tensors of one layer, term by term (``layers``: how many such layers, when they differ)."""
    return Step(
        "activations.per_layer",
        "{terms} = {per_token} B/token",
        None,
        {
            "terms": " + ".join(t.formula for t in per_layer.terms),
            "per_token": per_layer.bytes_per_token,
            **({"layers": layers} if layers is not None else {}),
            "detail": [
                {"name": t.name, "formula": t.formula, "bytes_per_token": t.bytes_per_token} for t in per_layer.terms
            ],
        },
    )


# NOTE: long but flat (radon C or better): one Step literal per explained figure, read top to bottom.
def _explain_activations(
    spec: ModelSpec, setup: TrainingSetup, dt: Dtypes, act: _Activations, head: HeadActivations, peak: Any, total: int
) -> list[Step]:
    tokens, grad_layers, saved = act.tokens, act.grad_layers, act.saved_bytes
    # one step per kind of layer in the gradient's path (one when the layers are alike)
    by_id: dict[int, tuple[LayerActivations, int]] = {}  # (runs of one kind share one LayerActivations)
    for r in act.runs:
        by_id[id(r.per_layer)] = (r.per_layer, by_id.get(id(r.per_layer), (r.per_layer, 0))[1] + r.count)
    kinds = dict(by_id.values())
    sfx = [""] if len(kinds) == 1 else [f"_{i}" for i in range(len(kinds))]
    steps = [_per_layer_step(per_layer, count if len(kinds) > 1 else None) for per_layer, count in kinds.items()]
    if setup.checkpointing:
        steps += _checkpointed_steps(spec, dt, act)
    else:
        terms = " + ".join(f"{{layers{x}}} × {{tokens}} tokens × {{per_token{x}}} B" for x in sfx)
        per_kind = {f"layers{x}": n for x, n in zip(sfx, kinds.values())}
        per_kind.update({f"per_token{x}": k.bytes_per_token for x, k in zip(sfx, kinds)})
        steps.append(
            Step(
                "activations.layers",
                terms + " = {bytes} B = {gib} GiB",
                saved,
                {
                    "layers": grad_layers,
                    "tokens": tokens,
                    **per_kind,
                    "bytes": saved,
                    "gib": saved / GiB,
                },
            )
        )
    steps.append(
        Step(
            "logits",
            "{tokens} tokens × {v} × ({a} + 4 + 4) B = {bytes} B = {gib} GiB",
            tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra),
            {
                "tokens": tokens,
                "v": spec.vocab_size,
                "a": dt.compute,
                "bytes": tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra),
                "gib": tokens * (head.logits + head.saved_logsoftmax + head.forward_peak_extra) / GiB,
            },
        )
    )
    steps.append(
        Step(
            "peak." + peak.phase,
            " + ".join("{" + k + "}" for k, v in peak.components.items() if v) + " = {total} B = {gib} GiB",
            total,
            {**{k: v for k, v in peak.components.items() if v}, "total": total, "gib": total / GiB},
        )
    )
    return steps
