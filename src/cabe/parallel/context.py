"""Context parallelism: each GPU of a cp group holds seq / cp tokens' activations; attention reaches the others'.

Two implementations (the request's ``cp_impl``):

* torch's ring attention (``allgather`` / ``alltoall``): ``torch.distributed.tensor.experimental.context_parallel``
  shards the inputs, labels and positions over the sequence (torch 2.13 _context_parallel/_attention.py
  ``_context_parallel_buffers``: ``distribute_tensor(..., [Shard(seq_dim)])``), so every tensor a layer saves, the
  rotary tables, the logits and the loss are those of s / cp tokens. SDPA is replaced by the ring
  (``_templated_ring_attention``): each step runs the flash / efficient kernel of the local queries against one
  shard of keys and values and merges the outputs (``_SDPAMerger``), so the kernel saves only the local q, k, v,
  output and log-sum-exp. accelerate applies it the same way (1.16 accelerator.py ``_prepare_cp``,
  ``maybe_context_parallel``), as torchtitan does.
* DeepSpeed-Ulysses (``ulysses``): the sequence is split the same way (deepspeed 0.19.8
  runtime/sequence_parallel/ulysses_sp.py ``UlyssesSPDataLoaderAdapter``); around attention an all-to-all turns the
  s / cp positions × all heads into all positions × heads / cp (``_combine_local_sequences``) and back
  (``_partition_global_sequence``): the kernel holds the same bytes as the local tokens' (eager's s × s scores
  too: heads / cp of them), except keys and values replicated when cp exceeds the key / value heads
  (``kv_replication_factor``).

So the per-token figures of the single-GPU estimate scale by 1 / cp (:func:`share`), and attention's backward
holds the implementation's buffers beside the layer's (:func:`attention_buffers`).
"""

from __future__ import annotations

from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

RING = ("allgather", "alltoall")
SHARDED_ZERO = ("zero1", "zero2", "zero3")
#: the strategies each implementation runs under: torch's CP under FSDP2 (accelerate 1.16 state.py refuses
#: ``cp_size > 1`` without an FSDP2 plugin; torchtitan shards over the dp_shard × cp mesh), Ulysses inside
#: DeepSpeed's engine (accelerate 1.16 accelerator.py ``_prepare_deepspeed``: ``sp_backend == "deepspeed"``)
STRATEGIES = {"allgather": ("fsdp", "fsdp-hybrid"), "alltoall": ("fsdp", "fsdp-hybrid"), "ulysses": SHARDED_ZERO}
#: ring attention's accumulators (torch 2.13 _attention.py ``_cp_options.convert_to_f32 = True``)
F32 = 4


def validate(spec: ModelSpec, setup: TrainingSetup) -> None:
    """The refusals of the implementation's own code, each naming the field."""
    cp, impl = setup.cp, setup.cp_impl
    if cp == 1:
        return
    seq = setup.tokens_per_sequence
    if seq % cp:
        # the ring reshapes the neighbour's keys and values to the local ones' shape (_attention.py
        # ``_templated_ring_attention``: ``next_kv[: key.numel()].reshape(key.shape)``); Ulysses' data loader refuses
        # "batch's seqlen isn't divisible by sp-size" (ulysses_sp.py ``UlyssesSPDataLoaderAdapter.refill``)
        raise InvalidValueError("cp_seq_not_divisible", "cp", value=cp, seq=seq, impl=impl)
    per = min(setup.gpus_per_node, setup.gpus)
    if setup.shard == "fsdp-hybrid" and per % (cp * setup.tp):
        # HSDP shards within a node over dp_shard × cp (accelerate 1.16 parallelism_config.py: the mesh is
        # (dp_replicate, dp_shard, cp, tp), FSDP over (dp_replicate, dp_shard_cp)): a node holds whole cp × tp groups
        raise InvalidValueError("cp_node", "cp", value=cp, per_node=per, tp=setup.tp)
    if setup.shard not in STRATEGIES[impl]:
        code = "cp_ulysses_needs_deepspeed" if impl == "ulysses" else "cp_needs_fsdp"
        raise InvalidValueError(code, "cp", value=cp, shard=setup.shard)
    if impl == "ulysses":
        kv = spec.num_kv_heads or spec.num_heads
        # ulysses_sp.py ``UlyssesSPAttentionHF.__init__``: "Attention head count ... is not divisible by SP size",
        # "KV attention head count ... is not divisible by SP size ... or vice versa"
        if spec.num_heads % cp or (kv % cp and cp % kv):
            raise InvalidValueError("cp_heads_not_divisible", "cp", value=cp, heads=spec.num_heads, kv_heads=kv)
    elif setup.attention == "eager":
        # _attention.py ``_sdpa_handler`` serves the flash / efficient / cuDNN SDPA ops only; eager never calls SDPA
        raise InvalidValueError("cp_eager_attention", "cp", value=cp)


def share(setup: TrainingSetup) -> float:
    """One GPU's share of the tokens' tensors: 1 / cp."""
    return 1 / setup.cp


def attention_buffers(spec: ModelSpec, setup: TrainingSetup, tp: int, compute: int) -> int:
    """Bytes attention's backward holds beside the single-GPU kernel's (at s / cp tokens) on one GPU.

    ``q`` / ``kv``: the local queries' and one of keys / values' elements (b · s/cp · heads/tp · head_dim).

    Ring (torch 2.13 _attention.py ``_templated_ring_attention_backward``): the gradients of q, k and v accumulate in
    fp32 (``zeros_like(..., dtype=accum_dtype)``); the keys' and values' gradients travel round the ring by
    all-to-all (``dkv_rotater``, always ``ALL_TO_ALL``: the concatenated fp32 buffer sent and the one received); the
    keys and values themselves by the request's rotation: ``allgather`` gathers all cp shards once
    (``_AllGatherRotater``: ``all_gather_single``, held through the loop), ``alltoall`` passes one shard at a time
    (``_AllToAllRotater``: the concatenation sent and the permuted one received).

    Ulysses (ulysses_sp.py ``_combine_local_sequences`` / ``_partition_global_sequence``): each all-to-all's
    contiguous input and its output, for q, k, v and the context, in the compute dtype; keys and values repeated
    ``cp / kv_heads`` times when cp exceeds the key / value heads (``repeat_interleave``)."""
    cp = setup.cp
    if cp == 1:
        return 0
    tokens = setup.batch * setup.tokens_per_sequence / cp
    kv_heads = spec.num_kv_heads or spec.num_heads
    q = tokens * spec.num_heads / tp * spec.head_dim
    kv = tokens * kv_heads / tp * spec.head_dim
    if setup.cp_impl == "ulysses":
        kv = kv * max(1, cp // kv_heads)
        return round(2 * (2 * q + 2 * kv) * compute)
    accumulators = F32 * (q + 2 * kv)
    dkv = 2 * F32 * 2 * kv
    rotation = cp * 2 * kv * compute if setup.cp_impl == "allgather" else 2 * 2 * kv * compute
    return round(accumulators + dkv + rotation)


def info(setup: TrainingSetup) -> dict[str, Any]:
    """What the plan reports of context parallelism."""
    return {"cp": setup.cp, "cp_impl": setup.cp_impl} if setup.cp > 1 else {}
