"""A multi-GPU (or offloaded) step, seen from its busiest GPU: :func:`shard_parts`.

1. the layout (:mod:`~cabe.parallel.layout`); 2. every parameter tensor's share on one GPU, summed
(:mod:`~cabe.parallel.shares`); 3. the data-parallel strategy's states (:data:`STRATEGIES`, one
module each); 4. TP / SP / PP / EP on the saved tensors and buffers (:mod:`~cabe.parallel.activations`);
5. the figures and steps (:mod:`~cabe.parallel.explain`). Every pipeline stage whose holdings differ
(the first and the last) is planned, and the one with the highest peak is returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.parallel import config as _config
from cabe.parallel import context, ddp, fsdp, loading, zero
from cabe.parallel.activations import (
    communication_buffers,
    expert_parallel,
    micro_batches_in_flight,
    sequence_parallel,
    tensor_parallel,
    tensor_parallel_saved,
)
from cabe.parallel.config import ShardConfig
from cabe.parallel.explain import per_gpu, step_json, steps
from cabe.parallel.layout import Layout, layout, stage_layers
from cabe.parallel.runs import RunFactors, shard_runs, stage_runs
from cabe.parallel.shares import holdings
from cabe.parallel.strategy import Context, States, unsharded
from cabe.parameters import parameter_tensors
from cabe.precision import dtypes_for
from cabe.step import RunBuffers, StepParts, timeline
from cabe.training import TrainingSetup

#: one function per data-parallel strategy: Context -> States
STRATEGIES: dict[str, Callable[[Context], States]] = {
    "none": unsharded,
    "ddp": ddp.states,
    "zero1": zero.states,
    "zero2": zero.states,
    "zero3": zero.states,
    "fsdp": fsdp.states,
    "fsdp-hybrid": fsdp.states,
}


def shard_parts(
    parts: StepParts, spec: ModelSpec, setup: TrainingSetup, config: ShardConfig | None = None
) -> tuple[StepParts, dict[str, Any]]:
    """Per-GPU step parts for a multi-GPU (or offloaded) setup, and what explains them.

    Returns the parts of the pipeline stage whose peak is highest, and ``info`` with
    ``host_ram_bytes_per_node``, ``per_gpu`` figures, ``notes`` (codes) and ``steps``.
    """
    cfg = config or _config.DEFAULT_CONFIG
    lay, notes = layout(spec, setup, cfg)
    dt = dtypes_for(setup)
    tensors = parameter_tensors(spec, setup)

    best: tuple[int, StepParts, dict[str, Any]] | None = None
    per_stage: list[dict[str, Any]] = []
    for stage in sorted({0, lay.pp - 1}):
        here = lay.at_stage(stage)
        ctx = Context(setup, cfg, dt, here, holdings(spec, setup, cfg, tensors, dt, here))
        new, info = _gpu_parts(parts, spec, ctx)
        peak = max(m.total for m in timeline(new))
        per_stage.append({"stage": stage, "peak_bytes": peak})
        if best is None or peak > best[0]:
            best = (peak, new, info)
    assert best is not None
    _, new, info = best
    info["notes"] = notes + info["notes"]
    if lay.pp > 1:
        info["pipeline_stages"] = per_stage
    return new, info


def _gpu_parts(parts: StepParts, spec: ModelSpec, c: Context) -> tuple[StepParts, dict[str, Any]]:
    """One GPU's parts: the strategy's states, then model parallelism on activations and buffers."""
    setup, cfg, lay = c.setup, c.cfg, c.layout
    st = STRATEGIES[lay.strategy](c)
    new = _activations(parts, spec, c, st)
    nodes = math.ceil(setup.gpus / setup.gpus_per_node)
    per_node = min(setup.gpus, setup.gpus_per_node)
    host_per_gpu = round(st.host)
    # loading the checkpoint, per loading path (cabe.parallel.loading); reported beside the steady state
    load = loading.plan_load(c, spec, st.weights, per_node)
    figures = per_gpu(new, st.buffers["optimizer"].get("master_weights", 0), host_per_gpu, st.state_grads)
    inflight = micro_batches_in_flight(lay, setup.grad_accum, cfg)
    info: dict[str, Any] = {
        "strategy": lay.strategy,
        "world_size": setup.gpus,
        "dp": lay.dp,
        "tp": lay.tp,
        "pp": lay.pp,
        "ep": lay.ep,
        **context.info(setup),
        "shard_group": lay.shard_group,
        "nodes": nodes,
        "gpus_per_node": setup.gpus_per_node,
        "offload": setup.offload,
        "stage": lay.stage,
        "stage_layers": lay.stage_layers,
        "micro_batches_in_flight": inflight,
        "per_gpu": figures,
        "host_ram_bytes_per_node": host_per_gpu * per_node,
        "host_ram_load_peak_bytes_per_node": load.host_bytes_per_node,
        **loading.load_json(load),
        "config": asdict(cfg),
        "notes": st.notes,
        "steps": [
            step_json(s)
            for s in [*steps(lay, inflight, figures, per_node, setup.sequence_parallel), loading.load_step(load)]
        ],
    }
    return new, info


def _grad_layers(parts: StepParts, spec: ModelSpec, setup: TrainingSetup, lay: Layout) -> int:
    """Layers on this stage whose parameters get gradients."""
    n = lay.stage_layers
    if setup.method == "freeze" and lay.pp > 1:
        # freeze trains the LAST layers: they live on the last stages
        below = spec.num_layers - sum(stage_layers(spec.num_layers, lay.pp, i) for i in range(lay.stage + 1))
        return max(0, min(n, parts.grad_layers - below))
    return min(parts.grad_layers, n) if parts.grad_layers else 0


def _frozen_inputs(parts: StepParts, spec: ModelSpec, stage_layers: int, grad_layers: int) -> float:
    """The checkpointed inputs this stage's layers outside the gradient's path keep."""
    return _frozen_share(parts.frozen_inputs, parts, spec, stage_layers, grad_layers)


def _frozen_share(total: int, parts: StepParts, spec: ModelSpec, stage_layers: int, grad_layers: int) -> float:
    """This stage's share of ``total``, held evenly by the layers outside the gradient's path."""
    frozen_all = spec.num_layers - parts.grad_layers
    if not total or not frozen_all:
        return 0.0
    return total / frozen_all * max(0, stage_layers - grad_layers)


def _grads_split(
    parts: StepParts, grads_total: float, lay: Layout, layer_frac: float, grad_layers: int
) -> tuple[float, float]:
    """This GPU's gradients of the loss head (last stage only) and per trained layer."""
    g_ratio = grads_total / parts.grads if parts.grads else 0.0
    grads_head = (
        parts.grads_head * g_ratio / (layer_frac if lay.pp > 1 else 1) * (1 if lay.last else 0) if parts.grads else 0
    )
    grads_head = min(grads_head, grads_total)
    return grads_head, (grads_total - grads_head) / grad_layers if grad_layers else 0


def _context_parallel(parts: StepParts, spec: ModelSpec, setup: TrainingSetup, dt: Any) -> StepParts:
    """Context parallelism: the tokens' tensors of s / cp positions, and attention's buffers (cabe.parallel.context)."""
    if setup.cp == 1:
        return parts
    k = context.share(setup)
    per_token = {
        name: round(getattr(parts, name) * k)
        for name in (
            *("saved_layer", "recompute_layer", "recompute_transient_layer", "dispatch_workspace_layer"),
            *("workspace_layer", "mlp_saved_layer", "gathered_layer", "gathered_recompute_layer"),
            *("mlp_gathered_layer", "final_norm_gathered", "frozen_inputs", "rotary", "head_saved"),
            *("final_norm_saved", "head_forward_extra", "head_backward_extra", "head_chunk_logits"),
            *("embedding_grad_input", "embedding_saved", "stream_layer", "stream_recompute_layer", "mlp_stream_layer"),
        )
    }
    ring = context.attention_buffers(spec, setup, setup.tp, dt.compute)
    # each run of a model whose layers differ (cabe.parallel.runs) alike, before its own TP / SP split
    runs = tuple(
        replace(
            r,
            **{name: round(getattr(r, name) * k) for name in _RUN_PER_TOKEN},
            attention_workspace=round(r.attention_workspace * k) + ring,
        )
        for r in parts.runs
    )
    return replace(
        parts, **per_token, runs=runs, attention_workspace_layer=round(parts.attention_workspace_layer * k) + ring
    )


#: a LayerRun's figures that grow with the tokens (the per-token ones of :func:`_context_parallel`)
_RUN_PER_TOKEN = (
    *("saved", "recompute", "workspace", "mlp_saved", "recompute_transient", "dispatch_workspace", "experts_freed"),
    *("gathered", "gathered_recompute", "mlp_gathered", "stream", "stream_recompute", "mlp_stream"),
)


def _activations(parts: StepParts, spec: ModelSpec, c: Context, st: States) -> StepParts:
    setup, cfg, lay = c.setup, c.cfg, c.layout
    parts = _context_parallel(parts, spec, setup, c.dt)
    f = tensor_parallel(setup)
    inflight = micro_batches_in_flight(lay, setup.grad_accum, cfg)
    saved = parts.saved_layer * (f.checkpointed if setup.checkpointing else f.saved)
    recompute, mlp_saved, final_norm = parts.recompute_layer * f.saved, parts.mlp_saved_layer * f.saved, None
    if lay.tp > 1 and setup.sequence_parallel:  # tensor by tensor: what stays whole (sequence_parallel)
        saved = sequence_parallel(parts.saved_layer, parts.gathered_layer, lay.tp)
        recompute = sequence_parallel(parts.recompute_layer, parts.gathered_recompute_layer, lay.tp)
        mlp_saved = sequence_parallel(parts.mlp_saved_layer, parts.mlp_gathered_layer, lay.tp)
        final_norm = round(sequence_parallel(parts.final_norm_saved, parts.final_norm_gathered, lay.tp))
    elif lay.tp > 1:  # tensor by tensor: the stream's tensors and the gathered inputs stay whole
        saved = tensor_parallel_saved(parts.saved_layer, parts.stream_layer + parts.gathered_layer, lay.tp)
        whole = parts.stream_recompute_layer + parts.gathered_recompute_layer
        recompute = tensor_parallel_saved(parts.recompute_layer, whole, lay.tp)
        whole = parts.mlp_stream_layer + parts.mlp_gathered_layer
        mlp_saved = tensor_parallel_saved(parts.mlp_saved_layer, whole, lay.tp)
    head_on = lay.last
    # TP's plan cuts the lm_head's weight over the vocabulary whatever the loss (``colwise_gather_output`` gathers
    # the logits, not the weight: transformers 5.25 distributed/tensor_parallel.py ``ColwiseParallel.shard_param``;
    # a tied one is the vocabulary-sharded embedding's): its autocast copy and their gradients are shards (rank 0
    # traced on a fake group: qwen2.5-72b full bf16-amp, FSDP2 over TP 4 with the logits gathered, +5.7% with them
    # whole); what ``f.head`` scales is the logits' (loss_parallel)
    per_tp = 1 / lay.tp if lay.tp > 1 else 1
    layer_frac = lay.stage_layers / spec.num_layers
    grad_layers = _grad_layers(parts, spec, setup, lay)
    grads_total = st.grads
    g_share = grads_total / parts.grads if parts.grads else 0.0
    embedding_workspace = parts.embedding_backward_workspace
    if st.whole_head_grads and parts.grads:
        # the strategy's head gradients are made whole (States.whole_head_grads: FSDP's unsharded parameter's)
        unsharded = st.whole_head_grads
        head_grad_share = unsharded / lay.tp  # (the lm_head's weight: a vocabulary shard under TP, see below)
        if embedding_workspace and lay.tp == 1:  # (under TP the parts already say it: analytic.parts)
            # the tied embedding's backward (step.StepParts.embedding_backward_workspace): the lm_head's gradient,
            # the embedding's own and their sum, all unsharded (on one GPU the sum is the .grad the gradients count;
            # here the .grad is a shard, and the sum is made whole before the root's reduce-scatter)
            one = embedding_workspace // (3 if setup.grad_accum > 1 else 2)
            embedding_workspace = round((2 if st.head_grad_counted else 3) * one * unsharded)
        elif embedding_workspace:  # (TP: the parts' whole gradient and two shards, in the stored dtype)
            embedding_workspace = round(embedding_workspace * unsharded)
    else:
        head_grad_share = g_share
    grads_head, grads_per_layer = _grads_split(parts, grads_total, lay, layer_frac, grad_layers)
    comm = communication_buffers(spec, setup, lay, cfg, c.dt)
    ep_forward, ep_backward = expert_parallel(spec, setup, lay, c.dt)  # (AllToAllEP's exchange, per MoE layer)
    keep = st.keep_copies
    layer_copies = parts.copies_layer * per_tp if keep else 0
    head_copies = parts.copies_head * per_tp * (1 if head_on else 0) if keep else 0
    # the trained layers on this stage (freeze trains the last ones, as the gradient layers)
    cached_layers = min(parts.cached_layers, grad_layers) if lay.pp > 1 else parts.cached_layers
    frozen_layers = max(0, lay.stage_layers - grad_layers)
    runs = stage_runs(parts.runs, spec, lay)
    if runs:  # every per-layer figure below, run by run (cabe.parallel.runs)
        x = RunFactors(f, lay.tp, setup.sequence_parallel, inflight, keep, per_tp)
        units = None
        if lay.strategy in _UNITS:
            units = lambda u: _run_buffers(parts, _UNITS[lay.strategy](u), comm, frozen_layers)  # noqa: E731
        runs = shard_runs(runs, spec, c, x, grads_per_layer * grad_layers, units)
        if ep_backward:  # the exchange's received gradient beside each MoE run's routed-experts backward
            runs = tuple(
                replace(r, dispatch_workspace=r.dispatch_workspace + round(ep_backward)) if r.dispatch_workspace else r
                for r in runs
            )
    return replace(
        parts,
        weights=round(st.weights),
        optimizer=round(st.optimizer),
        grads=round(grads_total),
        grads_at_step=None if st.step_grads is None else round(st.step_grads),
        grads_at_embedding=None if st.embedding_grads is None else round(st.embedding_grads),
        grads_head=round(grads_head),
        grads_per_layer=round(grads_per_layer),
        grad_layers=grad_layers,
        copies_layer=round(layer_copies),
        copies_head=round(head_copies),
        copies_cached_layer=round(parts.copies_cached_layer * per_tp) if keep else 0,
        cached_layers=cached_layers,
        copies_recompute=round(parts.copies_recompute * per_tp) if keep and grad_layers else 0,
        saved_layer=round(saved * inflight),
        frozen_inputs=round(_frozen_inputs(parts, spec, lay.stage_layers, grad_layers) * f.checkpointed * inflight),
        frozen_copies=round(_frozen_share(parts.frozen_copies, parts, spec, lay.stage_layers, grad_layers) * per_tp),
        recompute_layer=round(recompute),
        recompute_transient_layer=round(parts.recompute_transient_layer * f.saved),
        dispatch_workspace_layer=round(parts.dispatch_workspace_layer * f.saved + ep_backward),
        forward_transient=max(parts.forward_transient, round(ep_forward + st.experts_gathered if ep_forward else 0)),
        workspace_layer=round(parts.workspace_layer * f.saved),
        # the layer's backward split (step.LayerRun): the MLP's gradients shrink as the layer's do, its saved
        # tensors and attention's workspace as the layer's activations do
        grads_mlp_layer=round(parts.grads_mlp_layer * grads_per_layer / parts.grads_per_layer)
        if parts.grads_per_layer
        else 0,
        mlp_saved_layer=round(mlp_saved),
        attention_workspace_layer=round(parts.attention_workspace_layer * f.saved),
        embedding_grad_input=parts.embedding_grad_input if lay.first else 0,
        embedding_backward_workspace=embedding_workspace,
        rotary=round(parts.rotary * inflight) if grad_layers else 0,
        head_saved=round(parts.head_saved * f.head) if head_on else 0,
        final_norm_saved=parts.final_norm_saved if final_norm is None else final_norm,
        head_forward_extra=round(parts.head_forward_extra * f.head) if head_on else 0,
        head_backward_extra=round(parts.head_backward_extra * f.head) if head_on else 0,
        optimizer_temporaries=round(st.temporaries),
        # the head's weight gradients (tied pending, autocast's 16-bit one) shrink as the gradients do
        tied_grad_pending=round(parts.tied_grad_pending * head_grad_share) if head_on else 0,
        head_copy_grad=round(parts.head_copy_grad * per_tp) if head_on and keep else 0,
        head_weight_grad=round(parts.head_weight_grad * head_grad_share) if head_on else 0,
        head_chunk_grads=round(parts.head_chunk_grads * head_grad_share) if head_on else 0,
        head_chunk_logits=round(parts.head_chunk_logits * f.head) if head_on else 0,
        grads_in_forward=parts.grads_in_forward or (lay.pp > 1 and setup.grad_accum > 1),
        runs=runs,
        **_extras(parts, st, comm, frozen_layers),
        # (a flush's "gradients" overrides the moment's, zero included: ZeRO-1's whole gradients all copied into the bucket)
        extra_flush=tuple((k, {n: round(v) for n, v in d.items() if v or n == "gradients"}) for k, d in st.flushes),
    )


#: the strategies whose buffers are sized by the unit of the layer running (FSDP's gathered parameters, unsharded
#: gradients, reduce-scatter input): Context -> States, run again with each run's layer (cabe.parallel.runs)
_UNITS: dict[str, Callable[[Context], States]] = {"fsdp": fsdp.states, "fsdp-hybrid": fsdp.states}
_RUN_BUFFERS = tuple(f.name for f in fields(RunBuffers))


def _run_buffers(parts: StepParts, st: States, comm: dict[str, float], frozen_layers: int) -> RunBuffers:
    """The step's buffers while one run's unit is the one they hold (``st``: the strategy's, with that unit)."""
    ex = _extras(parts, st, comm, frozen_layers)
    return RunBuffers(*(ex[k] for k in _RUN_BUFFERS))


def _extras(parts: StepParts, st: States, comm: dict[str, float], frozen_layers: int) -> dict[str, Any]:
    """The strategy's buffers and the communication buffers ``comm`` as the StepParts ``extra_*`` fields."""
    for name, nbytes in comm.items():
        st.buffers["forward"][name] = nbytes
        st.buffers["backward"][name] = nbytes
    extra = {ph: {k: round(v) for k, v in st.buffers[ph].items() if v} for ph in st.buffers}
    pending = {k: round(v) for k, v in st.pending_layer.items() if v}
    embedding = None if st.embedding_backward is None else {k: round(v) for k, v in st.embedding_backward.items() if v}
    for name, nbytes in pending.items():
        # the stage's layers outside the gradient's path (freeze's frozen bottom) have no backward: what they hold
        # stays to the end of backward (FSDP2's root callback reshards them: cabe.parallel.fsdp)
        frozen = nbytes * frozen_layers
        for d in (extra["forward"], extra["backward"], *([embedding] if embedding is not None else [])):
            if frozen:
                d[name] = d.get(name, 0) + frozen
    return {
        "extra_forward": {**parts.extra_forward, **extra["forward"]},
        "extra_backward": {**parts.extra_backward, **extra["backward"]},
        "extra_optimizer": {**parts.extra_optimizer, **extra["optimizer"]},
        "extra_layer_backward": {**parts.extra_layer_backward, **_rounded(st.layer_backward)},
        "extra_below_top": {**parts.extra_below_top, **_rounded(st.below_top)},
        "extra_above_bottom": {**parts.extra_above_bottom, **_rounded(st.above_bottom)},
        "extra_layer_grads": {**parts.extra_layer_grads, **_rounded(st.layer_grads)},
        "extra_pending_layer": {**parts.extra_pending_layer, **pending},
        "extra_done_layer": {**parts.extra_done_layer, **_rounded(st.done_layer)},
        "extra_embedding": None if embedding is None else {**parts.extra_backward, **extra["backward"], **embedding},
        "extra_forward_start": {**parts.extra_forward_start, **_rounded(st.forward_start)},
    }


def _rounded(d: dict[str, float]) -> dict[str, int]:
    return {k: round(v) for k, v in d.items() if v}
