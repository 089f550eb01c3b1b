"""DeepSpeed ZeRO stages 1, 2 and 3 (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``,
``partition_parameters.py``, ``partitioned_param_coordinator.py``), and the ZeRO paper's formula.

Under ZeRO the module itself is 16-bit (``bit16_groups_flat``); each rank owns a fp32 master
partition and its optimizer state. ``backward()`` fills ``ipg_buffer`` (``reduce_bucket_size``
16-bit elements, two with ``overlap_comm``); ``step()`` builds a fp32 gradient partition (stage 3:
one ``sub_group_size`` group at a time). Stage 2 partitions the 16-bit gradients, stage 3 also the
parameters, gathering a submodule (plus the prefetch bucket, at most ``max_live_parameters``) while
it runs; parameters under ``param_persistence_threshold`` stay whole.

Where each 16-bit gradient lives (DeepSpeed 0.19.8, rank 0 traced on a fake group, ``cabe.trace.zero``): autograd
makes it whole, as ``.grad``; the engine's hook on the parameter's AccumulateGrad (stage_1_and_2.py:1354-1383,
stage3.py:1525) then copies it into the reduce bucket and frees it (stage_1_and_2.py:1455-1461, stage3.py:1632-1640)
-- except under stage 1, whose hook only makes the bucket (stage_1_and_2.py:2284-2291: no
``reduce_ready_partitions_and_remove_grads`` without ``partition_gradients`` or ``overlap_comm``), so every ``.grad``
stays whole until the backward's end. The gradients a rank keeps are made when a bucket is reduced: stages 1/2
``grads_in_partition`` (stage_1_and_2.py:2184-2196, at the first ``reduce_ipg_grads``: the *whole* parameters that
overlap the rank's partition), stage 3 ``grad_partitions_flat_buffer`` (stage3.py:786-791, made with the optimizer).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from cabe.errors import InvalidValueError
from cabe.parallel.shares import (
    NON_LAYER,
    Piece,
    dense_bytes,
    flat_partition,
    optimizer_bytes,
    pieces,
    quantized_held_bytes,
    sharded,
    zero3_shard,
)
from cabe.parallel.strategy import Context, States
from cabe.parallel.zero_buckets import (
    HEAD_FLUSH,
    flat_order,
    stage1_flushes,
    stage2_flushes,
    stored_grad_bytes,
    zero3_flushes,
)
from cabe.tensors import Tensor
from cabe.units import round_alloc


def zero_paper_model_states(params: float, gpus: int, stage: int, k: int = 12) -> float:
    """Model states per device in bytes, ZeRO paper §5 / Fig. 1: Ψ(2 + 2 + K) with partitioning.

    stage 0 (DDP): (2+2+K)Ψ; 1 (P_os): 4Ψ + KΨ/N; 2 (P_os+g): 2Ψ + (2+K)Ψ/N; 3 (P_os+g+p): (2+2+K)Ψ/N.
    K = 12 for mixed-precision Adam (fp32 master 4 + momentum 4 + variance 4).
    """
    if stage not in (0, 1, 2, 3):
        raise InvalidValueError("bad_choice", "stage", value=stage, allowed="0, 1, 2, 3")
    p, n = float(params), int(gpus)
    return {0: (4 + k) * p, 1: 4 * p + k * p / n, 2: 2 * p + (2 + k) * p / n, 3: (4 + k) * p / n}[stage]


@dataclass(frozen=True)
class _Partitions:
    """This rank's partitions, in bytes: 16-bit weights (whole and sharded), 16-bit gradients,
    the fp32 master weights, step()'s fp32 gradient partition, optimizer state and temporaries.

    Tensor by tensor: the module's parameters in its compute dtype (16-bit under mixed precision), each
    rounded as allocated; the trainable ones' partitions as the engine cuts them — stages 1/2 one flat
    aligned buffer per dtype (:func:`~cabe.parallel.shares.flat_partition`), stage 3 each parameter padded
    and split (:func:`~cabe.parallel.shares.zero3_shard`), the fp32 partitions flattened per
    ``sub_group_size`` group — and the optimizer registry's state on those flat fp32 (or stored-dtype)
    partitions, as DeepSpeed's optimizer sees them."""

    w16: float
    w16_sharded: float
    g16: float
    g16_sharded: float
    master: float
    grad32: float
    optimizer: float
    temporaries: float
    ipg: int  # backward()'s ipg_buffer(s), bytes
    elements: int  # elements of this rank's trainable partitions
    host_optimizer: int  # the state on the host under ZeRO-Offload (paged state included)

    @classmethod
    def of(cls, c: Context, stage: int) -> _Partitions:
        mine, cfg, amp, g = c.mine, c.cfg, c.amp, c.group
        half = 2 if amp else 0  # the module in 16-bit under mixed precision, else as stored
        quant = quantized_held_bytes(mine.held, c.setup)
        train = pieces(mine.held, trainable=True, nbytes=half)
        part = sharded(train, zero3_shard, g) if stage == 3 else flat_partition(train, g)
        n_part = round(sum(t.numel * n for t, n, _ in part))
        # the master partition is fp32 whatever the module's dtype, and the optimizer steps it: stages 1/2 clone it
        # (stage_1_and_2.py:560-561, ``.detach().clone().to(dtype=self.master_weights_and_grads_dtype)``), stage 3
        # converts and clones it too: its branch that would share an fp32 module's own partition (stage3.py:1162-1167)
        # tests ``tensor.device == self.device``, a torch.device against the string ``current_device_name()``
        # (stage3.py:333), never equal in torch 2.13 (``torch.device("cuda", 0) == "cuda:0"`` is False), so the else
        # branch clones (1168-1171; rank 0 traced: llama-3.2-1b fp32 on 4 GPUs holds the clone, 1,235,814,400 B)
        opt_in = _flat_groups(part, cfg.sub_group_size if stage == 3 else 0, 4)
        optimizer, temporaries = optimizer_bytes(opt_in, c.setup)
        overlap = cfg.overlap_comm if cfg.overlap_comm is not None else stage == 3
        buffers = 2 if (overlap and stage < 3) else 1
        return cls(
            w16=dense_bytes(pieces(mine.held, nbytes=half)) + quant,
            w16_sharded=dense_bytes(sharded(pieces(mine.held, nbytes=half), zero3_shard, g))
            + quantized_held_bytes(mine.held, c.setup, g),
            g16=dense_bytes(train),
            # stage 3's ``grad_partitions_flat_buffer`` is in the engine's gradient accumulation dtype
            # (stage3.py:786-788), its model dtype unless configured (engine.py:1799-1810): the 16-bit one in its
            # bf16 / fp16 mode, else fp32 -- fp32 for a plain bf16 module too
            g16_sharded=dense_bytes(_flat_groups(part, 0, 0 if amp or stage < 3 else 4)),
            master=dense_bytes(opt_in),
            # step()'s fp32 gradient partition: stage 3 flattens each sub-group's gradients (a ``cat``, a copy even in
            # fp32) and casts it (``_prepare_fp32_grad_for_sub_group``, stage3.py:2686-2687)
            grad32=4 * min(n_part, cfg.sub_group_size) if stage == 3 else 4 * n_part if amp else 0.0,
            optimizer=optimizer,
            temporaries=temporaries,
            # stages 1/2: ``_gradient_reduction_buffer_dtype`` (stage_1_and_2.py:3266-3268, 1253-1254): the module's
            # gradient dtype, but fp32 under stage 1 when the module's dtype is not the engine's gradient accumulation
            # dtype (a plain bf16 module: the engine's is fp32 outside its bf16 / fp16 modes, engine.py:1799-1810;
            # ``use_grad_accum_attribute``, stage_1_and_2.py:397-404); the module's gradient dtype is its first
            # trainable parameter's (``self.dtype``, stage_1_and_2.py:394): fp32 for LoRA's adapters on a plain
            # bf16 module (peft keeps them fp32), so stage 2's bucket is fp32 there; stage 3: its communication dtype, the engine's
            # 16-bit one in its bf16 / fp16 mode, else fp32 (stage3.py:782-784)
            ipg=cfg.reduce_bucket_size * (2 if amp else 4 if stage in (1, 3) else stored_grad_bytes(c)) * buffers
            if (cfg.contiguous_gradients and mine.trainable)
            else 0,
            elements=n_part,
            host_optimizer=optimizer_bytes(opt_in, c.setup, paged=True)[0],
        )


def _flat_groups(part: list[Piece], sub_group: int, nbytes: int) -> list[Piece]:
    """The partitions as flat buffers (one per dtype, or per ``sub_group_size`` elements), in ``nbytes``
    per element when given (the fp32 masters)."""
    out: list[Piece] = []
    by_dtype: dict[int, int] = {}
    for t, n, b in part:
        by_dtype[nbytes or b] = by_dtype.get(nbytes or b, 0) + round(t.numel * n)
    for b, numel in by_dtype.items():
        size = sub_group or numel
        full, rest = divmod(numel, size) if size else (0, 0)
        if full:
            out.append((Tensor("flat", size, full, True, "base"), full, b))
        if rest:
            out.append((Tensor("flat", rest, 1, True, "base"), 1, b))
    return out


def states(c: Context) -> States:
    stage = int(c.layout.strategy[-1])
    mine = c.mine
    p = _Partitions.of(c, stage)
    out = States(weights=p.w16, grads=c.grads, optimizer=c.optimizer, temporaries=c.temporaries, keep_copies=False)
    # the head's gradients (the tied lm_head's pending one, the tied embedding's sum) are whole 16-bit .grad tensors,
    # made by autograd before the hook moves them (module docstring); under stage 1 the sum is the .grad it keeps
    out.whole_head_grads = c.compute_bytes / c.dt.grad if c.mine.trainable else 0.0
    # (a plain 16-bit module's fp32 ``grad_accum`` is made from the sum only at its hook: not the .grad kept)
    out.head_grad_counted = stage == 1 and not _compact(c)
    window: dict[int, float] = {}
    if stage == 3:
        window = _partition_parameters(c, out, p.w16_sharded)
    if c.offload_optimizer:
        # ZeRO-Offload: optimizer state, fp32 master and fp32 gradient partitions on the host (CPU Adam);
        # gradient partitions go to pinned host buffers as they are reduced
        out.optimizer = out.temporaries = out.grads = 0.0
        out.host += p.host_optimizer + p.master + 4 * p.elements
        out.notes.append("offload_optimizer_cpu_adam")
    else:
        out.optimizer = p.optimizer
        # DeepSpeed builds FusedAdam for "AdamW" (multi-tensor kernel, no sqrt copy of the moments)
        fused = c.setup.optimizer == "adamw" and c.setup.optimizer_impl is None
        out.temporaries = 0.0 if fused else p.temporaries
        if fused:
            out.notes.append("deepspeed_fused_adam")
        out.everywhere("master_weights", p.master)
        if stage == 3:
            # grad_partitions_flat_buffer: every trainable parameter's partition, made with the optimizer
            # (stage3.py:786-791), live all along; the whole 16-bit .grad goes into the bucket as it is made
            out.grads = 0.0
            out.everywhere("grad_partitions", p.g16_sharded)
            out.state_grads = p.g16_sharded
            if p.grad32:
                out.buffers["optimizer"]["fp32_grad_partition"] = p.grad32
        else:
            _gradient_partition(c, out, p, stage)
    if p.ipg:
        _ipg_buckets(out, p.ipg, stage)
    if stage == 3 and mine.trainable:
        # each flush in the layers and the head's beside the parameters gathered there (_gathered's window)
        out.flushes = [(k, {**d, "gathered_params": window[k]} if k in window else d) for k, d in zero3_flushes(c)]
    if c.dt.gathered:
        out.notes.append("zero_param_dtype_" + c.setup.param_dtype)
    else:
        out.notes.append("zero_16bit_module" if c.amp else "zero_pure")
    return out


def _gradient_partition(c: Context, out: States, p: _Partitions, stage: int) -> None:
    """Stages 1/2: the 16-bit gradients in backward, and at the step (rank 0, the rank the trace measures).

    ``grads_in_partition`` holds the whole parameters that overlap rank 0's flat partition (stage_1_and_2.py:2184-2196:
    ``total_size += param_in_partition.numel()``), made at the first bucket reduce (stage 1: at the backward's end,
    ``reduce_gradients``, engine.py:3073-3097) and released after the step has flattened it. The step (stage_1_and_2.py
    ``step``) first takes the norm of each piece of the partition in fp64 (``get_grad_norm_direct``,
    stage_1_and_2.py:2684, ``g.data.to(get_norm_dtype())``: double where the device has it), then flattens the
    partition (16-bit) and casts it to fp32 (stage_1_and_2.py:3118) beside it; then the optimizer steps on the fp32
    partition alone."""
    whole, largest_piece = _rank0_partition(c, p.elements)
    half = c.compute_bytes
    compact = _compact(c)
    # the gradients' dtype: the module's 16-bit one in DeepSpeed's bf16 / fp16 mode, else its first trainable
    # parameter's (``self.dtype``, stage_1_and_2.py:394: fp32 for LoRA's adapters on a plain bf16 module)
    gbytes = 2 if c.amp else stored_grad_bytes(c)
    # the rank's gradient partition: ``grads_in_partition`` in the gradients' dtype, or (a plain 16-bit module) the fp32
    # flat one
    gip = round_alloc(4 * p.elements) if compact else round_alloc(round(whole * gbytes))
    # stage 1: each gradient whole until the backward's end (a plain 16-bit module's hook moves each .grad to a fp32
    # ``grad_accum``, ``_fill_param_grad_accum_attribute``, stage_1_and_2.py:1234-1240, via ``process_gradients``
    # 2288-2289); stage 2: none kept until its first bucket reduce that holds a gradient of rank 0's partition
    out.grads = (p.g16 * 2 if compact else p.g16) if stage == 1 else 0.0
    out.step_grads = gip
    if stage == 1 and compact:
        # at the embedding's backward its fp32 ``grad_accum`` is not made yet (its hook runs after, on the 16-bit sum
        # of a tied weight's two gradients, ``_fill_param_grad_accum_attribute``): rank 0 traced, llama-3.2-1b bf16 on
        # 64 GPUs, every other layer's fp32 gradient and three 16-bit embedding-sized ones (+5.1% with its fp32 one)
        emb = sum(h.tensor.numel * h.count for h in c.mine.held if h.trainable and h.tensor.kind == "embedding")
        out.embedding_grads = out.grads - round_alloc(round(4 * emb))
    if p.elements:
        # the step's three moments, one after the other: the fp64 norm of the largest piece beside grads_in_partition;
        # the flat 16-bit partition and its fp32 cast beside it (the fp32 flat partition is the step's gradient as it
        # is: ``_get_preflattened_grad_partition``, stage_1_and_2.py:2904-2909, its ``.to(fp32)`` no copy); then,
        # grads_in_partition freed (``free_grad_in_param_list``, 3118-3122), the optimizer's temporaries beside the
        # fp32 partition (rank 0 traced: llama-3.1-8b at 4 layers, bf16 mode, 4 GPUs peaks at the norm, +13% with
        # the three summed). The moment counts grads_in_partition and the temporaries; this is the rest of the largest.
        fp32_grad = gip if compact else 4 * p.elements
        largest = max(
            gip + 8 * largest_piece,
            gip + (0 if compact else (half + (4 if half != 4 else 0)) * p.elements),
            fp32_grad + out.temporaries,
        )
        out.buffers["optimizer"]["grad_norm_or_flatten"] = max(largest - gip - out.temporaries, 0.0)
    if stage == 2:
        # the model state the ZeRO paper counts (2Ψ/N): the partition the rank keeps from its making to the step
        out.state_grads = gip
        # each whole .grad until the hook has copied it into the bucket: the largest layer parameter's
        out.layer_grads["whole_grad"] = round_alloc(round(_largest_layer_param(c) * gbytes))
        out.flushes, made_at = stage2_flushes(c, gip, compact, gbytes, p.elements, p.ipg)
        if made_at is not None and made_at != -1:  # made before the embedding's gradient: beside its backward
            out.embedding_backward = {**(out.embedding_backward or {}), "grads_in_partition": gip}
        return
    out.flushes = stage1_flushes(c, out.grads, gip, compact, gbytes, p.elements)


def _compact(c: Context) -> bool:
    """A plain 16-bit module under DeepSpeed's fp32 mode (no ``bf16`` / ``fp16`` in its config): the engine's gradient
    accumulation dtype is fp32 (engine.py:1799-1810) while the module's is 16-bit, so stages 1/2 reduce into one fp32
    flat partition per group (``_use_compact_grad_partition_buffer``, stage_1_and_2.py:1259-1266: ``zeros`` of the
    partition's size, 1268-1301, made at the first bucket reduce by ``average_tensor``, 1674, kept to the step)."""
    train = pieces(c.mine.held, trainable=True)
    return not c.amp and bool(train) and train[0][2] == 2


def _rank0_partition(c: Context, part: int) -> tuple[float, float]:
    """Rank 0's flat partition ``[0, part)`` of the trainable parameters in order: the elements of the whole
    parameters that overlap it, and its largest piece."""
    whole = largest = 0.0
    offset = 0.0
    for _, numel in flat_order(c):
        if offset >= part:
            break
        whole += numel
        largest = max(largest, min(numel, part - offset))
        offset += numel
    return whole, largest


def _largest_layer_param(c: Context) -> float:
    return max(
        (
            h.tensor.numel
            for h in c.mine.held
            if h.trainable and h.tensor.name not in NON_LAYER and h.tensor.kind != "quantized"
        ),
        default=0,
    )


def _ipg_buckets(out: States, nbytes: int, stage: int) -> None:
    """The ``reduce_bucket_size`` gradient buffers (``contiguous_gradients``), whatever the model's size.

    Stage 3 makes one per gradient dtype with the optimizer (DeepSpeed 0.19.8 stage3.py:779-784, ``__init__``:
    ``bucket.buffer = torch.empty(self.reduce_bucket_size, ...)``): live all along, in forward too (rank 0 traced:
    qwen2.5-0.5b on 8 GPUs holds it from the set-up on). Stages 1/2 make theirs at the first gradient of every
    backward (stage_1_and_2.py:2287, ``process_gradients`` calls ``setup_buckets``, stage_1_and_2.py:3256-3279: one,
    two with ``overlap_comm``) and release them at its end (``_release_ipg_buffers``, stage_1_and_2.py:924-932), after
    the loss head's logits gradients are freed: beside the layers' and the embedding's backward, not the loss head's
    nor the step's."""
    if stage == 3:
        out.everywhere("ipg_buckets", nbytes)
        return
    out.layer_backward["ipg_buckets"] = nbytes
    out.embedding_backward = {**out.buffers["backward"], **(out.embedding_backward or {}), "ipg_buckets": nbytes}


def _partition_parameters(c: Context, out: States, w16_sharded: float) -> dict[int, float]:
    """ZeRO-3: the 16-bit parameters partitioned (or on the host), gathered submodule by submodule.

    A submodule's parameters are released after it runs unless the recorded order of the step (forward, then backward)
    uses them again within ``max_reuse_distance`` elements (partitioned_param_coordinator.py:634-664,
    ``__params_to_release``; the order is recorded in the first step and used from the second on: ``reset_step`` at
    every forward's start, parameter_offload.py:306, partitioned_param_coordinator.py:251-283). With the default 1e9, a
    layer whose parameters come back within that many elements -- twice what lies above it, the lm_head's included --
    stays gathered from its forward to its backward: at the loss head's backward every such layer is gathered, and a
    tied embedding all along (rank 0 traced: qwen2.5-0.5b on 8 GPUs holds all 24 layers and the embedding, 988 MB, at
    the head's backward, -10% without them). Each module's fetch also prefetches the next ``prefetch_bucket_size``
    elements not gathered while fewer than ``max_live_parameters`` are (partitioned_param_coordinator.py:450-488): the
    window refills to ``max_live_parameters`` (see :func:`_gathered`). Returns the bytes gathered where the flushes
    land: at each layer's backward (by its index from the top) and at the head's (``HEAD_FLUSH``)."""
    mine, amp, dt, g = c.mine, c.amp, c.dt, c.group
    # parameters under stage3_param_persistence_threshold (norms, biases) stay whole
    persistent = mine.persistent_elements * (2 if amp else dt.weight) * (1 - 1 / max(g, 1))
    out.weights = (0.0 if c.offload_parameters else w16_sharded) + persistent
    per = 2 if (amp or dt.weight == 2) else dt.weight
    head, bottom, embedding, window, at_head_flush = _gathered(c)
    out.buffers["forward"]["gathered_params"] = head * per
    out.buffers["backward"]["gathered_params"] = head * per
    out.above_bottom["gathered_params"] = head * per  # (the layers between: at most the head's)
    out.layer_backward["gathered_params"] = bottom * per
    out.embedding_backward = {**(out.embedding_backward or {}), "gathered_params": embedding * per}
    mod_grad = _largest_layer_param(c) * (2 if amp else dt.grad) if mine.trainable else 0
    if mod_grad:
        # the whole .grad of the layer's parameter being made, until the hook copies it into the bucket
        out.layer_grads["whole_grad"] = round_alloc(round(mod_grad))
    if c.offload_parameters:
        out.host += w16_sharded
    return {**{k: w * per for k, w in enumerate(window)}, HEAD_FLUSH: at_head_flush * per}


def _gathered(c: Context) -> tuple[float, float, float, list[float], float]:
    """Elements gathered at the loss head's backward (and the forward's end), at the bottom layer's backward and at
    the embedding's: the step's recorded submodule order walked with ``max_reuse_distance`` (see
    :func:`_partition_parameters`). A submodule is a linear (its weight and bias, its adapters) or a norm; parameters
    under the persistence threshold stay whole (counted in the weights) but count in the distance."""
    cfg, mine = c.cfg, c.mine
    threshold = cfg.param_persistence_threshold
    order = flat_order(c, trainable=False)
    modules: list[tuple[str, float, bool]] = []  # (id, elements, released after use)
    for name, numel in order:
        base = name.split(".lora_")[0].removesuffix(".bias")
        if modules and modules[-1][0].rsplit("#", 1)[0] == base and name not in NON_LAYER:
            last = modules[-1]
            modules[-1] = (last[0], last[1] + numel, last[2] or numel >= threshold)
        else:
            modules.append((f"{base}#{len(modules)}", numel, numel >= threshold))
    tied = not any(h.tensor.kind == "lm_head" for h in mine.held) and any(
        h.tensor.kind == "embedding" for h in mine.held
    )
    emb = next((m for m in modules if m[0].startswith("embed_tokens#")), None)
    forward = list(modules)
    if tied and emb is not None:
        forward.append(emb)  # the lm_head module runs the embedding's weight
    trained = mine.trainable > 0
    head_trained = any(h.trainable for h in mine.held if h.tensor.kind in ("embedding", "lm_head")) and tied
    in_backward = _backward_modules(c, forward, emb, tied, head_trained) if trained else []
    seq = forward + in_backward
    # the next use of each module after position i, and the elements between: kept if fewer than the distance
    prefix = [0.0]
    for _, numel, _ in seq:
        prefix.append(prefix[-1] + numel)
    next_use: dict[str, int] = {}
    kept_after = [False] * len(seq)
    for i in range(len(seq) - 1, -1, -1):
        mid = seq[i][0]
        j = next_use.get(mid)
        kept_after[i] = j is not None and prefix[j] - prefix[i + 1] < cfg.max_reuse_distance
        next_use[mid] = i
    gathered = {m[0]: m[1] for i, m in enumerate(forward) if m[2] and kept_after[i]}
    if forward and forward[-1][2]:
        gathered[forward[-1][0]] = forward[-1][1]  # the module running: the lm_head
    head = sum(gathered.values())
    # what the prefetcher holds by then: the next modules of the backward not gathered, up to ``max_live_parameters``
    # in all. Each module's fetch -- containers and parameterless modules too, a dozen per decoder layer -- prefetches
    # the trace queue's next ``min(max_live_parameters - n_available, prefetch_bucket_size)`` elements
    # (partitioned_param_coordinator.py:450-488), so the window refills to max_live_parameters (the parameter that
    # crosses it included) after every release; what it pops is marked fetched for its later use and not released
    # (466-468, 634-664). Rank 0 traced, step 2: llama-3.1-8b at 4 layers, LoRA fp32, 4 GPUs holds 963e6 elements at
    # the lm_head and the next 58.7e6 in flight (one bucket's prefetch: 585e6, -16%); llama-3.2-1b in DeepSpeed's bf16
    # mode with checkpointing about 1.0e9 (-6%)
    prefetch = 0.0
    stop = 0  # (where in the backward the prefetch has reached)
    if head < cfg.max_live_parameters:
        limit = cfg.max_live_parameters - head
        for mid, numel, released in in_backward:
            if prefetch >= limit:
                break
            stop += 1
            if released and mid not in gathered:
                prefetch += numel
    # the head's gradient reduces land at the final norm's hook, after the lm_head's backward has released it (unless
    # its weight, a tied embedding's, is used again within the window) and two more fetches (the decoder's container,
    # the final norm) have prefetched a bucket each (rank 0 traced: qwen2.5-7b on 29 GPUs, 1011e6 elements gathered at
    # the lm_head, 602e6 at the final norm's backward)
    at_flush = head + prefetch
    lm = forward[-1] if forward and forward[-1][2] else None
    if lm is not None and not (tied and stop >= len(in_backward) and emb in in_backward[1:]):
        at_flush -= lm[1]
    for _ in range(2):
        got = 0.0
        while stop < len(in_backward) and got < cfg.prefetch_bucket_size:
            mid, numel, released = in_backward[stop]
            stop += 1
            if released and mid not in gathered:
                got += numel
        at_flush += got
    # the bottom layer's backward: its own submodules, and the embedding next (a tied one kept, else prefetched)
    body = [m for m in in_backward if m[0].split("#")[0] not in NON_LAYER]
    per = len([m for m in forward if m[0].split("#")[0] not in NON_LAYER]) // max(c.layout.stage_layers, 1)
    embedding = emb[1] if emb is not None and emb in in_backward else 0.0
    bottom = sum(n for _, n, released in body[-per:] if released) if body and per else 0.0
    # at each layer's backward (from the top): the prefetch window over what is left of the backward, the layers above
    # done and released (no later use), at most the head's
    window: list[float] = []
    if per:
        lead = len(in_backward) - len(body) - (1 if embedding else 0)  # (the head's modules before the layers')
        sums = [0.0]  # (the released elements of the backward's modules, summed in order)
        for _, numel, released in in_backward:
            sums.append(sums[-1] + (numel if released else 0.0))
        for k in range(len(body) // per):
            start = sums[lead + k * per]
            # up to the module whose elements reach max_live_parameters, that one included
            end = bisect_left(sums, start + cfg.max_live_parameters, lo=lead + k * per)
            window.append(min(sums[min(end, len(sums) - 1)] - start, head + prefetch))
    return head + prefetch, bottom + embedding, embedding, window, min(at_flush, head + prefetch)


def _backward_modules(
    c: Context,
    forward: list[tuple[str, float, bool]],
    emb: tuple[str, float, bool] | None,
    tied: bool,
    head_trained: bool,
) -> list[tuple[str, float, bool]]:
    """The submodules whose backward runs, in order: the head, then the layers in the gradient's path from the top
    (freeze: its trained layers), then the embedding when it is trained."""
    layers = c.layout.stage_layers or 1
    trained = min(layers, c.setup.trainable_layers or layers) if c.setup.method == "freeze" else layers
    body = [m for m in forward if m[0].split("#")[0] not in NON_LAYER]
    per = len(body) // layers if layers else 0
    head_mods = [m for m in forward if m[0].split("#")[0] in ("final_norm", "lm_head")]
    head_mods = [forward[-1], *head_mods] if tied and emb is not None else list(reversed(head_mods))
    out = list(head_mods)
    for i in range(layers - 1, layers - 1 - trained, -1):
        out += list(reversed(body[i * per : (i + 1) * per]))
    if emb is not None and any(h.trainable and h.tensor.kind == "embedding" for h in c.mine.held):
        out.append(emb)
    return out
