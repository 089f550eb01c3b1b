"""The training step as a sequence of moments, and the peak among them.

:class:`StepParts` holds the per-GPU sizes a step is made of (bytes); :func:`timeline` walks the
steady-state step (step 2 onwards) and returns what is live at each moment that can be a peak.
Sharding (:mod:`cabe.parallel`) transforms the parts before the walk; the walk is the same.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cabe.step_parts import LayerRun, Moment, RunBuffers, StepParts

__all__ = ["LayerRun", "Moment", "RunBuffers", "StepParts", "layerwise", "timeline"]


def timeline(p: StepParts) -> list[Moment]:
    """The moments of a steady-state step that can hold the peak.

    Between the top and the bottom layer of a run of like layers, live memory during backward is linear
    in the layer index (activations freed, gradients added at constant rates), so the run's two ends
    bound it: each run of :func:`StepParts.layer_runs` adds its two ends. A sharded plan's per-unit buffers
    (:class:`RunBuffers`) follow the run whose layer holds them: the top run's beside the loss head, the bottom
    run's beside the embedding's backward.
    """
    runs = p.layer_runs()
    whole, p = p, _with(p, runs[-1]) if runs and runs[-1].buffers is not None else p  # (``whole``: every run's pending)
    base = {"weights": p.weights, "optimizer": p.optimizer}
    g_acc = p.grads if p.grads_in_forward else 0
    saved_all = sum(r.count * r.saved for r in runs)
    copies_all = sum(r.count * r.copies for r in runs) + p.frozen_copies
    acts_all = saved_all + p.rotary + p.final_norm_saved + p.frozen_inputs + p.embedding_saved + p.vision_saved
    n_path = sum(r.count for r in runs)
    moments = [
        Moment(
            "forward",
            "loss",
            {
                **base,
                "gradients": g_acc,
                "weight_copies": copies_all + sum(r.copies_cached * r.cached_count for r in runs) + p.copies_head,
                "activations": acts_all,
                "logits": p.head_saved + p.head_forward_extra,
                **_pending(whole, runs, p.extra_forward),
            },
        ),
        Moment(
            "backward",
            "head",
            {
                **base,
                "gradients": g_acc,
                "weight_copies": copies_all + p.copies_head,
                "activations": acts_all,
                "logits": p.head_saved + p.head_backward_extra,
                **_pending(whole, runs, p.extra_backward),
            },
        ),
    ]
    if p.extra_forward_start:  # (the first layer's unit gathered: nothing saved yet)
        moments.append(
            Moment(
                "forward",
                "start",
                {**base, "gradients": g_acc, "activations": p.rotary + p.embedding_saved, **p.extra_forward_start},
            )
        )
    if p.forward_transient:
        moments.append(
            Moment(
                "forward",
                "top_layer",
                {
                    **base,
                    "gradients": g_acc,
                    "weight_copies": copies_all + sum(r.copies_cached * r.cached_count for r in runs),
                    "activations": acts_all + p.forward_transient,
                    **_pending(whole, runs, p.extra_forward),
                },
            )
        )
    if p.head_copy_grad:
        moments.append(_lm_head_weight_moment(p, base, g_acc, acts_all, copies_all))
    if p.head_chunk_grads:
        moments.append(
            Moment(
                "backward",
                "lm_head_chunks",
                {
                    **base,
                    "gradients": g_acc + p.head_chunk_grads,
                    "weight_copies": copies_all + p.copies_head,
                    "activations": acts_all,
                    "logits": p.head_chunk_logits,
                    **p.extra_backward,
                },
            )
        )
    if p.extra_pending_layer:  # (the head's weight moments too: every layer's backward is still to come)
        for m in moments[2:]:
            if m.where.startswith("lm_head"):
                m.components.update(_pending(whole, runs, m.components))
    moments += _layer_moments(whole, runs, base, g_acc, saved_all, copies_all)
    p = _with(whole, runs[0]) if runs else whole  # (below every layer: the bottom unit's buffers)
    strays_all = sum(r.count * r.stray_grads for r in runs)  # freed with the graph, after backward
    if p.vision_backward:
        moments.append(_vision_moment(p, base))
    if p.vision_forward:
        moments.append(
            Moment(
                "forward",
                "vision_tower",
                {**base, "gradients": g_acc, "activations": p.vision_forward, **p.extra_forward},
            )
        )
    if p.embedding_grad_input:
        moments.append(
            Moment(
                "backward",
                "embedding",
                {
                    **base,
                    "gradients": (p.grads if p.grads_at_embedding is None else p.grads_at_embedding) + strays_all,
                    "activations": p.embedding_grad_input + p.frozen_inputs + p.embedding_saved,
                    "weight_copies": p.frozen_copies,
                    # every layer's backward is over: no unit is prefetched or holds its unsharded gradients,
                    # the bottom unit's reduce-scatter input alone waits (rank 0 of FSDP2 traced: llama-3.2-1b, tied)
                    **(p.extra_backward if p.extra_embedding is None else p.extra_embedding),
                    **p.extra_below_top,
                    **_pending(whole, runs, {}, n_path),
                },
            )
        )
    if p.embedding_backward_workspace:
        moments.append(
            Moment(
                "backward",
                "embedding",
                {
                    **base,
                    "gradients": (p.grads if p.grads_at_embedding is None else p.grads_at_embedding) + strays_all,
                    "activations": p.embedding_backward_workspace,
                    # every layer's backward is over: no unit is prefetched or holds its unsharded gradients,
                    # the bottom unit's reduce-scatter input alone waits (rank 0 of FSDP2 traced: llama-3.2-1b, tied)
                    **(p.extra_backward if p.extra_embedding is None else p.extra_embedding),
                    **p.extra_below_top,
                    **_pending(whole, runs, {}, n_path),
                },
            )
        )
    for k, flush in p.extra_flush:
        if k == -2:  # (the loss head's backward done, its gradients made: every layer's activations, no layer's run)
            comps = {**base, "gradients": g_acc + p.grads_head, "activations": acts_all, **p.extra_backward, **flush}
            moments.append(Moment("backward", "head.flush", _pending(whole, runs, comps)))
        elif k < 0:  # (the end of backward: every gradient made, no layer's activations)
            extras = p.extra_backward if p.extra_embedding is None else p.extra_embedding
            comps = {**base, "gradients": p.grads + strays_all, **extras, **p.extra_below_top, **flush}
            moments.append(Moment("backward", "end_of_backward", comps))
    moments.append(
        Moment(
            "optimizer",
            "step",
            {
                **base,
                "gradients": p.grads if p.grads_at_step is None else p.grads_at_step,
                "optimizer_temporaries": p.optimizer_temporaries,
                **p.extra_optimizer,
            },
        )
    )
    if p.carried_logits:  # (the loss moment counts them as its own logits)
        for m in moments:
            if not (m.phase == "forward" and m.where == "loss"):
                m.components["logits"] = m.components.get("logits", 0) + p.carried_logits
    if p.cuda_workspaces:  # held at every moment of a steady-state step; listed last
        for m in moments:
            m.components["cuda_workspaces"] = p.cuda_workspaces
    return moments


def _with(p: StepParts, r: LayerRun) -> StepParts:
    """``p`` with the buffers it holds while ``r``'s unit is the one they hold (:class:`RunBuffers`)."""
    b = r.buffers
    if b is None:
        return p
    return replace(
        p,
        extra_forward=b.extra_forward,
        extra_backward=b.extra_backward,
        extra_layer_backward=b.extra_layer_backward,
        extra_below_top=b.extra_below_top,
        extra_above_bottom=b.extra_above_bottom,
        extra_layer_grads=b.extra_layer_grads,
        extra_pending_layer=b.extra_pending_layer,
        extra_done_layer=b.extra_done_layer,
    )


def _pending(p: StepParts, runs: tuple[LayerRun, ...], extra: dict[str, int], ended: int = 0) -> dict[str, int]:
    """``extra`` with ``extra_pending_layer`` of each layer whose backward has not ended added to it, and
    ``extra_done_layer`` of each that has: the path's top ``ended`` layers (each run's unit its own)."""
    if not p.extra_pending_layer and not (ended and p.extra_done_layer):
        return extra
    out = dict(extra)
    for r in reversed(runs):  # from the top run down
        done = min(ended, r.count)
        ended -= done
        b = p if r.buffers is None else r.buffers
        if r.count > done:
            for k, v in b.extra_pending_layer.items():
                out[k] = out.get(k, 0) + v * (r.count - done)
        if done:
            for k, v in b.extra_done_layer.items():
                out[k] = out.get(k, 0) + v * done
    return out


#: one GPU's layer moments: no sharded plan's buffers beside them (read only)
_NO_EXTRAS: dict[tuple[bool, bool, bool], dict[str, int]] = {
    (t, g, b): {} for t in (True, False) for g in (True, False) for b in (True, False)
}


def _extras(here: Any, above: Any, below: Any) -> dict[tuple[bool, bool, bool], dict[str, int]]:
    """The sharded plans' buffers beside a layer's backward, merged once: at the top layer (none of the unit above's
    reduce-scatter input yet) or below it, before the layer's first gradient (".experts", ".recompute") or after,
    at the bottom layer (no unit below prefetched) or above it. ``here``: the buffers of the layer's unit (a
    :class:`StepParts` or :class:`RunBuffers`), ``above`` / ``below``: of the units above and below it."""
    if not (
        here.extra_backward
        or here.extra_layer_backward
        or above.extra_below_top
        or here.extra_layer_grads
        or below.extra_above_bottom
    ):
        return _NO_EXTRAS
    return {
        (top, grads, bottom): {
            **here.extra_backward,
            **here.extra_layer_backward,
            **({} if bottom else below.extra_above_bottom),
            **({} if top else above.extra_below_top),
            **(here.extra_layer_grads if grads else {}),
        }
        for top in (True, False)
        for grads in (True, False)
        for bottom in (True, False)
    }


def _layer_moments(
    p: StepParts, runs: tuple[LayerRun, ...], base: dict[str, int], g_acc: int, saved: int, copies: int
) -> list[Moment]:
    """Backward through the layers, from the top run down: the top and the bottom layer of each run.
    ``saved`` and ``copies``: what every layer of the gradient's path saves and copies."""
    out: list[Moment] = []
    extras = _extras(p, p, p)
    grads_above = p.grads_head  # gradients made above the run being walked
    stray_above = 0  # throwaway parameters' gradients made above it (LayerRun.stray_grads)
    layers_above = 0
    down = tuple(reversed(runs))
    # FSDP2: the unit above's reduce-scatter input and the prefetch of the one below are both held from the layer
    # below the top one to the layer above the bottom one, not at the path's ends (rank 0 traced on a fake group:
    # qwen3-30b-a3b cut to 4 layers, full on 8 GPUs, peaks at the third layer from the top: -8.5% at the ends only)
    # NOTE: ZeRO-2's below_top alone steps too (its layer below the top is not walked: ZeRO not traced here)
    steps = bool(p.extra_below_top and p.extra_above_bottom)
    per_run = any(r.buffers is not None for r in runs)  # (a sharded plan's units that differ by run)
    last = len(down) - 1
    for i, r in enumerate(down):
        saved -= r.count * r.saved  # now what the runs below this one save
        copies -= r.count * r.copies
        ends = _ends(r.count, i == 0, i == last, steps) if steps else (0, r.count - 1)
        walked: list[tuple[int, dict[str, int] | None]] = [(k, None) for k in ends]
        if p.extra_flush:  # DeepSpeed's bucket reduces at their layers (StepParts.extra_flush), beside the walked ones
            walked += [(k - layers_above, f) for k, f in p.extra_flush if layers_above <= k < layers_above + r.count]
        for from_top, flush in walked:
            remaining = r.count - from_top
            # (a path of one layer is its top and its bottom: _where names it the top)
            top, bottom = not (i or from_top), i == last and from_top == r.count - 1
            where = _where(top, bottom, layers_above + from_top)
            before = grads_above + r.grads * from_top  # the gradients of the layers above this one
            acts = saved + remaining * r.saved + r.recompute + p.rotary + p.frozen_inputs + p.embedding_saved
            acts += p.vision_saved
            weight_copies = copies + r.copies * remaining + r.copies_recompute
            # the layer's MLP backward: all it saved is alive; its MLP gradients are made (taken whole,
            # though autograd frees some saved tensors as it goes). Its attention's gradients come later:
            # gradients are set to None at each step (Trainer: zero_grad(set_to_none=True)).
            # Then attention's backward: the MLP's saved tensors are gone (autograd releases a node's saved
            # tensors once it has run: torch/csrc/autograd/engine.cpp), the MLP's gradients stay.
            stray = stray_above + r.stray_grads * from_top
            moments_of_layer = [
                (
                    "",
                    before + r.grads_mlp,
                    acts - r.experts_freed + max(r.workspace, r.accum_grad_mlp),
                    stray + r.stray_grads_mlp,
                )
            ]
            if r.dispatch_workspace:  # the routed experts' first backward nodes, before any MLP gradient
                moments_of_layer.insert(0, (".experts", before, acts + r.dispatch_workspace, stray))
            if r.fp8_workspace:  # torchao's fp8 casts in the MLP's output projection, before its weight's gradient
                moments_of_layer.insert(0, (".fp8", before, acts + r.fp8_workspace, stray))
            if r.recompute_transient:
                # the recomputed forward's end, before this layer's first gradient: all it saves is back, and
                # its last adapted module's transient (cabe.activations.adapters.note_lora_input)
                moments_of_layer.insert(0, (".recompute", before, acts + r.recompute_transient, stray))
            if per_run:  # this layer's unit; the unit above's reduce-scatter input, the one below's prefetch
                here = r.buffers or p
                above = here if from_top or not i else (down[i - 1].buffers or p)
                below = here if from_top < r.count - 1 or bottom else (down[i + 1].buffers or p)
                extras = _extras(here, above, below)
            if flush is not None:  # (the flush at the layer's first gradient, all it saved alive: a bound)
                moments_of_layer = [(".flush", before + r.grads_mlp, acts, stray + r.stray_grads_mlp)]
            for suffix, grads, activations, strays in (
                *moments_of_layer,
                *(
                    ()
                    if flush is not None
                    else (
                        (
                            ".attention",
                            before + r.grads,
                            acts - r.mlp_saved + max(r.attention_workspace, r.accum_grad_attention),
                            stray + r.stray_grads,
                        ),
                    )
                ),
            ):
                out.append(
                    Moment(
                        "backward",
                        where + suffix,
                        {
                            **base,
                            "gradients": (g_acc or grads) + p.tied_grad_pending + strays,
                            "weight_copies": weight_copies,
                            "activations": activations,
                            # (with what this layer and those below it still hold)
                            **_pending(
                                p,
                                runs,
                                extras[top, suffix not in (".experts", ".fp8", ".recompute"), bottom],
                                layers_above + from_top,
                            ),
                            **(flush or {}),
                        },
                    )
                )
        grads_above += r.grads * r.count
        stray_above += r.stray_grads * r.count
        layers_above += r.count
    return out


def _vision_moment(p: StepParts, base: dict[str, int]) -> Moment:
    """The vision tower's largest backward moment (after the bottom decoder layer's): every decoder gradient made,
    the tower's own being made, what the tower still saves."""
    return Moment(
        "backward",
        "vision_tower",
        {
            **base,
            "gradients": p.grads - p.vision_grads + p.vision_backward_grads,
            "activations": p.vision_backward + p.frozen_inputs + p.embedding_saved,
            "weight_copies": p.frozen_copies,
            **p.extra_backward,
            **p.extra_layer_backward,
            **p.extra_below_top,
            **p.extra_layer_grads,
        },
    )


def _ends(count: int, top: bool, bottom: bool, steps: bool) -> tuple[int, ...]:
    """The layers of a run (from its top) whose moments bound it: its two ends, between which live memory is linear
    in the layer; and, with buffers that step at the path's ends (``steps``), the layers next to those ends."""
    if not steps or count < 3 or not (top or bottom):
        return (0, count - 1)
    return tuple(sorted({0, *((1,) if top else ()), *((count - 2,) if bottom else ()), count - 1}))


def _where(top: bool, bottom: bool, from_top: int) -> str:
    """``top_layer`` and ``bottom_layer`` at the ends of the gradient's path; ``layer_<n>_from_top`` at the
    ends of the runs between them."""
    if top:
        return "top_layer"
    if bottom:
        return "bottom_layer"
    return f"layer_{from_top}_from_top"


def _lm_head_weight_moment(p: StepParts, base: dict[str, int], g_acc: int, acts_all: int, copies_all: int) -> Moment:
    """The lm_head's weight gradient under autocast: the 16-bit gradient of its copy and the cast to the
    weight's dtype coexist (the logits' gradient and the copy saved for the matmul are released by then)."""
    return Moment(
        "backward",
        "lm_head",
        {
            **base,
            "gradients": g_acc + p.head_weight_grad + p.head_copy_grad,
            "weight_copies": copies_all,
            "activations": acts_all,
            **p.extra_backward,
        },
    )


def layerwise(p: StepParts, gradient: int, temporaries: int, layer_gradient: int, layer_temporaries: int) -> StepParts:
    """The parts of a step whose optimizer runs inside backward, one parameter at a time (the HF Trainer's
    ``*_layerwise`` optimizers: transformers trainer_optimizer.py:164-176, ``register_post_accumulate_grad_hook``
    that calls ``step()`` then ``zero_grad()``, set_to_none). A gradient is freed as soon as it is stepped: in
    backward one gradient and its step's temporaries live, never all of them — in the layers the largest layer
    gradient and its temporaries; the optimizer moment becomes the largest parameter's step (the embedding's,
    the last, when it is the largest), with the activations gone. The head moment is given the layers'
    temporaries too (a bound: the lm_head steps there)."""
    runs = tuple(replace(r, grads=0, grads_mlp=0) for r in p.runs)
    return replace(
        p,
        grads=gradient,
        grads_head=layer_gradient,
        grads_per_layer=0,
        runs=runs,
        optimizer_temporaries=temporaries,
        extra_backward={**p.extra_backward, "optimizer_temporaries": layer_temporaries},
    )
