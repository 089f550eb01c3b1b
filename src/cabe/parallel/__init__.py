"""Several GPUs: what each GPU holds under DDP, DeepSpeed ZeRO-1/2/3, FSDP, offload, TP, PP and EP.

Rooms: :mod:`~cabe.parallel.config` (the frameworks' knobs), :mod:`~cabe.parallel.layout` (dp × tp ×
pp, ep, the shard group, the pipeline stage), :mod:`~cabe.parallel.shares` (each parameter tensor's
per-GPU share, summed into :class:`~cabe.parallel.shares.Holdings`), one module per data-parallel
strategy (:mod:`~cabe.parallel.ddp`, :mod:`~cabe.parallel.zero`, :mod:`~cabe.parallel.fsdp`, each a
function from a :class:`~cabe.parallel.strategy.Context` to :class:`~cabe.parallel.strategy.States`),
:mod:`~cabe.parallel.activations` (TP / SP / PP / EP on saved tensors and buffers),
:mod:`~cabe.parallel.explain` (the per-GPU figures and :class:`~cabe.report.Step` lines) and
:mod:`~cabe.parallel.plan` (:func:`shard_parts`, which joins them).

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

from cabe.parallel.config import DEFAULT_CONFIG, ShardConfig
from cabe.parallel.plan import shard_parts
from cabe.parallel.zero import zero_paper_model_states

__all__ = ["DEFAULT_CONFIG", "ShardConfig", "shard_parts", "zero_paper_model_states"]
