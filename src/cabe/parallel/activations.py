"""Model parallelism on what a step saves and sends: TP / SP splits of the saved tensors, pipeline
micro-batches in flight, and the buffers PP and EP add.

Korthikanti et al. 2022 ("Reducing Activation Recomputation"): per layer sbh(10 + 24/t + 5as/(ht))
without sequence parallelism — 10/34 of a GPT-3 layer's 16-bit saved bytes (norm inputs, dropout masks, the
projections' inputs) are replicated across TP ranks. The plan follows the saved tensors one by one instead
(:func:`tensor_parallel_saved`: a Llama layer's fp32 norm tensors, an fp32 residual stream); the fraction is left
for a layer's backward transients. With sequence parallelism their sbh·34/t holds for Megatron's linears only;
torch's styles keep the projections' all-gathered inputs whole (:func:`sequence_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cabe.architecture import ModelSpec
from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.training import TrainingSetup

#: Korthikanti et al.: of the 34·sbh bytes a layer saves (16-bit), 10·sbh are not split by TP without SP (what the
#: plan applies to a layer's backward transients; its saved tensors go one by one: tensor_parallel_saved)
TP_REPLICATED_ACT_FRACTION = 10 / 34


@dataclass(frozen=True)
class TensorParallelFactors:
    """What fraction of one GPU's single-GPU figure remains under TP: a layer's transients (``saved``; its saved
    tensors: :func:`tensor_parallel_saved`), the checkpointed layer inputs (``checkpointed``), the logits (``head``)."""

    saved: float = 1.0
    checkpointed: float = 1.0
    head: float = 1.0


def tensor_parallel(setup: TrainingSetup) -> TensorParallelFactors:
    tp = setup.tp
    if tp == 1:
        return TensorParallelFactors()
    sp = setup.sequence_parallel
    return TensorParallelFactors(
        saved=1 / tp if sp else TP_REPLICATED_ACT_FRACTION + (1 - TP_REPLICATED_ACT_FRACTION) / tp,
        checkpointed=1 / tp if sp else 1.0,
        head=1 / tp if setup.loss_parallel else 1.0,
    )


def sequence_parallel(saved: float, gathered: float, tp: int) -> float:
    """One GPU's share of saved bytes of which ``gathered`` are what the column-parallel projections save of their
    all-gathered input, under sequence parallelism as torch's styles run it (torch 2.13
    distributed/tensor/parallel/style.py, torchtitan's ``parallelize_llama``; traced by
    cabe.trace.sequence_parallel).

    ``SequenceParallel`` runs each norm on the GPU's s/t positions and the residual stream stays split, so what the
    norms save, the layer's checkpointed input and the o / down projections' outputs shrink by t; attention and the
    MLP's inner tensors are split by heads and features as under TP. But ``PrepareModuleInput`` all-gathers the
    norm's output (``Shard(1)`` to ``Replicate()``, style.py ``_prepare_input_arg``) before q / k / v and gate /
    up, and their matmuls save that whole input (``ColwiseParallel`` hands it on as it is: ``_prepare_input_fn``);
    so does the lm_head (``ColwiseParallel(input_layouts=Shard(1))``). Megatron's sequence-parallel linear saves the
    shard and all-gathers it again in backward (megatron/core/tensor_parallel/layers.py,
    ``LinearWithGradAccumulationAndAsyncCommunication``), which Korthikanti et al.'s sbh·34/t assumes; torch's do
    not: those stay whole."""
    return (saved - gathered) / tp + gathered


def tensor_parallel_saved(saved: float, whole: float, tp: int) -> float:
    """One GPU's share of saved bytes of which ``whole`` stay whole on every GPU, under tensor parallelism without
    sequence parallelism as transformers 5.25 applies its TP plan (distributed/tensor_parallel.py; traced by
    cabe.trace.distributed on the fake group).

    Every module the plan does not name runs on its replicated input: the norms on the residual stream save its
    whole width and length (their fp32 inputs, statistics and outputs), as do dropout masks on it and a checkpointed
    layer's input (LayerActivations.stream_per_token). ``ColwiseParallel`` (q / k / v, gate / up) takes its input
    ``Replicate()`` (``transform_inputs_pre_forward``) and its matmul saves that whole tensor, or autocast's whole
    16-bit cast of it (LayerActivations.gathered_input_per_token). What the column-parallel projections make is this
    GPU's heads and features (``Shard(-1)``): attention per head, the MLP's intermediate tensors and what the
    row-parallel projections save of them (their input, ``Shard(-1)``) are split by t. ``RowwiseParallel``'s output
    is all-reduced whole (``Partial()`` to ``Replicate()``) but nothing saves it as it is: it joins the residual
    stream, whose norm saves its own tensors (whole, counted above). Korthikanti et al.'s 10/34 replicated is this
    split for GPT-3's 16-bit tensors (two LayerNorm inputs, two projections' inputs, two dropout masks); a Llama
    layer's fp32 norm tensors and fp32 residual stream (fp32 weights under autocast) replicate more."""
    return whole + (saved - whole) / tp


def micro_batches_in_flight(lay: Layout, grad_accum: int, cfg: ShardConfig) -> int:
    """Pipeline: 1F1B keeps at most ``pp - stage`` micro-batches' activations; GPipe all of them."""
    if lay.pp == 1:
        return 1
    inflight = min(lay.pp - lay.stage, grad_accum) if cfg.pp_schedule == "1f1b" else grad_accum
    return max(inflight, 1)


def communication_buffers(
    spec: ModelSpec, setup: TrainingSetup, lay: Layout, cfg: ShardConfig, dt: Any
) -> dict[str, float]:
    """Bytes live in forward and backward: pipeline send / receive buffers (EP's exchange is a transient of each MoE
    layer: :func:`expert_parallel`). Sequences are
    ``tokens_per_sequence`` long (prompt tuning's virtual tokens included), as in the single-GPU estimate.

    Sequence parallelism adds no buffer of its own here: torch's all-gathered sequence is the input the projections
    save (:func:`sequence_parallel`), counted with the saved tensors; it holds no persistent all-gather buffer
    (Megatron's ``get_global_memory_buffer`` is not in torch's styles). Traced: with a whole b·s·h buffer beside the
    saved tensors the estimate was b·s·h over rank 0 at the head's backward, to the byte (tiny Llama, t = 2)."""
    tokens = setup.batch * setup.tokens_per_sequence / lay.cp  # (context parallelism: the GPU's s / cp positions)
    out: dict[str, float] = {}
    if lay.pp > 1:
        out["p2p_buffers"] = 2 * tokens * spec.hidden_size * dt.compute
    return out


#: rows of T·k x h (the layer's token-expert pairs, compute dtype) that transformers' AllToAllEP holds beyond what the
#: layer saves, at its combine's weighting in forward and at the experts' first backward node (:func:`expert_parallel`)
EP_FORWARD_ROWS = 4
EP_BACKWARD_ROWS = 1


def expert_parallel(spec: ModelSpec, setup: TrainingSetup, lay: Layout, dt: Any) -> tuple[float, float]:
    """Bytes of the EP exchange beyond a layer's saved tensors, (forward, backward), under balanced routing: rank 0
    receives the ``T·k`` token-expert pairs it sends (traced: cabe.trace.expert_parallel).

    transformers 5.25 ``AllToAllEP`` (distributed/expert_parallel.py) in training: ``_dispatch_tokens`` gathers the
    ``T·k`` rows (``hidden_states[order // k]``) and all-to-alls them; the experts run top-1 on the received rows with
    unit weights; ``_combine_tokens`` all-to-alls their output back, scatters it into ``token_outputs``
    (``empty_like``) and weights it: ``(token_outputs * top_k_weights.unsqueeze(-1)).sum(dim=1)``. At that product
    four ``T·k x h`` tensors live beside what the layer saves: the received rows (``tokens``, a local of
    ``AllToAllEP.__call__`` until it returns), the experts' output (``expert_output``, likewise), the all-to-all's
    result (``recv_out``, a local of ``_combine_tokens``) and the product. ``token_outputs`` is saved by the product
    for the routing weights' gradient, where one GPU's experts save their own weighted output for it
    (integrations/moe.py ``weighted_out = proj_out * sample_weights``; the unit weights need no gradient): the same
    bytes, counted with the saved tensors. In backward the reverse all-to-all makes the experts' output gradient
    (``T·k x h``) before their first node runs. Nothing persists between layers: no phase-wide buffer."""
    if not (spec.num_experts and lay.ep > 1):
        return 0.0, 0.0
    rows = setup.batch * setup.tokens_per_sequence * spec.experts_per_token * spec.hidden_size * dt.compute
    return EP_FORWARD_ROWS * rows, EP_BACKWARD_ROWS * rows
