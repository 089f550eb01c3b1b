"""Optimizer state and optimizer-step temporaries, per trainable parameter tensor.

State lives in the parameter's dtype for torch optimizers (``zeros_like(p)``): fp32 params keep
fp32 moments, pure-bf16 params keep bf16 moments. bitsandbytes' 32-bit optimizers (Lion, paged AdamW)
keep fp32 state whatever the parameter dtype. bitsandbytes 8-bit optimizers keep uint8
moments with an fp32 absmax per block of 256 for tensors of at least 4096 elements (smaller
tensors get 32-bit state). Paged optimizers allocate their state in CUDA unified memory
(cudaMallocManaged): it is not counted by PyTorch's allocator and can be evicted to host memory,
so cabe reports it beside the peak rather than inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.method import Tensor
from cabe.training import TrainingSetup

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer8bit min_8bit_size
BNB_BLOCK = 256  # blockwise quantization block for 8-bit optimizer state
BNB_PAGED_MIN = 100_000  # Optimizer.get_state_buffer pages only tensors of at least 1e5 elements
ALLOC_ROUND = 512  # CUDA caching allocator rounds every block to 512 B


def round_alloc(nbytes: int) -> int:
    """Round a tensor's size up as the CUDA caching allocator does (multiples of 512 B)."""
    return -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND if nbytes > 0 else 0


@dataclass(frozen=True)
class OptimizerMemory:
    state_bytes: int  # on-GPU optimizer state counted by the allocator
    paged_bytes: int  # unified-memory state (paged optimizers), not counted by the allocator
    temp_bytes: int  # extra memory live during optimizer.step()
    moments: int  # state tensors per parameter (for explanations)
    state_bytes_per_param: float  # for explanations


def optimizer_memory(tensors: list[Tensor], setup: TrainingSetup, param_bytes_of: dict[str, int]) -> OptimizerMemory:
    """State and step temporaries for the trainable tensors.

    ``param_bytes_of`` maps a tensor ``kind`` to its stored bytes per element.
    """
    opt = setup.optimizer
    impl = setup.resolved_optimizer_impl
    trainable = [t for t in tensors if t.trainable]
    state = 0
    paged = 0
    temp = 0
    moments = {
        "adamw": 2,
        "paged-adamw": 2,
        "adamw-8bit": 2,
        "paged-adamw-8bit": 2,
        "sgd": 0,
        "sgd-momentum": 1,
        "adafactor": 1,
        "lion": 1,
    }[opt]
    largest = 0
    total_numel = 0
    for t in trainable:
        b = param_bytes_of[t.kind]
        total_numel += t.total
        largest = max(largest, t.numel * b)
        if opt in ("adamw", "paged-adamw"):
            # torch keeps moments in the parameter's dtype; bitsandbytes' 32-bit (paged) optimizers in fp32
            per = 2 * round_alloc(t.numel * (4 if opt == "paged-adamw" else b))
            if opt == "paged-adamw" and t.numel >= BNB_PAGED_MIN:
                paged += per * t.count
            else:
                state += per * t.count
            if impl == "fused" and opt == "adamw":
                state += round_alloc(4) * t.count  # fused keeps a step tensor on the device per param
        elif opt in ("adamw-8bit", "paged-adamw-8bit"):
            if t.numel >= BNB_MIN_8BIT_SIZE:
                blocks = -(-t.numel // BNB_BLOCK)
                per = 2 * round_alloc(t.numel) + 2 * round_alloc(4 * blocks)
            else:
                per = 2 * round_alloc(4 * t.numel)
            if opt == "paged-adamw-8bit" and t.numel >= BNB_PAGED_MIN:
                paged += per * t.count
            else:
                state += per * t.count
        elif opt == "sgd-momentum":
            state += round_alloc(t.numel * b) * t.count
        elif opt == "lion":
            # bitsandbytes' Lion (the Trainer's lion_32bit): one fp32 momentum, whatever the parameter dtype
            state += round_alloc(t.numel * 4) * t.count
        elif opt == "adafactor":
            if t.rows and t.cols:
                state += (round_alloc(t.rows * b) + round_alloc(t.cols * b)) * t.count
            else:
                state += round_alloc(t.numel * b) * t.count
    # ---- temporaries of optimizer.step() ------------------------------------------------------
    if opt == "adamw" and impl == "foreach":
        # torch._foreach_sqrt(exp_avg_sqs) materialises a full copy of the second moments.
        temp = sum(round_alloc(t.numel * param_bytes_of[t.kind]) * t.count for t in trainable)
    elif opt == "adamw" and impl == "for-loop":
        # exp_avg_sq.sqrt() / bias_correction2_sqrt: two transient copies of the largest tensor.
        temp = 2 * round_alloc(largest)
    elif opt == "adafactor" and impl == "foreach":
        # torch.optim.Adafactor's foreach path builds the update for every tensor at once
        temp = sum(round_alloc(t.numel * param_bytes_of[t.kind]) * t.count for t in trainable)
    elif opt == "adafactor":
        temp = 2 * round_alloc(largest)
    per_param = (state + paged) / total_numel if total_numel else 0.0
    return OptimizerMemory(state, paged, temp, moments, per_param)
