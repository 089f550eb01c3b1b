"""DeepSpeed ZeRO stages 1, 2 and 3 (``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py``,
``partition_parameters.py``, ``partitioned_param_coordinator.py``), and the ZeRO paper's formula.

Under ZeRO the module itself is 16-bit (``bit16_groups_flat``); each rank owns a fp32 master
partition and its optimizer state. ``backward()`` fills ``ipg_buffer`` (``reduce_bucket_size``
16-bit elements, two with ``overlap_comm``); ``step()`` builds a fp32 gradient partition (stage 3:
one ``sub_group_size`` group at a time). Stage 2 partitions the 16-bit gradients, stage 3 also the
parameters, gathering a submodule (plus the prefetch bucket, at most ``max_live_parameters``) while
it runs; parameters under ``param_persistence_threshold`` stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.errors import InvalidValueError
from cabe.parallel.shares import (
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
from cabe.tensors import Tensor


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
        opt_in = _flat_groups(part, cfg.sub_group_size if stage == 3 else 0, 4 if amp else 0)
        optimizer, temporaries = optimizer_bytes(opt_in, c.setup)
        overlap = cfg.overlap_comm if cfg.overlap_comm is not None else stage == 3
        buffers = 2 if (overlap and stage < 3) else 1
        return cls(
            w16=dense_bytes(pieces(mine.held, nbytes=half)) + quant,
            w16_sharded=dense_bytes(sharded(pieces(mine.held, nbytes=half), zero3_shard, g))
            + quantized_held_bytes(mine.held, c.setup, g),
            g16=dense_bytes(train),
            g16_sharded=dense_bytes(_flat_groups(part, 0, 0)),
            master=dense_bytes(opt_in) if amp else 0.0,
            grad32=4 * (min(n_part, cfg.sub_group_size) if stage == 3 else n_part) if amp else 0.0,
            optimizer=optimizer,
            temporaries=temporaries,
            ipg=cfg.reduce_bucket_size * 2 * buffers if (cfg.contiguous_gradients and mine.trainable) else 0,
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
    p = _Partitions.of(c, stage)
    out = States(weights=p.w16, grads=c.grads, optimizer=c.optimizer, temporaries=c.temporaries, keep_copies=False)
    if stage == 3:
        _partition_parameters(c, out, p.w16_sharded)
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
        out.grads = p.g16 if stage == 1 else p.g16_sharded
        if p.grad32:
            out.buffers["optimizer"]["fp32_grad_partition"] = p.grad32
    if p.ipg:
        _ipg_buckets(out, p.ipg, stage)
    if c.dt.gathered:
        out.notes.append("zero_param_dtype_" + c.setup.param_dtype)
    else:
        out.notes.append("zero_16bit_module" if c.amp else "zero_pure")
    return out


def _ipg_buckets(out: States, nbytes: int, stage: int) -> None:
    """The ``reduce_bucket_size`` gradient buffers (``contiguous_gradients``), whatever the model's size.

    Stage 3 makes one per gradient dtype with the optimizer (DeepSpeed 0.19.8 stage3.py:779-784, ``__init__``:
    ``bucket.buffer = torch.empty(self.reduce_bucket_size, ...)``): live all along. Stages 1/2 make theirs at the
    first gradient of every backward (stage_1_and_2.py:2287, ``process_gradients`` calls ``setup_buckets``,
    stage_1_and_2.py:3256-3279: one, two with ``overlap_comm``), after the loss head's logits gradients are freed:
    beside the layers' and the embedding's backward, not the loss head's (rank 0 traced, ``cabe.trace.zero``:
    qwen2.5-0.5b on 8 GPUs, bf16, its peak in the layers' backward with the buffer, 17% below the estimate that
    put the buffer beside the head's fp32 logits)."""
    if stage == 3:
        out.buffers["backward"]["ipg_buckets"] = nbytes
        return
    out.layer_backward["ipg_buckets"] = nbytes
    out.embedding_backward = {**out.buffers["backward"], "ipg_buckets": nbytes}


def _partition_parameters(c: Context, out: States, w16_sharded: float) -> None:
    """ZeRO-3: the 16-bit parameters partitioned (or on the host), one submodule gathered at a time."""
    mine, cfg, amp, dt, g = c.mine, c.cfg, c.amp, c.dt, c.group
    # parameters under stage3_param_persistence_threshold (norms, biases) stay whole
    persistent = mine.persistent_elements * (2 if amp else dt.weight) * (1 - 1 / max(g, 1))
    out.weights = (0.0 if c.offload_parameters else w16_sharded) + persistent
    # the submodule being run + the prefetch bucket, at most max_live_parameters
    gathered = min(
        cfg.max_live_parameters, mine.largest_module + cfg.prefetch_bucket_size, mine.elements + 2 * mine.quantized
    )
    gathered *= 2 if (amp or dt.weight == 2) else dt.weight
    out.buffers["forward"]["gathered_params"] = gathered
    out.buffers["backward"]["gathered_params"] = gathered
    mod_grad = min(mine.largest_module, mine.trainable_elements) * (2 if amp else dt.grad) if mine.trainable else 0
    if mod_grad:
        out.buffers["backward"]["module_grads"] = mod_grad
    if c.offload_parameters:
        out.host += w16_sharded
