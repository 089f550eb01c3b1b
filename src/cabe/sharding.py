"""Several GPUs: what each GPU holds under DDP, DeepSpeed ZeRO-1/2/3, FSDP, offload, TP, PP and EP.

:func:`shard_parts` takes the single-GPU :class:`~cabe.step.StepParts` of a setup and returns the
parts of ONE GPU (the pipeline stage with the highest peak) plus an ``info`` dict (host RAM per
node, per-GPU figures, notes, explanation steps). The walk of the step (:func:`cabe.step.timeline`)
is the same; sharding only changes sizes and adds communication buffers.

Sources, read rather than guessed (file paths in their repositories):

* PyTorch DDP, ``torch/nn/parallel/distributed.py``: ``bucket_cap_mb=25`` (first bucket
  ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB); the Reducer allocates one flat bucket tensor per
  bucket that together cover every gradient. With ``gradient_as_bucket_view=False`` (the default)
  ``param.grad`` and the buckets are separate tensors, so the buckets cost one more copy of all
  gradients ("the saved memory size will be equal to the total gradients size" when True).
* DeepSpeed ``deepspeed/runtime/zero/config.py``: ``reduce_bucket_size`` 5e8 elements,
  ``allgather_bucket_size`` 5e8, ``stage3_prefetch_bucket_size`` 5e7,
  ``stage3_max_live_parameters`` 1e9, ``stage3_param_persistence_threshold`` 1e5, ``overlap_comm``
  defaults to True for stage 3 only, ``contiguous_gradients`` True.
* DeepSpeed ``deepspeed/runtime/zero/stage_1_and_2.py``: the module is kept in 16-bit
  (``bit16_groups_flat``), each rank owns a fp32 partition (``single_partition_of_fp32_groups``) and
  its optimizer state; ``backward()`` allocates ``ipg_buffer`` = ``torch.empty(reduce_bucket_size,
  dtype=16-bit)`` (two of them with ``overlap_comm``); ``step()`` builds a fp32 gradient partition
  (``single_grad_partition``). Its estimator ``estimate_zero2_model_states_mem_needs``:
  GPU = 2P + 18P/N (2 params16 + [2 grads16 + 4 grads32 + 4 params32 + 8 Adam]/N), offload: 2P.
* DeepSpeed ``stage3.py`` / ``partition_parameters.py`` / ``partitioned_param_coordinator.py``:
  every parameter partitioned (except those under the persistence threshold), gathered per
  submodule on use, prefetched up to ``prefetch_bucket_size``, at most ``max_live_parameters``
  gathered. Estimator ``estimate_zero3_model_states_mem_needs``: 4·largest_layer + 18P/N.
* PyTorch FSDP ``torch/distributed/fsdp/`` (FSDP1 ``FULL_SHARD``/``HYBRID_SHARD``, FSDP2
  ``fully_shard``): sharded parameters, gradients and optimizer state; one wrapped unit (a decoder
  layer) all-gathered while it runs, resharded after forward, ``BackwardPrefetch.BACKWARD_PRE`` /
  FSDP2's implicit prefetch keeps the next unit's all-gather in flight; the root unit (embeddings,
  final norm, lm_head) is not resharded after forward; ``CPUOffload(offload_params=True)`` moves
  parameters and gradients to the host and runs the optimizer there.
* Megatron-LM tensor / sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
  Recomputation"): per layer sbh(10 + 24/t + 5as/(ht)) without SP, sbh(34/t + 5as/(ht)) with SP:
  10/34 of a layer's activations (norm inputs, dropout masks, residual) are replicated across TP
  ranks unless SP splits them along the sequence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.method import Tensor, parameter_tensors, quantized_bytes, stored_bytes
from cabe.precision import dtypes_for
from cabe.report import GB, GiB
from cabe.step import StepParts, timeline
from cabe.training import TrainingSetup

_NON_LAYER = ("embed_tokens", "position_embeddings", "final_norm", "lm_head", "prompt_embeddings")
#: Korthikanti et al.: of the 34·sbh bytes a layer saves (16-bit), 10·sbh are not split by TP without SP.
TP_REPLICATED_ACT_FRACTION = 10 / 34
MiB = 2**20


@dataclass(frozen=True)
class ShardConfig:
    """Knobs of the frameworks, with their defaults (see the module docstring for the sources)."""

    # DDP
    bucket_cap_mb: float = 25.0
    gradient_as_bucket_view: bool = False
    # DeepSpeed ZeRO (elements, not bytes)
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None  # None: DeepSpeed's default, True for stage 3 only
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000  # ZeRO-3 steps the optimizer one sub-group at a time
    # FSDP
    fsdp_prefetch: bool = True  # BACKWARD_PRE (FSDP1 default) / FSDP2 implicit prefetch
    # Megatron-style model parallelism
    sequence_parallel: bool = False
    vocab_parallel: bool = True  # VocabParallelEmbedding + vocab-parallel cross entropy
    pp_schedule: str = "1f1b"  # "1f1b" | "gpipe"

    @classmethod
    def hf_auto(cls, hidden_size: int, **kw: Any) -> ShardConfig:
        """The values Hugging Face's DeepSpeed integration fills for ``"auto"``
        (transformers/integrations/deepspeed.py): reduce_bucket_size = h², prefetch = 0.9·h²,
        persistence threshold = 10·h."""
        return cls(
            reduce_bucket_size=hidden_size * hidden_size,
            prefetch_bucket_size=int(0.9 * hidden_size**2),
            param_persistence_threshold=10 * hidden_size,
            **kw,
        )


DEFAULT_CONFIG = ShardConfig()


# =============================================================================================
# the ZeRO paper's model-states formula
# =============================================================================================


def zero_paper_model_states(params: float, gpus: int, stage: int, k: int = 12) -> float:
    """Model states per device in bytes, ZeRO paper §5 / Fig. 1: Ψ(2 + 2 + K) with partitioning.

    stage 0 (DDP): (2+2+K)Ψ; 1 (P_os): 4Ψ + KΨ/N; 2 (P_os+g): 2Ψ + (2+K)Ψ/N; 3 (P_os+g+p): (2+2+K)Ψ/N.
    K = 12 for mixed-precision Adam (fp32 master 4 + momentum 4 + variance 4).
    """
    if stage not in (0, 1, 2, 3):
        raise InvalidValueError("bad_choice", "stage", value=stage, allowed="0, 1, 2, 3")
    p, n = float(params), int(gpus)
    return {0: (4 + k) * p, 1: 4 * p + k * p / n, 2: 2 * p + (2 + k) * p / n, 3: (4 + k) * p / n}[stage]


# =============================================================================================
# per-GPU share of every parameter tensor (TP, PP, EP)
# =============================================================================================


@dataclass
class _Sums:
    """Byte and element sums over the tensors one GPU holds (model-parallel share applied)."""

    w: float = 0.0  # stored bytes, non-quantized
    w_sh: float = 0.0  # the same divided by its data-parallel group size
    q: float = 0.0  # quantized (4-bit) bytes
    q_sh: float = 0.0
    t: float = 0.0  # trainable stored bytes
    t_sh: float = 0.0
    n: float = 0.0  # non-quantized elements
    n_sh: float = 0.0
    nt: float = 0.0  # trainable elements
    nt_sh: float = 0.0
    persistent_n: float = 0.0  # ZeRO-3: elements under the persistence threshold (kept whole)
    layer_n: float = 0.0  # non-quantized elements of one decoder layer
    layer_q: float = 0.0  # quantized bytes of one decoder layer
    layer_w: float = 0.0  # stored bytes of one decoder layer
    layer_nt: float = 0.0  # trainable elements of one decoder layer
    root_n: float = 0.0  # embeddings, final norm, lm_head on this stage
    root_w: float = 0.0
    largest_module: float = 0.0  # elements of the largest module (DeepSpeed's "largest layer")


def _layout(spec: ModelSpec, setup: TrainingSetup, cfg: ShardConfig) -> tuple[int, int, int]:
    """Validate the parallel layout; returns (dp, tp, pp)."""
    tp, pp, ep, n = setup.tp, setup.pp, setup.ep, setup.gpus
    if n % (tp * pp):
        raise InvalidValueError("gpus_not_divisible", "gpus", value=n, tp=tp, pp=pp)
    dp = n // (tp * pp)
    if pp > spec.num_layers:
        raise InvalidValueError("out_of_range", "pp", value=pp, minimum=1, maximum=spec.num_layers)
    if tp > 1 and spec.num_heads % tp:
        raise InvalidValueError("tp_not_divisor", "tp", value=tp, heads=spec.num_heads)
    if ep > 1:
        if not spec.num_experts:
            raise InvalidValueError("ep_without_experts", "ep", value=ep)
        if spec.num_experts % ep or dp % ep:
            raise InvalidValueError("ep_not_divisor", "ep", value=ep, experts=spec.num_experts, dp=dp)
    if cfg.pp_schedule not in ("1f1b", "gpipe"):
        raise InvalidValueError("bad_choice", "pp_schedule", value=cfg.pp_schedule, allowed="1f1b, gpipe")
    off, shard = setup.offload, setup.shard
    if off != "none":
        if shard in ("none", "ddp"):
            raise InvalidValueError("offload_needs_sharding", "offload", value=off, shard=shard)
        if off in ("parameters", "both") and shard in ("zero1", "zero2"):
            raise InvalidValueError("offload_params_needs_zero3", "offload", value=off, shard=shard)
        if off == "optimizer" and shard.startswith("fsdp"):
            raise InvalidValueError("fsdp_offload_optimizer", "offload", value=off)
    return dp, tp, pp


def _stage_layers(layers: int, pp: int, stage: int) -> int:
    base, extra = divmod(layers, pp)
    return base + (1 if stage < extra else 0)


def _sums(
    spec: ModelSpec,
    setup: TrainingSetup,
    cfg: ShardConfig,
    tensors: list[Tensor],
    dt: Any,
    dp: int,
    stage: int,
    shard_group: int,
) -> _Sums:
    tp, pp, ep = setup.tp, setup.pp, setup.ep
    layers = spec.num_layers
    roles = {lin.name: lin.role for lin in spec.layer_linears}
    copies = {lin.name: lin.copies for lin in spec.layer_linears}
    stage_layers = _stage_layers(layers, pp, stage)
    first, last = stage == 0, stage == pp - 1
    s = _Sums()
    expert_group = max(shard_group // ep, 1) if ep > 1 else shard_group
    for t in tensors:
        name = t.name
        base = name.split(".lora_")[0].removesuffix(".bias")
        is_layer = name not in _NON_LAYER
        role = roles.get(base, "attn")
        # ---- tensor parallel ------------------------------------------------------------------
        if tp == 1 or t.kind == "norm" or name in ("position_embeddings", "prompt_embeddings", "final_norm"):
            share = 1.0
        elif name in ("embed_tokens", "lm_head"):
            share = 1 / tp if cfg.vocab_parallel else 1.0
        elif role == "router":
            share = 1.0
        elif base in ("k_proj", "v_proj") and spec.num_kv_heads < tp:
            share = 1 / spec.num_kv_heads  # each rank keeps (a replica of) one KV head
        else:
            share = 1 / tp
        # ---- expert parallel ------------------------------------------------------------------
        group = shard_group
        if role == "expert":
            share /= ep
            group = expert_group
        # ---- pipeline stage -------------------------------------------------------------------
        if is_layer:
            share *= stage_layers / layers
        elif name in ("embed_tokens", "position_embeddings", "prompt_embeddings"):
            on = first or (name == "embed_tokens" and spec.tie_word_embeddings and last)
            share *= 1.0 if on else 0.0
        else:  # final_norm, lm_head
            share *= 1.0 if last else 0.0
        if share == 0:
            continue
        numel = t.total * share
        per_tensor = t.numel * share / (stage_layers / layers) if is_layer else t.numel * share
        if t.kind == "quantized":
            qb = quantized_bytes(t.numel, setup.double_quant) * t.count * share
            s.q += qb
            s.q_sh += qb / group
            if is_layer:
                s.layer_q += qb / stage_layers
            s.largest_module = max(s.largest_module, per_tensor)
            continue
        b = stored_bytes(t, setup, dt)
        s.w += numel * b
        s.w_sh += numel * b / group
        s.n += numel
        s.n_sh += numel / group
        if t.trainable:
            s.t += numel * b
            s.t_sh += numel * b / group
            s.nt += numel
            s.nt_sh += numel / group
        if t.numel * share < cfg.param_persistence_threshold:
            s.persistent_n += numel
        if is_layer:
            s.layer_n += numel / stage_layers
            s.layer_w += numel * b / stage_layers
            if t.trainable:
                s.layer_nt += numel / stage_layers
        else:
            s.root_n += numel
            s.root_w += numel * b
        # a module's parameters: weight (+ its experts, stored as one 3-D parameter)
        mod = per_tensor * (copies.get(base, 1) if t.count == layers * copies.get(base, 1) else 1)
        s.largest_module = max(s.largest_module, mod if role == "expert" else per_tensor)
    return s


# =============================================================================================
# the per-GPU parts
# =============================================================================================


def shard_parts(
    parts: StepParts, spec: ModelSpec, setup: TrainingSetup, config: ShardConfig | None = None
) -> tuple[StepParts, dict[str, Any]]:
    """Per-GPU step parts for a multi-GPU (or offloaded) setup, and what explains them.

    Returns the parts of the pipeline stage whose peak is highest, and ``info`` with
    ``host_ram_bytes_per_node``, ``per_gpu`` figures, ``notes`` (codes) and ``steps``.
    """
    cfg = config or DEFAULT_CONFIG
    dp, _tp, pp = _layout(spec, setup, cfg)
    shard = setup.shard
    notes: list[str] = []
    if shard == "none" and dp > 1:
        shard = "ddp"
        notes.append("none_means_ddp")
    if shard == "fsdp-hybrid":
        shard_group = min(setup.gpus_per_node, dp)
    elif shard in ("zero1", "zero2", "zero3", "fsdp"):
        shard_group = dp
    else:
        shard_group = 1
    dt = dtypes_for(setup)
    tensors = parameter_tensors(spec, setup)
    full = _sums(spec, setup.with_(tp=1, pp=1, ep=1), cfg, tensors, dt, 1, 0, 1)

    best: tuple[int, StepParts, dict[str, Any]] | None = None
    stages = sorted({0, pp - 1})
    per_stage: list[dict[str, Any]] = []
    for stage in stages:
        s = _sums(spec, setup, cfg, tensors, dt, dp, stage, shard_group)
        new, info = _gpu_parts(parts, spec, setup, cfg, s, full, dt, dp, shard, shard_group, stage)
        peak = max(m.total for m in timeline(new))
        per_stage.append({"stage": stage, "peak_bytes": peak})
        if best is None or peak > best[0]:
            best = (peak, new, info)
    assert best is not None
    _, new, info = best
    info["notes"] = notes + info["notes"]
    if pp > 1:
        info["pipeline_stages"] = per_stage
    return new, info


def _gpu_parts(
    parts: StepParts,
    spec: ModelSpec,
    setup: TrainingSetup,
    cfg: ShardConfig,
    s: _Sums,
    full: _Sums,
    dt: Any,
    dp: int,
    shard: str,
    g: int,
    stage: int,
) -> tuple[StepParts, dict[str, Any]]:
    tp, pp, ep = setup.tp, setup.pp, setup.ep
    amp = dt.weight_copies
    off_opt = setup.offload in ("optimizer", "both")
    off_par = setup.offload in ("parameters", "both")
    # ---- scale factors: cabe.analytic's exact (allocator-rounded) totals per stored byte -------
    rw = parts.weights / (full.w + full.q) if (full.w + full.q) else 0.0
    ro = parts.optimizer / full.t if full.t else 0.0
    rg = parts.grads / full.t if full.t else 0.0
    rtmp = parts.optimizer_temporaries / full.t if full.t else 0.0
    notes: list[str] = []
    last = stage == pp - 1
    stage_layers = _stage_layers(spec.num_layers, pp, stage)

    # ---- model-parallel (TP/PP/EP) sizes on this GPU, not yet data-parallel sharded ------------
    W = (s.w + s.q) * rw  # weights as cabe stores them (fp32 with AMP)
    G = s.t * rg
    O = s.t * ro  # noqa: E741  (renamed in the parallel/ rewrite)
    TMP = s.t * rtmp
    # 16-bit copies: DeepSpeed and FSDP mixed precision run the module in 16-bit
    half_w = 2 * s.n if amp else s.w  # the non-quantized weights in 16-bit
    comps: dict[str, dict[str, float]] = {"forward": {}, "backward": {}, "optimizer": {}}

    def everywhere(name: str, nbytes: float) -> None:
        if nbytes > 0:
            for d in comps.values():
                d[name] = d.get(name, 0) + nbytes

    host = 0.0  # host RAM per GPU process
    keep_copies = True
    weights = W
    optimizer = O
    grads = G
    temps = TMP

    if shard == "ddp":
        if not cfg.gradient_as_bucket_view and G:
            everywhere("ddp_buckets", G)
            notes.append("ddp_bucket_copy")
    elif shard in ("zero1", "zero2", "zero3"):
        stage_n = int(shard[-1])
        keep_copies = False  # the module itself is 16-bit; no autocast weight cache
        w16 = half_w * rw + s.q * rw
        w16_sh = (2 * s.n_sh if amp else s.w_sh) * rw + s.q_sh * rw
        g16 = G / 2 if amp else G
        g16_sh = g16 / max(g, 1) if s.t == 0 else g16 * (s.t_sh / s.t)
        master_sh = 4 * s.nt_sh if amp else 0.0
        # step(): a fp32 copy of the gradient partition (stage_1_and_2.py single_grad_partition; stage3.py
        # _prepare_fp32_grad_for_sub_group, one sub_group_size group at a time)
        grad32_sh = 4 * (s.nt_sh if shard != "zero3" else min(s.nt_sh, cfg.sub_group_size)) if amp else 0.0
        O_sh = O * (s.t_sh / s.t) if s.t else 0.0
        TMP_sh = TMP * (s.t_sh / s.t) if s.t else 0.0
        overlap = cfg.overlap_comm if cfg.overlap_comm is not None else stage_n == 3
        ipg = (
            cfg.reduce_bucket_size * 2 * (2 if (overlap and stage_n < 3) else 1)
            if (cfg.contiguous_gradients and s.t)
            else 0
        )
        if stage_n < 3:
            weights = w16
        else:
            # parameters under stage3_param_persistence_threshold (norms, biases) stay whole
            persistent = s.persistent_n * (2 if amp else dt.weight) * (1 - 1 / max(g, 1))
            weights = (0.0 if off_par else w16_sh) + persistent
            # the submodule being run + the prefetch bucket, at most max_live_parameters
            gathered = min(cfg.max_live_parameters, s.largest_module + cfg.prefetch_bucket_size, s.n + 2 * s.q)
            gathered *= 2 if (amp or dt.weight == 2) else dt.weight
            comps["forward"]["gathered_params"] = gathered
            comps["backward"]["gathered_params"] = gathered
            mod_grad = min(s.largest_module, s.nt) * (2 if amp else dt.grad) if s.t else 0
            if mod_grad:
                comps["backward"]["module_grads"] = mod_grad
            if off_par:
                host += w16_sh
        if off_opt:
            optimizer = 0.0
            temps = 0.0
            host += O_sh + master_sh + 4 * s.nt_sh
            grads = 0.0 if stage_n >= 2 else g16  # partitions go to pinned host buffers as reduced
            if stage_n == 1:
                grads = 0.0
            if ipg:
                comps["backward"]["ipg_buckets"] = ipg
            notes.append("offload_optimizer_cpu_adam")
        else:
            optimizer = O_sh
            # DeepSpeed builds FusedAdam for "AdamW" (multi-tensor kernel, no sqrt copy of the moments)
            fused = setup.optimizer == "adamw" and setup.optimizer_impl is None
            temps = 0.0 if fused else TMP_sh
            if fused:
                notes.append("deepspeed_fused_adam")
            everywhere("master_weights", master_sh)
            if stage_n == 1:
                grads = g16
            else:
                grads = g16_sh
            if ipg:
                comps["backward"]["ipg_buckets"] = ipg
            if grad32_sh:
                comps["optimizer"]["fp32_grad_partition"] = grad32_sh
        notes.append("zero_16bit_module" if amp else "zero_pure")
    elif shard in ("fsdp", "fsdp-hybrid"):
        keep_copies = False  # MixedPrecision casts the all-gathered parameters
        unit_b = 2 if amp else (dt.weight if dt.weight else 2)
        layer_g = s.layer_n * unit_b + s.layer_q * rw
        root_g = s.root_n * unit_b
        units = 2 if cfg.fsdp_prefetch else 1
        comps["forward"]["gathered_params"] = units * layer_g + root_g
        comps["backward"]["gathered_params"] = units * layer_g + root_g
        layer_grad = s.layer_nt * unit_b
        if layer_grad:
            comps["backward"]["unsharded_grads"] = layer_grad
        weights = s.w_sh * rw + s.q_sh * rw
        grads = G * (s.t_sh / s.t) if s.t else 0.0
        optimizer = O * (s.t_sh / s.t) if s.t else 0.0
        temps = TMP * (s.t_sh / s.t) if s.t else 0.0
        if off_par:
            host += weights + grads + optimizer
            weights = grads = optimizer = temps = 0.0
            notes.append("fsdp_cpu_offload")
        if shard == "fsdp-hybrid":
            notes.append("hybrid_replicates_across_nodes")

    # ---- activations on this GPU (TP/SP split; pipeline micro-batches in flight) ---------------
    if tp > 1:
        f_act = 1 / tp if cfg.sequence_parallel else TP_REPLICATED_ACT_FRACTION + (1 - TP_REPLICATED_ACT_FRACTION) / tp
        f_ckpt = 1 / tp if cfg.sequence_parallel else 1.0
        f_head = 1 / tp if cfg.vocab_parallel else 1.0
    else:
        f_act = f_ckpt = f_head = 1.0
    micro = setup.grad_accum
    if pp > 1:
        inflight = min(pp - stage, micro) if cfg.pp_schedule == "1f1b" else micro
        inflight = max(inflight, 1)
    else:
        inflight = 1
    saved = parts.saved_layer * (f_ckpt if setup.checkpointing else f_act)
    head_on = last
    layer_frac = stage_layers / spec.num_layers
    grad_layers = min(parts.grad_layers, stage_layers) if parts.grad_layers else 0
    if setup.method == "freeze" and pp > 1:
        # freeze trains the LAST layers: they live on the last stages
        below = spec.num_layers - sum(_stage_layers(spec.num_layers, pp, i) for i in range(stage + 1))
        grad_layers = max(0, min(stage_layers, parts.grad_layers - below))
    grads_total = grads
    g_ratio = grads_total / parts.grads if parts.grads else 0.0
    grads_head = (
        parts.grads_head * g_ratio / (layer_frac if pp > 1 else 1) * (1 if head_on else 0) if parts.grads else 0
    )
    grads_head = min(grads_head, grads_total)
    grads_per_layer = (grads_total - grads_head) / grad_layers if grad_layers else 0
    if pp > 1:
        p2p = 2 * setup.batch * setup.seq * spec.hidden_size * dt.compute
        comps["forward"]["p2p_buffers"] = p2p
        comps["backward"]["p2p_buffers"] = p2p
    if tp > 1 and cfg.sequence_parallel:
        ag = setup.batch * setup.seq * spec.hidden_size * dt.compute
        comps["forward"]["tp_comm"] = ag
        comps["backward"]["tp_comm"] = ag
    if spec.num_experts and ep > 1:
        a2a = 2 * setup.batch * setup.seq * spec.experts_per_token * spec.hidden_size * dt.compute
        comps["forward"]["moe_all_to_all"] = a2a
        comps["backward"]["moe_all_to_all"] = a2a
    layer_copies = parts.copies_layer * (1 / tp if tp > 1 else 1) if keep_copies else 0
    head_copies = parts.copies_head * f_head * (1 if head_on else 0) if keep_copies else 0

    new = replace(
        parts,
        weights=round(weights),
        optimizer=round(optimizer),
        grads=round(grads_total),
        grads_head=round(grads_head),
        grads_per_layer=round(grads_per_layer),
        grad_layers=grad_layers,
        copies_layer=round(layer_copies),
        copies_head=round(head_copies),
        copies_fwd_layers=stage_layers if setup.checkpointing else grad_layers,
        saved_layer=round(saved * inflight),
        recompute_layer=round(parts.recompute_layer * f_act),
        workspace_layer=round(parts.workspace_layer * f_act),
        rotary=round(parts.rotary * inflight) if grad_layers else 0,
        head_saved=round(parts.head_saved * f_head) if head_on else 0,
        head_forward_extra=round(parts.head_forward_extra * f_head) if head_on else 0,
        head_backward_extra=round(parts.head_backward_extra * f_head) if head_on else 0,
        optimizer_temporaries=round(temps),
        grads_in_forward=parts.grads_in_forward or (pp > 1 and micro > 1),
        extra_forward={**parts.extra_forward, **{k: round(v) for k, v in comps["forward"].items() if v}},
        extra_backward={**parts.extra_backward, **{k: round(v) for k, v in comps["backward"].items() if v}},
        extra_optimizer={**parts.extra_optimizer, **{k: round(v) for k, v in comps["optimizer"].items() if v}},
    )
    if stage == 0 and pp > 1:
        # stage 0 has no loss head: nothing of the head is live there
        pass

    nodes = math.ceil(setup.gpus / setup.gpus_per_node)
    per_node = min(setup.gpus, setup.gpus_per_node)
    host_per_gpu = round(host)
    # Loading: every process materialises the model on the host before it is partitioned or moved
    # (DeepSpeed's "zero_init=False" term: 4 B/param × GPUs per node); zero.Init / FSDP meta-device
    # init avoid it. Reported beside the steady state.
    load_peak = per_node * parts.weights * (s.w + s.q) / (full.w + full.q) if (full.w + full.q) else 0
    per_gpu = {
        "weights_bytes": new.weights,
        "gradients_bytes": new.grads,
        "optimizer_bytes": new.optimizer,
        "master_weights_bytes": round(comps["optimizer"].get("master_weights", 0)),
        "model_states_bytes": new.weights
        + new.grads
        + new.optimizer
        + round(comps["optimizer"].get("master_weights", 0)),
        "communication_bytes": {
            k: v
            for k, v in {**new.extra_forward, **new.extra_backward, **new.extra_optimizer}.items()
            if k in ("ddp_buckets", "ipg_buckets", "p2p_buffers", "tp_comm", "moe_all_to_all")
        },
        "gathered_params_bytes": max(
            new.extra_forward.get("gathered_params", 0), new.extra_backward.get("gathered_params", 0)
        ),
        "host_bytes": host_per_gpu,
    }
    steps = _steps(
        spec,
        setup,
        shard,
        dp,
        g,
        tp,
        pp,
        ep,
        stage,
        stage_layers,
        inflight,
        per_gpu,
        host_per_gpu,
        per_node,
        cfg,
        amp,
        s,
    )
    info: dict[str, Any] = {
        "strategy": shard,
        "world_size": setup.gpus,
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "ep": ep,
        "shard_group": g,
        "nodes": nodes,
        "gpus_per_node": setup.gpus_per_node,
        "offload": setup.offload,
        "stage": stage,
        "stage_layers": stage_layers,
        "micro_batches_in_flight": inflight,
        "per_gpu": per_gpu,
        "host_ram_bytes_per_node": host_per_gpu * per_node,
        "host_ram_load_peak_bytes_per_node": round(load_peak),
        "config": asdict(cfg),
        "notes": notes,
        "steps": steps,
    }
    return new, info


def _steps(
    spec, setup, shard, dp, g, tp, pp, ep, stage, stage_layers, inflight, per_gpu, host, per_node, cfg, amp, s
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(key: str, formula: str, nbytes: int | None, **params: Any) -> None:
        out.append({"key": key, "formula": formula, "bytes": nbytes, "params": params})

    add(
        "shard.layout",
        "{gpus} = dp {dp} × tp {tp} × pp {pp}; ep {ep}",
        None,
        gpus=setup.gpus,
        dp=dp,
        tp=tp,
        pp=pp,
        ep=ep,
    )
    if shard in ("zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid"):
        add(
            "shard." + shard,
            "{states} B / {g}",
            per_gpu["model_states_bytes"],
            states=per_gpu["model_states_bytes"],
            g=g,
        )
    else:
        add("shard." + shard, "{states} B", per_gpu["model_states_bytes"], states=per_gpu["model_states_bytes"])
    if pp > 1:
        add(
            "shard.pipeline",
            "{layers} layers × {inflight} micro-batches",
            None,
            layers=stage_layers,
            inflight=inflight,
            stage=stage,
        )
    if tp > 1:
        add("shard.tensor_parallel", "1/{tp}", None, tp=tp, sp=int(cfg.sequence_parallel))
    for name, nbytes in per_gpu["communication_bytes"].items():
        add("shard.buffer." + name, "{bytes} B = {gib} GiB", nbytes, bytes=nbytes, gib=nbytes / GiB)
    if per_gpu["gathered_params_bytes"]:
        add(
            "shard.gathered",
            "{bytes} B = {gib} GiB",
            per_gpu["gathered_params_bytes"],
            bytes=per_gpu["gathered_params_bytes"],
            gib=per_gpu["gathered_params_bytes"] / GiB,
        )
    if host:
        add(
            "shard.host",
            "{per_gpu} B × {gpus} = {bytes} B = {gb} GB",
            host * per_node,
            per_gpu=host,
            gpus=per_node,
            bytes=host * per_node,
            gb=host * per_node / GB,
        )
    return out
