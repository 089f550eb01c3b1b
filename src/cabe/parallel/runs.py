"""The gradient's path run by run on one GPU of a multi-GPU plan: :func:`shard_runs`.

A model whose layers differ (a MoE layer among dense ones, Gemma's sliding windows, Granite's / Jamba's / Qwen3-Next's
hybrids, DeepSeek's first dense layers) is walked by :func:`cabe.step.timeline` one run of like layers at a time
(:class:`cabe.step.LayerRun`, built by cabe.analytic.parts ``_layer_run``). A plan applies to each run what it applies
to the one-GPU per-layer figures (:func:`cabe.parallel.plan._activations`): the pipeline stage keeps its own layers,
TP / SP split each run's saved tensors by its own all-gathered inputs, the gradients are the strategy's share of each
run's tensors, and FSDP's per-unit buffers (gathered parameters, unsharded gradients, reduce-scatter input) are sized
by the run's own layer (:class:`cabe.step.RunBuffers`): a MoE unit gathers many times a dense unit's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cabe.architecture import ModelSpec
from cabe.frozen import evolve
from cabe.parallel.activations import TensorParallelFactors, sequence_parallel, tensor_parallel_saved
from cabe.parallel.layout import Layout, stage_layers
from cabe.parallel.shares import RunUnit, run_unit
from cabe.parallel.strategy import Context
from cabe.step import LayerRun, RunBuffers


def stage_runs(runs: tuple[LayerRun, ...], spec: ModelSpec, lay: Layout) -> tuple[LayerRun, ...]:
    """The runs of the gradient's path (the model's top layers, bottom first) that lie on this pipeline stage: the
    stage holds consecutive layers (:func:`cabe.parallel.layout.stage_layers`, the first stages taking the rest)."""
    if lay.pp == 1:
        return runs
    lo = sum(stage_layers(spec.num_layers, lay.pp, i) for i in range(lay.stage))
    hi = lo + lay.stage_layers
    start = spec.num_layers - sum(r.count for r in runs)
    out: list[LayerRun] = []
    for r in runs:
        n = min(start + r.count, hi) - max(start, lo)
        if n == r.count:
            out.append(r)
        elif n > 0:
            out.append(evolve(r, count=n, cached_count=n if r.cached_count else 0))
        start += r.count
    return tuple(out)


@dataclass(frozen=True)
class RunFactors:
    """What the plan applies to one layer's figures on this GPU (as :func:`cabe.parallel.plan._activations` applies
    them to the mean layer's)."""

    f: TensorParallelFactors
    tp: int
    sp: bool  # sequence parallelism (tensor by tensor: cabe.parallel.activations.sequence_parallel)
    inflight: int  # pipeline micro-batches whose activations wait
    keep: bool  # autocast's copies stay (States.keep_copies)
    per_tp: float  # the share of a layer's weight copies under TP


def shard_run(r: LayerRun, x: RunFactors, grads: int, buffers: RunBuffers | None) -> LayerRun:
    """One run's per-layer figures on this GPU, ``grads`` its layer's gradients there."""
    f = x.f
    if x.tp > 1 and x.sp:  # tensor by tensor: what stays whole (a checkpointed layer's input is split by t)
        saved = sequence_parallel(r.saved, r.gathered, x.tp)
        recompute = sequence_parallel(r.recompute, r.gathered_recompute, x.tp)
        mlp_saved = sequence_parallel(r.mlp_saved, r.mlp_gathered, x.tp)
    elif x.tp > 1:  # tensor by tensor: the stream's tensors and the gathered inputs stay whole
        saved = tensor_parallel_saved(r.saved, r.stream + r.gathered, x.tp)
        recompute = tensor_parallel_saved(r.recompute, r.stream_recompute + r.gathered_recompute, x.tp)
        mlp_saved = tensor_parallel_saved(r.mlp_saved, r.mlp_stream + r.mlp_gathered, x.tp)
    else:
        saved, recompute, mlp_saved = r.saved, r.recompute, r.mlp_saved
    copies = (lambda b: round(b * x.per_tp)) if x.keep else (lambda b: 0)
    return evolve(
        r,
        grads=grads,
        # the layer's backward split: the MLP's gradients shrink as the layer's do
        grads_mlp=round(r.grads_mlp * grads / r.grads) if r.grads else 0,
        copies=copies(r.copies),
        copies_cached=copies(r.copies_cached),
        copies_recompute=copies(r.copies_recompute),
        saved=round(saved * x.inflight),
        recompute=round(recompute),
        mlp_saved=round(mlp_saved),
        workspace=round(r.workspace * f.saved),
        attention_workspace=round(r.attention_workspace * f.saved),
        recompute_transient=round(r.recompute_transient * f.saved),
        dispatch_workspace=round(r.dispatch_workspace * f.saved),
        experts_freed=round(r.experts_freed * f.saved),
        # NOTE: gradient accumulation's new gradient beside the last micro-batch's .grad and DoRA's throwaway
        # gradients are one-GPU mechanisms the plans do not follow (FSDP2 reduce-scatters the unsharded gradient
        # before it meets the sharded .grad): left out, as the plans' mean layer left them
        accum_grad_mlp=0,
        accum_grad_attention=0,
        stray_grads=0,
        stray_grads_mlp=0,
        buffers=buffers,
    )


def shard_runs(
    runs: tuple[LayerRun, ...],
    spec: ModelSpec,
    c: Context,
    x: RunFactors,
    layer_grads: float,
    unit_buffers: Callable[[Context], RunBuffers] | None,
) -> tuple[LayerRun, ...]:
    """``runs`` (this stage's: :func:`stage_runs`) on this GPU. ``layer_grads``: the gradients of every layer of them
    on this GPU (the strategy's), shared out by each run's tensors (their TP / EP share: :class:`RunUnit`);
    ``unit_buffers``: the strategy's per-unit buffers for a context whose layer is one run's (FSDP), where a run's
    unit differs from the mean one the plan sized."""
    units: dict[int, RunUnit] = {}
    split = c.layout.tp > 1 or c.layout.ep > 1
    if split or unit_buffers is not None:
        for r in runs:
            if id(r.group) not in units and r.group is not None:
                units[id(r.group)] = run_unit(spec, c.setup, c.cfg, c.dt, c.layout, r.group)
    weight = [r.grads * (units[id(r.group)].trainable_share if split and r.group is not None else 1.0) for r in runs]
    total = sum(r.count * w for r, w in zip(runs, weight, strict=True))
    scale = layer_grads / total if total else 0.0
    buffers: dict[int, RunBuffers | None] = {}
    if unit_buffers is not None:
        for key, u in units.items():
            buffers[key] = None if _close(u, c) else unit_buffers(_with_unit(c, u))
    return tuple(shard_run(r, x, round(w * scale), buffers.get(id(r.group))) for r, w in zip(runs, weight, strict=True))


def _close(u: RunUnit, c: Context) -> bool:
    """The run's unit is the mean one (a model whose layers are alike: float sums aside)."""
    m = c.mine
    pairs = (
        (u.elements, m.layer_elements),
        (u.quantized, m.layer_quantized),
        (u.trainable_elements, m.layer_trainable_elements),
    )
    return all(abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1.0) for a, b in pairs)


def _with_unit(c: Context, u: RunUnit) -> Context:
    """``c`` whose one decoder layer is the run's."""
    mine = replace(c.mine, layer_elements=u.elements, layer_quantized=u.quantized)
    mine.layer_trainable_elements = u.trainable_elements
    return replace(c, mine=mine)
