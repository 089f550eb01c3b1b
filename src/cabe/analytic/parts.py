"""The step's parts (:func:`_step_parts`): what each moment of the training step holds — forward, the head's
backward (logit gradients, chunked or tied heads), every layer's backward with checkpointing's recompute, the
optimizer step — as :class:`cabe.step.StepParts` for :func:`cabe.step.timeline` to walk; the frozen inputs' casts,
offloaded leaves and recompute transients. Proved by tests/test_estimate.py and the trace tests under tests/trace/."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cabe import memo
from cabe.activations import (
    HeadActivations,
    LayerActivations,
    embedding_lora_saved,
    loss_chunk_positions,
)
from cabe.analytic.runs import _Activations, _run_activations, _RunActivations
from cabe.analytic.states import _Copies, _grads_of, _States, _weight_copies
from cabe.architecture import ModelSpec
from cabe.frozen import evolve
from cabe.layers import LayerGroup
from cabe.optimizer import get as optimizer_entry
from cabe.parameters import layer_tensors
from cabe.precision import Dtypes, dtypes_for
from cabe.step import LayerRun, StepParts
from cabe.training import TrainingSetup
from cabe.units import CUDA_WORKSPACES, round_alloc


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
    return _grads_of(states, "embedding" if spec.tie_word_embeddings else "lm_head")


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
    sizes = loss_chunk_positions(setup)
    n = len(sizes)
    if n < 2:
        return 0, 0
    grad = _head_weight_grad_bytes(spec, states)
    if not grad or (copies.head and not dt.cached_copies):
        return 0, 0
    if copies.head:  # the one cached 16-bit copy's gradient
        grad = round_alloc(dt.compute * spec.vocab_size * spec.hidden_size)
    waiting = sum(sizes[: n - 2])  # positions of chunks 0 .. n−3
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
    grads_head = _grads_of(states, "head")
    grads_layer = states.grads - grads_head - _grads_of(states, "embedding_prompt")
    grads_layer -= _grads_of(states, "vision")  # the tower's (images)
    # per kind of layer (and checkpointed or not): runs of one kind share their per-layer figures (one object), the
    # gradient path's lowest layer has its own when its input requires no grad (see _input_needs_no_grad)
    kinds: dict[tuple[Any, ...], LayerRun] = {}
    for r, _, ck in act.pieces():
        if (id(r.per_layer), ck) not in kinds:
            kinds[(id(r.per_layer), ck)] = _layer_run(spec, setup, dt, states, act, r, ck)
    ckpt_cached = setup.checkpointing and copies.trained_layers
    # under selective checkpointing, runs of checkpointed and of plain layers alternate
    runs = tuple(_counted(kinds[(id(r.per_layer), ck)], n, n if ckpt_cached and ck else 0) for r, n, ck in act.pieces())

    def mean(of: Callable[[LayerRun], int]) -> int:  # a per-layer figure (exact when the layers are alike)
        total = 0
        for r in runs:
            total += r.count * of(r)
        return total // grad_layers if runs else 0

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
        fp8_workspace_layer=max((r.per_layer.fp8_backward_bytes for r in act.runs), default=0),
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
        embedding_backward_workspace=_tied_embedding_workspace(spec, setup, states),
        runs=runs,
        grads_mlp_layer=mean(lambda r: r.grads_mlp),
        mlp_saved_layer=mean(lambda r: r.mlp_saved),
        **(_tp_parts(act, head, ckpt) if setup.tp > 1 else {}),
        attention_workspace_layer=mean(lambda r: r.attention_workspace),
        cuda_workspaces=CUDA_WORKSPACES,
        carried_logits=tokens * head.carried,
        embedding_saved=tokens * embedding_lora_saved(spec, setup, dt),
        embedding_grad_input=(
            tokens * dt.residual * spec.residual_width + _tp_embedding_grad(spec, setup, states, dt)
            if not spec.tie_word_embeddings and _grads_of(states, "embedding")
            else 0
        ),
    )


def _tp_parts(act: _Activations, head: HeadActivations, ckpt: bool) -> dict[str, Any]:
    """The StepParts fields only tensor parallelism reads (what stays whole on every GPU of a TP group:
    cabe.parallel.activations ``tensor_parallel_saved`` / ``sequence_parallel``); on one GPU they stay 0 (an estimate
    pays for them only where they are used)."""
    tokens, grad_layers = act.tokens, act.grad_layers
    return dict(
        # (the layers left out of checkpointing keep theirs through the forward; a recomputed layer makes its own)
        gathered_layer=sum(n * tokens * r.per_layer.gathered_input_per_token for r, n, ck in act.pieces() if not ck)
        // max(grad_layers, 1),
        gathered_recompute_layer=act.mean(lambda r: tokens * r.per_layer.gathered_input_per_token) if ckpt else 0,
        mlp_gathered_layer=act.mean(lambda r: tokens * r.per_layer.mlp_gathered_per_token),
        final_norm_gathered=tokens * head.gathered_input,
        stream_layer=sum(n * _stream_kept(act, r, ck) for r, n, ck in act.pieces()) // max(grad_layers, 1),
        stream_recompute_layer=act.mean(
            lambda r: (
                tokens * (r.per_layer.stream_per_token - r.per_layer.input_alias_per_token) + r.per_layer.constant_bytes
            )
        )
        if ckpt
        else 0,
        mlp_stream_layer=act.mean(lambda r: tokens * r.per_layer.mlp_stream_per_token),
    )


def _tp_run(act: _Activations, r: _RunActivations, ckpt: bool) -> dict[str, Any]:
    """A run's LayerRun fields only tensor parallelism reads (as :func:`_tp_parts`' per layer)."""
    tokens = act.tokens
    return dict(
        # (a layer left out of checkpointing keeps its all-gathered inputs through the forward; a recomputed one
        # makes its own again: StepParts.gathered_layer, gathered_recompute_layer)
        gathered=0 if ckpt else tokens * r.per_layer.gathered_input_per_token,
        gathered_recompute=tokens * r.per_layer.gathered_input_per_token if ckpt else 0,
        mlp_gathered=tokens * r.per_layer.mlp_gathered_per_token,
        stream=_stream_kept(act, r, ckpt),
        stream_recompute=(
            tokens * (r.per_layer.stream_per_token - r.per_layer.input_alias_per_token) + r.per_layer.constant_bytes
            if ckpt
            else 0
        ),
        mlp_stream=tokens * r.per_layer.mlp_stream_per_token,
    )


def _stream_kept(act: _Activations, r: _RunActivations, ckpt: bool) -> int:
    """Of what one layer keeps through the forward (``act.kept``), the residual stream's tensors: a checkpointed
    layer's input, or a plain layer's stream terms (LayerActivations.stream_per_token) and constants (Gemma's fp32
    ``1 + w``, flash attention's seed: per GPU whole)."""
    if ckpt:
        return act.kept(r, ckpt)
    return act.tokens * r.per_layer.stream_per_token + r.per_layer.constant_bytes


def _counted(run: LayerRun, count: int, cached_count: int) -> LayerRun:
    """``replace(run, count=..., cached_count=...)``, without the copy when nothing changes (the common case)."""
    if run.count == count and run.cached_count == cached_count:
        return run
    return evolve(run, count=count, cached_count=cached_count)


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
            r.per_layer.fp8_forward_bytes,  # torchao's casts of the MLP's output projection (activations.compose)
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
    if not act.first:  # every layer is in the gradient's path
        return 0
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
    if not act.first:  # every layer is in the gradient's path
        return 0
    plain = sum(1 for i in range(act.first) if not act.checkpointed(i))
    return plain * _weight_copies(spec, setup, _frozen_dtypes(setup, dt), spec.runs[0]).layer if plain else 0


def _offload_leaf(spec: ModelSpec, dt: Dtypes, states: _States, act: _Activations) -> int:
    """Offloading with frozen embeddings: their output stays on the device though layer 0's saved copy is on
    the host. ``enable_input_require_grads`` makes it a leaf that requires grad (transformers 5.24
    modeling_utils.py:2153-2154, ``make_inputs_require_grads``: ``output.requires_grad_(True)``), and the leaf's
    ``AccumulateGrad`` node holds it until backward reaches it (torch/csrc/autograd/functions/accumulate_grad.h,
    ``variable``). (Under checkpointing without offloading it is layer 0's saved input, counted there.)"""
    if not act.offload or _grads_of(states, "embedding"):
        return 0
    return act.tokens * dt.residual * spec.residual_width


def _layer_run(
    spec: ModelSpec,
    setup: TrainingSetup,
    dt: Dtypes,
    states: _States,
    act: _Activations,
    r: _RunActivations,
    ckpt: bool,
) -> LayerRun:
    """One run of like layers in the gradient's path: its per-layer gradients, copies and saved tensors
    (``ckpt``: the layers are checkpointed)."""
    c = _weight_copies(spec, setup, dt, r.group)
    grads, grads_mlp, largest_mlp, largest_attention = _run_grads(spec, setup, states, r.group)
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
        grads_mlp=grads_mlp,
        mlp_saved=tokens * r.per_layer.mlp_saved_per_token,
        attention_workspace=tokens * r.per_layer.attention_workspace_per_token,
        stray_grads=r.per_layer.stray_grad_bytes,
        stray_grads_mlp=r.per_layer.stray_grad_mlp_bytes,
        accum_grad_mlp=largest_mlp if accum else 0,
        accum_grad_attention=largest_attention if accum else 0,
        dispatch_workspace=tokens * r.per_layer.dispatch_workspace_per_token,
        fp8_workspace=r.per_layer.fp8_backward_bytes,  # torchao's casts (activations.compose _fp8_moments)
        experts_freed=tokens * r.per_layer.experts_freed_per_token,
        checkpointed=ckpt,
        **(_tp_run(act, r, ckpt) if setup.tp > 1 else {}),
        group=r.group,
    )


def _run_grads(spec: ModelSpec, setup: TrainingSetup, states: _States, group: LayerGroup) -> tuple[int, int, int, int]:
    """One layer of ``group``'s gradients: (all of them, the MLP block's, the largest single one of the MLP block, of
    attention). Independent of the batch and the sequence: once per states and request less its shape (the group by
    identity, kept alive by the entry)."""
    key = ("run_grads", memo.request_key(setup), id(group))
    hit = states.memo.get(key)
    if hit is None:
        hit = states.memo[key] = (group, _compute_run_grads(spec, setup, states, group))
    return hit[1]


def _compute_run_grads(
    spec: ModelSpec, setup: TrainingSetup, states: _States, group: LayerGroup
) -> tuple[int, int, int, int]:
    trained = setup.method in ("full", "freeze")
    per_role: dict[str, int] = {}
    largest: dict[bool, int] = {}  # the largest single gradient of the MLP block (True) and of attention (False)
    for t in layer_tensors(spec, setup, group, trained):
        if t.trainable:
            per_role[t.role] = per_role.get(t.role, 0) + round_alloc(t.numel * states.bytes_of[t.kind]) * t.count
            # a fused expert stack is one 3-D parameter (its count is the experts): one gradient of all of them
            one = round_alloc(t.numel * (t.count if t.role == "expert" else 1) * states.bytes_of[t.kind])
            mlp = t.role in ("mlp", "router", "expert")
            largest[mlp] = max(largest.get(mlp, 0), one)
    grads = sum(per_role.values())
    # the MLP block's gradients: its linears' (router and experts included), not the norms'
    grads_mlp = sum(b for role, b in per_role.items() if role in ("mlp", "router", "expert"))
    return grads, grads_mlp, largest.get(True, 0), largest.get(False, 0)


def _recompute_transient(per_layer: LayerActivations, tokens: int) -> int:
    """A checkpointed layer's largest transient while it is recomputed: PEFT's casts of an adapted module's input
    (at the end of the recompute, all the layer saves is back), DeepSeek-V3.2's indexer or a DoRA module's output
    arithmetic (inside it: less what the layer saves after it), beside the gradient of the layer's output that waits
    for it (``LayerActivations.output_grad_per_token``); torchao's fp8 casts of the MLP's output projection, run again
    (its last GEMM: all the layer saves is back)."""
    per_token = max(per_layer.lora_forward_transient_per_token, per_layer.indexer_moment_per_token)
    moment = max(tokens * per_token, per_layer.dora_result_bytes, per_layer.fp8_forward_bytes)
    return moment + tokens * per_layer.output_grad_per_token


def _temporaries_key(setup: TrainingSetup) -> str:
    """The catalog key of the optimizer step's temporaries: GaLore's own, else the implementation's."""
    return "low_rank" if optimizer_entry(setup.optimizer).low_rank else setup.resolved_optimizer_impl


def _tp_embedding_grad(spec: ModelSpec, setup: TrainingSetup, states: Any, dt: Dtypes) -> int:
    """Tensor parallelism's vocabulary-sharded embedding, trained: DTensor has no backward that keeps its gradient
    sharded over the vocabulary (torch 2.13 distributed/tensor/_ops/_embedding_ops.py
    ``embedding_dense_backward_strategy``: Shard(1), or Partial), so each GPU makes the whole vocabulary's gradient
    as a partial sum before the reduce-scatter to its shard: one whole embedding-sized gradient at the embedding's
    backward (Megatron's VocabParallelEmbedding masks its input and makes only its own rows); its redistribution to
    the TP shard (``Partial`` to ``Shard(0)``: a reduce-scatter over the TP group into a new shard-sized tensor) is
    beside it (rank 0 traced on a fake group: llama-3.1-8b full, FSDP2 over TP 4, the whole bf16 gradient and a
    quarter of it at the embedding's backward, -4.6% without the quarter)."""
    if setup.tp == 1 or setup.shard == "none":
        # (TP alone: that whole gradient is the ``.grad`` itself, counted with the gradients: parallel.strategy)
        return 0
    # (in the gathered dtype under the engine's param_dtype: the unit's parameters are that dtype in its backward;
    # traced: llama-3.1-8b fp32 weights, param_dtype bf16, FSDP2 over TP 2: a bf16 whole gradient and a bf16 half)
    b = dt.gathered or states.bytes_of["embedding"]
    return round_alloc(spec.embedding_count * b) + round_alloc(-(-spec.embedding_count // setup.tp) * b)


def _tied_embedding_workspace(spec: ModelSpec, setup: TrainingSetup, states: Any) -> int:
    """The tied embedding's backward (full fine-tuning): the lm_head's gradient and the embedding's, and with
    micro-batches the previous .grad beside their sum (see the NOTE above). Under tensor parallelism the lm_head's
    is its vocabulary shard and the embedding's whole (:func:`_tp_embedding_grad`), their sum a shard again; under
    FSDP2 the unsharded parameter's .grad is None at every backward (its post-backward reduce-scatters and drops it,
    torch 2.13 _fsdp_param_group.py ``post_backward``), so the sum is a shard beside the two whatever the
    micro-batches (the plan puts them in the gathered dtype: cabe.parallel.plan). Traced: gemma-3-4b full, fp32
    weights, FSDP2 over TP 2 with bf16 ``param_dtype``, 4 micro-batches: the embedding's whole bf16 gradient and two
    vocabulary shards (the lm_head's, the sum) at its backward."""
    if not (setup.method == "full" and spec.tie_word_embeddings):
        return 0
    one = round_alloc(spec.embedding_count * states.bytes_of["embedding"])
    if setup.tp == 1:
        return (3 if setup.grad_accum > 1 else 2) * one
    shard = round_alloc(-(-spec.embedding_count // setup.tp) * states.bytes_of["embedding"])
    return one + (2 if setup.grad_accum > 1 or setup.shard in ("fsdp", "fsdp-hybrid") else 1) * shard
