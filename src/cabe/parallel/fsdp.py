"""PyTorch FSDP (FSDP2 ``fully_shard``; FSDP1 ``FULL_SHARD`` / ``HYBRID_SHARD`` alike up to its flat
parameter's padding): parameters, gradients and optimizer state sharded over the group; one wrapped unit
(a decoder layer) gathered while it runs (two with backward prefetch), the root unit (embeddings, final
norm, lm_head) kept gathered; ``CPUOffload(offload_params=True)`` moves parameters and gradients to the
host and steps the optimizer there.

Tensor by tensor (torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_param.py``): each parameter is
``torch.chunk``-ed on dim 0 and every rank's shard padded to the first chunk (line 304), so a rank holds
``ceil(dim0 / N)`` rows of each parameter, its gradient and (the optimizer seeing the sharded DTensor's
local shard) its optimizer state. With ``MixedPrecisionPolicy(param_dtype=bf16)`` (lines 587-599) the
all-gather output and the unsharded gradient are ``param_dtype`` while the sharded parameter, its
gradient (``reduce_dtype`` defaults to ``param_dtype``; the reduce-scattered result is cast back to
``orig_dtype``) and the optimizer state keep the stored dtype.
"""

from __future__ import annotations

from cabe.parallel.shares import (
    NON_LAYER,
    dense_bytes,
    fsdp_shard,
    optimizer_bytes,
    own_groups,
    pieces,
    quantized_held_bytes,
    sharded,
)
from cabe.parallel.strategy import Context, States
from cabe.units import round_alloc


def states(c: Context) -> States:
    mine, g = c.mine, c.group
    # the parameters as the all-gather makes them: MixedPrecision's param_dtype, else as stored (fp32 weights under
    # autocast are gathered in fp32, then autocast casts them per op: its copies are the single-GPU ones, saved for
    # backward, and cached to the end of forward where they are fp32 leaves that require grad; rank 0 traced on a fake
    # group: llama-3.2-1b full fp16-amp with checkpointing on 16 GPUs held every layer's 16-bit copy at forward's end,
    # -34% without them)
    unit_b = c.dt.gathered or c.dt.weight
    layer_gathered = mine.layer_elements * unit_b + mine.layer_quantized
    root_gathered = mine.root_elements * unit_b
    units = 2 if c.cfg.fsdp_prefetch else 1
    trainable = own_groups(mine.held, fsdp_shard, trainable=True)  # (experts over their own group under EP)
    optimizer, temporaries = optimizer_bytes(trainable, c.setup)
    out = States(
        weights=dense_bytes(own_groups(mine.held, fsdp_shard)) + quantized_held_bytes(mine.held, c.setup, g),
        grads=dense_bytes(trainable),
        optimizer=optimizer,
        temporaries=temporaries,
    )
    # the root unit stays gathered from its pre-forward to the end of backward (FSDP2 does not reshard the root
    # after forward); one layer unit gathered while it runs, and the loss head's backward already holds the top
    # unit (the last in forward, not resharded: the first needed in backward); while a unit runs backward the next
    # is prefetched beside it (FSDP2's implicit backward prefetch, _fsdp_state.py / _fsdp_param_group.py). The
    # trace of rank 0 (cabe.trace.distributed: a 4-layer llama on 4 GPUs) holds root + one unit at the loss's
    # backward, where two units were counted (+4% to +30% on tiny models)
    kept = not c.setup.reshard_after_forward
    # expert parallelism: transformers wraps each experts module as its own unit (distributed/fsdp.py
    # ``apply_fully_sharded_data_parallelism``, ``reshard_after_forward=True``), gathered in its own pre-forward
    # and pre-backward only: not beside the loss head (rank 0 traced, qwen3-30b-a3b-4l on 8 GPUs: the same peak at
    # the head for ep 2, 4 and 8, 1.1 GiB under ep 1's, whose top layer unit holds all 128 experts there)
    experts = mine.layer_expert_elements * unit_b if c.layout.ep > 1 else 0.0
    carved = _carved(c, unit_b) if c.setup.fsdp_wrap == "accelerate" else None
    if carved is not None:
        _accelerate_units(c, out, carved, layer_gathered - experts, kept)
    elif kept:
        # reshard_after_forward=False: a unit's post-forward keeps what its pre-forward gathered (torch 2.13
        # _fsdp_param_group.py:499-503, ``reshard`` returns at once in FORWARD when ``_reshard_after_forward`` is
        # False, i.e. ``post_forward_mesh_info`` is None: _fsdp_init.py:183-185), its pre-backward finds the
        # parameters gathered (``unshard`` is a no-op, as is the prefetch of the unit below) and its post-backward
        # frees them (``reshard`` outside FORWARD: ``_to_sharded``). Every layer unit is held from its forward on,
        # until its own backward ends: at the end of forward all of them, at a layer's backward those at or below it
        # (step.StepParts.extra_pending_layer); a frozen unit outside the gradient's path has no backward and waits
        # for the root's final callback (_fsdp_state.py:411-415), held to the end of backward (parallel.plan)
        out.pending_layer["kept_gathered_params"] = layer_gathered
        out.buffers["forward"]["gathered_params"] = root_gathered
        out.buffers["backward"]["gathered_params"] = root_gathered
    else:
        out.buffers["forward"]["gathered_params"] = layer_gathered - experts + root_gathered
        out.buffers["backward"]["gathered_params"] = layer_gathered - experts + root_gathered
    if experts and not kept:
        out.layer_backward["gathered_experts"] = experts
        out.experts_gathered = experts
    _forward_start(c, out, carved, root_gathered, layer_gathered - experts, kept)
    if carved is None:
        out.embedding_backward = {"gathered_params": root_gathered}  # (the root alone: every unit's backward is over)
    # the head's gradients are the unsharded parameter's, made whole by autograd (in the gathered dtype) and
    # reduce-scattered only in the root unit's post-backward: the tied lm_head's gradient pending beside the
    # embedding's, the chunked loss's summed weight gradients (rank 0 traced on a fake group: gpt2-medium full on 64
    # GPUs, tied, -9.8% with them shared out)
    out.whole_head_grads = unit_b / c.dt.grad
    # FSDP2 reduce-scatters the root unit's gradients in its post-backward, after the embedding's backward: the untied
    # lm_head's unsharded gradient, made at the head's backward, lives through every layer's (rank 0 traced on a fake
    # group: llama-3.1-8b full on 16 GPUs with checkpointing, -12% without it; a tied one is the pending gradient)
    head_grad = sum(
        round_alloc(h.tensor.numel * unit_b) * h.count for h in mine.held if h.trainable and h.tensor.kind == "lm_head"
    )
    if head_grad and (carved is None or mine.tied):  # (untied, accelerate's tail reduce-scatters it before the layers)
        out.layer_backward["root_unsharded_grads"] = head_grad
        out.embedding_backward = {**(out.embedding_backward or {}), "root_unsharded_grads": head_grad}
    if c.setup.grad_accum == 1 and not c.offload_parameters:
        # the root unit's sharded gradients are made by its post-backward's reduce-scatter, after the embedding's
        # backward (the last of the root's), and the step before set every .grad to None: at the embedding's backward
        # only the layers' shards exist (with micro-batches the previous one's stay). Rank 0 traced on a fake group:
        # gemma-2-2b full, tied, FSDP2 on 4 GPUs over TP 2 and alone: +8.2% and +7.3% with the embedding's shard
        # (under accelerate's untied cut the tail's post-backward came before the layers': its shards exist; the
        # embedding's unit's, after its backward, do not)
        done = ("final_norm", "lm_head") if carved is not None and not mine.tied else ()
        root = [h for h in mine.held if h.tensor.name in NON_LAYER and h.tensor.name not in done]
        out.embedding_grads = out.grads - dense_bytes(sharded(pieces(root, trainable=True), fsdp_shard, g))
    if units > 1 and not kept:
        # (not at the bottom unit: the next one in backward is the root, gathered all along -- under accelerate's
        # untied cut the embedding's unit, _accelerate_units --; traced: llama-3.1-8b on 16 GPUs holds one layer unit
        # at its bottom layer's backward)
        out.above_bottom["prefetched_params"] = (units - 1) * layer_gathered
    layer_grad = mine.layer_trainable_elements * unit_b
    if c.layout.ep > 1:
        # expert parallelism: the experts unit's unsharded gradients are reduce-scattered in its own post-backward,
        # before the rest of its layer's backward (transformers' separate unit, above): not the layer unit's
        layer_grad -= min(mine.layer_trainable_elements, mine.layer_expert_elements) * unit_b
    if layer_grad:
        # (from the top unit's backward on: the loss head's backward, in the root unit, precedes them)
        out.layer_grads["unsharded_grads"] = layer_grad
        # the previous unit's reduce-scatter input (its gradients flattened, in reduce_dtype, which defaults
        # to param_dtype) stays alive until the next unit's post-backward reclaims it:
        # reduce_scatter_max_input_buffers = 1 (torch 2.13 _fsdp_param_group.py:107-112, 640-657)
        # (none at the top unit: no unit above it has run its backward yet)
        out.below_top["reduce_scatter_input"] = layer_grad
        # (the buffer is the .grad itself when the reduce-scattered shard becomes it: one micro-batch, reduced in the
        # gradient's own dtype (_fsdp_collectives.py:754, ``sharded_param.grad = ...``); a separate one when it is
        # cast to orig_dtype or added into the .grad a previous micro-batch made, 749)
        separate = c.setup.grad_accum > 1 or unit_b != c.dt.grad
        if c.layout.strategy == "fsdp-hybrid" and separate:
            # HSDP: each unit's reduce-scattered shard is all-reduced across the replicas and the unit keeps that
            # buffer until the root's final callback ends backward (torch 2.13 _fsdp_param_group.py:140-147
            # ``AllReduceState``: "Holding all_reduce_input ... keeps the caching allocator from reusing the block
            # across layers", set at 753-760, cleared in ``finalize_backward``, 768): one shard per unit whose
            # backward has ended (rank 0 traced on a fake group: llama-3.1-8b full, HSDP 2 × 4, -13% without them).
            # Any 2-D mesh is HSDP to FSDP2, one replica too (``HSDPMeshInfo``: _fsdp_param_group.py ``_is_hsdp``,
            # the all-reduce on its replicate group of one; traced: qwen2.5-7b, HSDP (1, 1) over TP 2, -26% without)
            out.done_layer["hsdp_all_reduce_input"] = round_alloc(-(-mine.layer_trainable_elements // g) * unit_b)
    if c.dt.gathered:
        out.notes.append("fsdp_param_dtype_" + c.setup.param_dtype)
    if c.offload_parameters:
        # FSDP2's CPUOffloadPolicy: the sharded parameters and gradients on the host (torch 2.13 _fsdp_param.py:312-315,
        # _fsdp_collectives.py:711-742), so the optimizer's state and its step's temporaries are made there too (the
        # host's peak is the step's: rank 0 traced on a fake group with the host counted apart, cabe.trace.distributed)
        out.host += out.weights + out.grads + out.optimizer + out.temporaries
        out.weights = out.grads = out.optimizer = out.temporaries = 0.0
        out.notes.append("fsdp_cpu_offload")
    if c.layout.strategy == "fsdp-hybrid":
        out.notes.append("hybrid_replicates_across_nodes")
    return out


def _carved(c: Context, unit_b: float) -> tuple[float, float, float]:
    """accelerate's units outside the decoder layers, gathered (bytes): the input embedding, [final norm, lm_head],
    and what the root keeps (position embeddings, a prompt encoder's)."""
    embed = tail = rest = 0.0
    for h in c.mine.held:
        t = h.tensor
        if t.name not in NON_LAYER:
            continue
        b = t.numel * h.count * unit_b
        if t.name == "embed_tokens":
            embed += b
        elif t.name in ("final_norm", "lm_head"):
            tail += b
        else:
            rest += b
    return embed, tail, rest


def _tail_trainable(c: Context) -> float:
    """The trainable elements of [final norm, lm_head]."""
    return sum(
        h.tensor.numel * h.count for h in c.mine.held if h.trainable and h.tensor.name in ("final_norm", "lm_head")
    )


def _accelerate_units(c: Context, out: States, carved: tuple[float, float, float], layer: float, kept: bool) -> None:
    """The gathered parameters under accelerate's cut (accelerate 1.16 utils/fsdp_utils.py:876-899; traced by
    cabe.trace.fsdp_wrap): the untied input embedding its own unit, resharded after its forward as the layers are;
    [final norm, lm_head] -- with the embedding when tied -- one unit with reshard_after_forward=False, gathered from
    its first forward to its post-backward (untied: once the final norm's backward is done, before the top layer's;
    tied: at the end of backward); the root what is left.

    FSDP2 frees a unit's all-gather output (the flat buffer its parameters are copied out of) at the next unit's
    copy-out in forward, the last one in the root's post-forward (torch 2.13 _fsdp_param_group.py:478-489,
    _fsdp_state.py:333-342), which follows the loss transformers computes inside the model's forward: at the loss the
    untied tail's buffer is alive beside its parameters, the tied case's is the top layer's (the tail was gathered at
    the embedding). In backward the tail's pre-backward prefetches nothing (the unit before it in FSDP2's
    post-forward order is the tail itself: norm and lm_head both ran in it), so the head's backward holds no layer."""
    embed, tail, rest = carved
    tied = c.mine.tied
    if tied:
        tail, embed = tail + embed, 0.0
    always = rest + (tail if tied else 0.0) + (embed if kept else 0.0)
    out.buffers["forward"]["gathered_params"] = always + (layer if tied else 2 * tail)
    out.buffers["backward"]["gathered_params"] = always + (0.0 if tied else tail)
    # a layer's backward: the tail resharded (untied), the layer gathered (kept: every pending one, plan's pending)
    out.layer_backward["gathered_params"] = always + (0.0 if kept else layer)
    if kept:
        out.pending_layer["kept_gathered_params"] = layer
    elif embed:
        # the embedding's unit comes after the bottom layer's in backward: prefetched beside it (FSDP2's implicit
        # backward prefetch follows the reverse forward order); above the bottom, the next layer (above_bottom)
        out.layer_backward["prefetched_params"] = embed
    tail_grad = _tail_trainable(c) * (c.dt.gathered or c.dt.weight)
    if tail_grad and not tied:
        # the tail's reduce-scatter input (its gradients flattened, in reduce_dtype) kept until the top unit's
        # post-backward reclaims it (reduce_scatter_max_input_buffers = 1, torch 2.13 _fsdp_param_group.py:107-112);
        # below the top, the previous layer's (below_top)
        out.layer_backward["reduce_scatter_input"] = tail_grad
    out.embedding_backward = {"gathered_params": rest + (tail if tied else embed)}


def _forward_start(
    c: Context, out: States, carved: tuple[float, float, float] | None, root: float, layer: float, kept: bool
) -> None:
    """The forward's start: the first layer's unit all-gathered and copied out while the unit before it is still held.

    In forward FSDP2 frees a unit's all-gather output only at the next unit's copy-out, and later than it reads:
    ``wait_for_unshard`` takes the previous result into a local (``prev_all_gather_state``, torch 2.13
    _fsdp_param_group.py:430-432) that lives to the end of the call, through this unit's copy-out (lines 461-466). So
    at the first layer's copy-out: the unit before it gathered (the root, or under accelerate's cut the tied tail; the
    untied embedding's unit is resharded by its post-forward unless kept) with its all-gather output, and the layer's
    all-gather output beside its parameters (rank 0 traced on a fake group: qwen2.5-0.5b prompt tuning on HSDP 2 × 2,
    the tied tail twice and a layer twice, -6.7% without this moment)."""
    if carved is None:
        before = 2 * root
    else:
        embed, tail, rest = carved
        if c.mine.tied:
            before = 2 * (tail + embed) + rest
        else:
            before = embed * (2 if kept else 1) + rest
    out.forward_start["gathered_params"] = before + 2 * layer
