"""The knobs of the frameworks, with their defaults (sources in :mod:`cabe.parallel`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # ZeRO-3 keeps a submodule gathered when the step uses it again within this many elements
    # (zero/config.py:251, ``stage3_max_reuse_distance``)
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    sub_group_size: int = 1_000_000_000  # ZeRO-3 steps the optimizer one sub-group at a time
    # FSDP
    fsdp_prefetch: bool = True  # BACKWARD_PRE (FSDP1 default) / FSDP2 implicit prefetch
    # Megatron-style model parallelism
    # the input embedding and the lm_head split over the vocabulary (Megatron's VocabParallelEmbedding and
    # ColumnParallelLinear, transformers' ``embedding_rowwise`` / ``colwise_gather_output``); whether the logits stay
    # split is the request's ``loss_parallel``, sequence parallelism its ``sequence_parallel``
    vocab_parallel: bool = True
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
