"""Model parallelism on what a step saves and sends: Megatron TP / SP splits of the saved tensors,
pipeline micro-batches in flight, and the buffers TP, PP and EP add.

Korthikanti et al. 2022 ("Reducing Activation Recomputation"): per layer sbh(10 + 24/t + 5as/(ht))
without sequence parallelism, sbh(34/t + 5as/(ht)) with it — 10/34 of a layer's saved bytes (norm
inputs, dropout masks, the residual) are replicated across TP ranks unless SP splits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cabe.architecture import ModelSpec
from cabe.parallel.config import ShardConfig
from cabe.parallel.layout import Layout
from cabe.training import TrainingSetup

#: Korthikanti et al.: of the 34·sbh bytes a layer saves (16-bit), 10·sbh are not split by TP without SP.
TP_REPLICATED_ACT_FRACTION = 10 / 34


@dataclass(frozen=True)
class TensorParallelFactors:
    """What fraction of one GPU's single-GPU figure remains under TP: saved layer tensors
    (``saved``), the checkpointed layer inputs (``checkpointed``), the loss head (``head``)."""

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


def micro_batches_in_flight(lay: Layout, grad_accum: int, cfg: ShardConfig) -> int:
    """Pipeline: 1F1B keeps at most ``pp - stage`` micro-batches' activations; GPipe all of them."""
    if lay.pp == 1:
        return 1
    inflight = min(lay.pp - lay.stage, grad_accum) if cfg.pp_schedule == "1f1b" else grad_accum
    return max(inflight, 1)


def communication_buffers(
    spec: ModelSpec, setup: TrainingSetup, lay: Layout, cfg: ShardConfig, dt: Any
) -> dict[str, float]:
    """Bytes live in forward and backward: pipeline send / receive buffers, SP's all-gathered
    sequence, MoE all-to-all. Sequences are ``tokens_per_sequence`` long (prompt tuning's virtual
    tokens included), as in the single-GPU estimate."""
    tokens = setup.batch * setup.tokens_per_sequence
    out: dict[str, float] = {}
    if lay.pp > 1:
        out["p2p_buffers"] = 2 * tokens * spec.hidden_size * dt.compute
    if lay.tp > 1 and setup.sequence_parallel:
        out["tp_comm"] = tokens * spec.hidden_size * dt.compute
    if spec.num_experts and lay.ep > 1:
        out["moe_all_to_all"] = 2 * tokens * spec.experts_per_token * spec.hidden_size * dt.compute
    return out
