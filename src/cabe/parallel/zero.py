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
from cabe.parallel.strategy import Context, States


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
    the fp32 master weights, step()'s fp32 gradient partition, optimizer state and temporaries."""

    w16: float
    w16_sharded: float
    g16: float
    g16_sharded: float
    master: float
    grad32: float
    optimizer: float
    temporaries: float
    ipg: int  # backward()'s ipg_buffer(s), bytes

    @classmethod
    def of(cls, c: Context, stage: int) -> _Partitions:
        mine, cfg, amp, g, rw = c.mine, c.cfg, c.amp, c.group, c.scale.weights
        half_w = 2 * mine.elements if amp else mine.stored  # the non-quantized weights in 16-bit
        g16 = c.grads / 2 if amp else c.grads
        n_grad32 = mine.trainable_elements_sharded
        if stage == 3:
            n_grad32 = min(n_grad32, cfg.sub_group_size)
        overlap = cfg.overlap_comm if cfg.overlap_comm is not None else stage == 3
        buffers = 2 if (overlap and stage < 3) else 1
        kept = c.sharded_fraction if mine.trainable else 0.0
        return cls(
            w16=half_w * rw + mine.quantized * rw,
            w16_sharded=(2 * mine.elements_sharded if amp else mine.stored_sharded) * rw + mine.quantized_sharded * rw,
            g16=g16,
            g16_sharded=g16 / max(g, 1) if mine.trainable == 0 else g16 * c.sharded_fraction,
            master=4 * mine.trainable_elements_sharded if amp else 0.0,
            grad32=4 * n_grad32 if amp else 0.0,
            optimizer=c.optimizer * kept if mine.trainable else 0.0,
            temporaries=c.temporaries * kept if mine.trainable else 0.0,
            ipg=cfg.reduce_bucket_size * 2 * buffers if (cfg.contiguous_gradients and mine.trainable) else 0,
        )


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
        out.host += p.optimizer + p.master + 4 * c.mine.trainable_elements_sharded
        if p.ipg:
            out.buffers["backward"]["ipg_buckets"] = p.ipg
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
        if p.ipg:
            out.buffers["backward"]["ipg_buckets"] = p.ipg
        if p.grad32:
            out.buffers["optimizer"]["fp32_grad_partition"] = p.grad32
    out.notes.append("zero_16bit_module" if c.amp else "zero_pure")
    return out


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
