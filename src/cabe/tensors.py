"""A group of identical parameter tensors (:class:`Tensor`): the unit the model states are counted in — what
:mod:`cabe.method` lists for a model and a method, what :mod:`cabe.optimizer` keeps state for, what the estimate
stores, shards and offloads. Plain data, below both; proved through tests/test_optimizer.py and tests/test_estimate.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    """A group of identical parameter tensors: ``count`` tensors of ``numel`` elements each."""

    name: str
    numel: int
    count: int
    trainable: bool
    kind: str  # "base" | "norm" | "embedding" | "lm_head" | "adapter" | "quantized" | "prompt"
    rows: int = 0  # for 2-D tensors (Adafactor factors rows + cols)
    cols: int = 0
    role: str = ""  # a layer linear's (and its adapters'): attn | mlp | router | expert
    # the nn.Linear module's path in the layer as transformers names it (``self_attn.q_proj``), or "" when the
    # tensor is not an nn.Linear weight (Conv1D, bare MoE parameters, norms): what GaLore's targets match
    path: str = ""
    #: a fused MoE expert stack (transformers 5's 3-D ``gate_up_proj`` / ``down_proj``): this many of the ``count``
    #: tensors of ``numel`` are one parameter, which is what an optimizer's step sees (its temporaries)
    stack: int = 1

    @property
    def total(self) -> int:
        return self.numel * self.count

    @property
    def param_numel(self) -> int:
        """Elements of one parameter as PyTorch holds it (a whole expert stack)."""
        return self.numel * self.stack

    @property
    def params(self) -> int:
        """How many parameters as PyTorch holds them."""
        return self.count // self.stack
