"""DeepSpeed ZeRO's gradient bucket reduces in backward (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``,
DeepSpeed 0.19.8): where each happens and what is live beside it, rank 0 as the trace measures it
(:mod:`cabe.parallel.zero` holds the partitions and the states)."""

from __future__ import annotations

from cabe.parallel.shares import NON_LAYER, pieces
from cabe.parallel.strategy import Context
from cabe.units import round_alloc

#: the flush key of a bucket reduce in the loss head's backward, before any layer's (step.StepParts.extra_flush)
HEAD_FLUSH = -2


def stage1_flushes(
    c: Context, whole_bytes: float, gip: int, compact: bool, gbytes: int, part: int
) -> list[tuple[int, dict[str, float]]]:
    """Stage 1's bucket reduces, all after the backward (``reduce_gradients``, stage_1_and_2.py:958-978: each
    parameter in the module's order through ``reduce_independent_p_g_buckets_and_remove_grads``, 1414-1470), as
    overrides of the end of backward's moment: the whole gradients still to be copied into the bucket (``whole_bytes``
    in all, a plain 16-bit module's fp32 ``grad_accum``), the bucket's ``cat`` and cast (see :func:`stage2_flushes`)
    and rank 0's partition once made.

    Copying a gradient into the bucket frees its whole ``.grad`` (its ``.data`` now views the bucket, 1455-1461), so a
    bucket's ``cat`` takes the place of the gradients it holds. A gradient over ``reduce_bucket_size`` is not copied
    (1449-1453) but flattened whole, beside it and every gradient not yet reduced: the embedding, first in the module's
    order, beside all of them (rank 0 traced: llama-3.1-8b at 4 layers on 16 GPUs, +2.1 GB). After a reduce stage 1
    frees nothing outside rank 0's partition (2255-2257: no ``clear_grad_attribute``): an oversized gradient stays
    whole; the others view the bucket, reused. Rank 0's gradients go into ``grads_in_partition`` (its own copy, made
    at the first such reduce, 2184-2196) or, a plain 16-bit module, into its fp32 flat partition made before the
    ``cat`` (1312-1321), their ``grad_accum`` freed (2178-2181)."""
    r = c.cfg.reduce_bucket_size
    bucket_bytes = 4 if compact else 2 if c.amp else stored_grad_bytes(c)
    comm = 2 if c.amp else 4
    per = 4 if compact else gbytes  # the whole gradients' bytes per element
    flushes: dict[int, dict[str, float]] = {}
    bucket: list[tuple[float, float]] = []
    freed = 0.0  # elements whose whole gradient is gone
    made = False

    def flush() -> None:
        nonlocal made, freed
        mine = any(o < part for _, o in bucket)
        made = made or (compact and mine)
        large = len(bucket) == 1 and bucket[0][0] > r
        cat = flat_slices(*bucket[0], part, r) if large else sum(n for n, _ in bucket)
        now: dict[str, float] = {"gradients": max(whole_bytes - per * freed, 0.0)}
        if made:
            now["grads_in_partition"] = gip
        now["reduce_flat"] = round_alloc(round(bucket_bytes * cat))
        if comm != bucket_bytes:
            now["reduce_cast"] = round_alloc(round(comm * cat))
        if sum(now.values()) > sum(flushes.get(-1, {}).values()):
            flushes[-1] = now
        made = made or mine
        if large and bucket[0][1] < part:  # (rank 0's own: copied into its partition, the whole one freed)
            freed += bucket[0][0]
        bucket.clear()

    offset = 0.0
    for _, numel, _ in placed_order(c):
        if bucket and sum(n for n, _ in bucket) + numel > r:
            flush()
        bucket.append((numel, offset))
        if numel <= r:
            freed += numel
        offset += numel
    if bucket:
        flush()
    return sorted(flushes.items())


def flat_slices(n: float, start: float, part: float, r: float) -> float:
    """The largest group ``allreduce_and_scatter`` (stage_1_and_2.py:1546-1588) flattens of one gradient's rank slices
    (cut at the partitions' bounds, grouped until just over ``r`` elements): the elements of its largest ``cat``."""
    largest = group = 0.0
    pos, end = start, start + n
    while pos < end:
        nxt = min(end, (pos // part + 1) * part) if part else end
        group += nxt - pos
        pos = nxt
        if group > r:
            largest, group = max(largest, group), 0.0
    return max(largest, group)


def stage2_flushes(
    c: Context, gip: int, compact: bool, gbytes: int, part: int, ipg: int
) -> tuple[list[tuple[int, dict[str, float]]], int | None]:
    """Stage 2's bucket reduces in backward, each with what is live beside it, by where it happens (the layers from
    the top, :data:`HEAD_FLUSH` in the loss head's backward, -1 at the embedding's and the backward's end), and where
    rank 0's gradient partition is made (None: not in backward).

    Each hook (``reduce_independent_p_g_buckets_and_remove_grads``, stage_1_and_2.py:1414-1470, in :func:`hooks`'
    order) reduces the bucket first when its gradient would overflow ``reduce_bucket_size`` (1422-1424): its own
    ``.grad`` is whole then. A gradient over ``reduce_bucket_size`` is not copied into the bucket but reduced alone,
    whole (1449-1453, ``extra_large_param_to_reduce``; 2217-2228), at the next hook. ``average_tensor`` (1590-1720)
    cuts the bucket into its ranks' slices and ``allreduce_and_scatter`` (1546-1588) all-reduces them in groups of
    just over ``reduce_bucket_size`` elements, each flattened (``allreduce_bucket``, 2367: a ``cat``) and cast to the
    communication dtype where it differs (2376-2377). Only then does ``reduce_ipg_grads`` (2246-2262) free the
    gradients outside rank 0's partition and copy those in it into ``grads_in_partition`` -- made at the first reduce
    that holds one of rank 0's parameters (``copy_grads_in_partition``, 2184-2196), after its ``cat`` is freed. Rank 0's
    partition is the flat order's first elements (the embedding's, the bottom layers'), reduced last: on a few GPUs
    from some layer of the path on, on more only at the embedding's. A plain 16-bit module's fp32 flat partition is
    made within ``average_tensor`` (``_get_compact_grad_partition_slice``, 1312-1321), before the ``cat``."""
    r = c.cfg.reduce_bucket_size
    layers = c.layout.stage_layers or 1
    bucket_bytes = 2 if c.amp else stored_grad_bytes(c)
    comm = 2 if c.amp else 4  # the engine's communication dtype (engine.py:1719-1730)
    offset: dict[tuple[str, float, int], float] = {}
    at_ = 0.0
    for x in placed_order(c):
        offset[x] = at_
        at_ += x[1]
    flushes: dict[int, dict[str, float]] = {}
    bucket: list[tuple[float, float]] = []  # (elements, flat offset)
    made_at: int | None = None

    def flush(at: int, trigger: float) -> None:
        nonlocal made_at
        mine = any(o < part for _, o in bucket)
        if compact and mine and made_at is None:
            made_at = at
        large = len(bucket) == 1 and bucket[0][0] > r
        cat = flat_slices(*bucket[0], part, r) if large else sum(n for n, _ in bucket)
        now: dict[str, float] = {"grads_in_partition": gip} if made_at is not None else {}
        now["reduce_flat"] = round_alloc(round(bucket_bytes * cat))
        if comm != bucket_bytes:
            now["reduce_cast"] = round_alloc(round(comm * cat))
        if large:  # the oversized gradient, whole, beside its own cat
            now["whole_grad_reduced"] = round_alloc(round(gbytes * bucket[0][0]))
        if at < 0 or at == HEAD_FLUSH:  # (in the layers, ``layer_grads``' whole gradient stands for the hook's own)
            now["whole_grad"] = round_alloc(round(gbytes * trigger))
        if at == HEAD_FLUSH and ipg:  # (made at the first hook: beside the head's reduces, _ipg_buckets)
            now["ipg_buckets"] = ipg
        if sum(now.values()) > sum(flushes.get(at, {}).values()):
            flushes[at] = now
        if mine and made_at is None:
            made_at = at
        bucket.clear()

    for x in hooks(c):
        numel, where = x[1], x[2]
        at = -1 if where < 0 else HEAD_FLUSH if where >= layers else layers - 1 - where
        if bucket and sum(n for n, _ in bucket) + numel > r:
            flush(at, numel)
        bucket.append((numel, offset[x]))
    if bucket:
        flush(-1, 0.0)
    if made_at is not None and made_at not in (-1, layers - 1) and layers - 1 not in flushes:
        # made above the bottom layer: beside its backward too
        flushes[layers - 1] = {"grads_in_partition": gip}
    return sorted((k, v) for k, v in flushes.items() if v), made_at


def stored_grad_bytes(c: Context) -> int:
    """The bytes per element of the trainable parameters' gradients as the module holds them."""
    train = pieces(c.mine.held, trainable=True)
    return train[0][2] if train else c.compute_bytes


def flat_order(c: Context, trainable: bool = True) -> list[tuple[str, float]]:
    """(name, elements) of the parameters in the module's order (``model.parameters()``: the embeddings, each layer's
    linears then its norms, the final norm, the lm_head), the trainable ones only with ``trainable``."""
    return [(name, numel) for name, numel, _ in placed_order(c, trainable)]


def placed_order(c: Context, trainable: bool = True) -> list[tuple[str, float, int]]:
    """:func:`flat_order` with where each parameter is: -1 before the layers (the embeddings), the layer's index
    (0 the bottom one), the layer count after them (the final norm, the lm_head)."""
    mine = c.mine
    lead: list[tuple[str, float]] = []
    tail: list[tuple[str, float]] = []
    layer: list[tuple[str, float, int, int]] = []
    layers = c.layout.stage_layers or 1
    trained = layers
    if c.setup.method == "freeze":
        trained = min(layers, c.setup.trainable_layers or layers)
    for h in mine.held:
        t = h.tensor
        if t.kind == "quantized" or (trainable and not h.trainable):
            continue
        if t.name in NON_LAYER:
            (lead if t.kind in ("embedding", "prompt") else tail).append((t.name, t.numel * h.count))
        else:
            # freeze: the trained tensors are the top layers', the frozen ones the bottom layers'
            lo, hi = (
                (layers - trained, layers) if h.trainable else (0, layers - trained if trained < layers else layers)
            )
            layer.append((t.name, t.numel * h.count / max(hi - lo, 1), lo, hi))
    tail.sort(key=lambda x: x[0] != "final_norm")  # (the final norm runs before the lm_head)
    out = [(n, numel, -1) for n, numel in lead]
    for i in range(layers):
        here = [(n, numel, i) for n, numel, lo, hi in layer if lo <= i < hi]
        out += sorted(here, key=lambda x: x[0].startswith("norm"))  # (a layer's norms after its linears)
    return out + [(n, numel, layers) for n, numel in tail]


def hooks(c: Context) -> list[tuple[str, float, int]]:
    """The trainable parameters as their gradients' hooks run (:func:`placed_order`'s entries): the head's, the
    layers' from the top, each layer's linears in reverse, then the embedding's."""
    layers = c.layout.stage_layers or 1
    placed = placed_order(c)
    head = [x for x in placed if x[2] >= layers][::-1]
    # (a layer's backward makes its linears' gradients from the last one, its norms' after them: the MLP's before the
    # post-attention norm's, attention's before the input norm's -- taken after all its linears' here)
    body = [x for x in placed if 0 <= x[2] < layers][::-1]
    body.sort(key=lambda x: (-x[2], x[0].startswith("norm")))
    return head + body + [x for x in placed if x[2] < 0]


def zero3_flushes(c: Context) -> list[tuple[int, dict[str, float]]]:
    """ZeRO-3's bucket flushes in backward, each with the ``torch.cat`` it makes, by the layer whose backward it is in.

    Each trainable parameter's hook (in the order autograd makes the gradients: the head's, the layers' from the top,
    each layer's linears in reverse, then the embedding's, a tied one's last) adds its gradient to the bucket; when
    it would overflow ``reduce_bucket_size`` (stage3.py:1582, ``bucket.elements + param.ds_numel >
    self.reduce_bucket_size``) the bucket is reduced first, and what is left at the end of backward in the epilogue
    (stage3.py:1407-1411, ``independent_gradient_partition_epilogue``, run by the last hook: runtime/base_optimizer.py:218). DeepSpeed's default
    ``reduce_scatter`` (stage3.py:1673-1678) takes ``__avg_scatter_grads`` -> ``reduce_scatter_coalesced``
    (runtime/comm/coalesced_collectives.py:97-111): one ``torch.cat`` of every gradient's partitions padded to
    ``ceil(numel / world)`` -- the bucket's elements in the communication dtype (the gradients were copied into the
    bucket in that dtype, stage3.py:1615-1624), none for a single gradient the world divides. At the embedding's
    hook its whole gradient (autograd's, the module's dtype) is live beside the cat; it goes into the bucket after."""
    cfg, g = c.cfg, max(c.group, 1)
    layers = c.layout.stage_layers or 1
    comm = 2 if c.amp else 4  # the engine's communication dtype: its 16-bit one in bf16 / fp16 mode, else fp32
    flushes: dict[int, dict[str, float]] = {}
    bucket: list[float] = []

    def flush(at: int, extra: dict[str, float]) -> None:
        if len(bucket) == 1 and bucket[0] % g == 0:
            nbytes = 0.0
        else:
            nbytes = float(round_alloc(round(comm * sum(-(-round(n) // g) * g for n in bucket))))
        now = {"reduce_scatter_input": nbytes, **extra}
        if len(bucket) == 1 and bucket[0] > cfg.reduce_bucket_size:
            # an oversized gradient is not copied into the bucket (stage3.py:1626): whole beside its reduce
            now["whole_grad_reduced"] = round_alloc(round(bucket[0] * c.compute_bytes))
        if sum(now.values()) > sum(flushes.get(at, {}).values()):
            flushes[at] = now
        bucket.clear()

    for _, numel, where in hooks(c):
        # where the flush happens: in the loss head's backward for the head's (HEAD_FLUSH), at the end of backward for
        # the embedding's (its whole gradient beside it)
        at = -1 if where < 0 else HEAD_FLUSH if where >= layers else layers - 1 - where
        if bucket and sum(bucket) + numel > cfg.reduce_bucket_size:
            flush(at, {"whole_grad": round_alloc(round(numel * c.compute_bytes))} if at < 0 else {})
        bucket.append(numel)
    if bucket:
        flush(-1, {})
    return sorted(flushes.items())
