"""Activation memory: the tensors autograd saves for backward, per token, per decoder layer.

Each :class:`Term` is one saved tensor (or a group of equal ones), with its size in bytes per
token and its formula in the config's symbols: h = hidden size, q = heads × head_dim,
kv = kv heads × head_dim, f = intermediate (MLP) size, nh = attention heads, s = sequence,
V = vocabulary, E = experts, k = experts per token, r = LoRA rank, a = bytes of the compute
dtype (2 for bf16/fp16, 4 for fp32), ρ = bytes of the residual stream (4 under autocast); in a Mamba-2 layer
(:mod:`cabe.ssm`) d_inner = its heads × head_dim, H = its heads, N = its state size, g = its groups.

The rooms, one per kind of layer part (each names its source and the tests that prove it at its top):

* :mod:`~cabe.activations.terms` — the data: :class:`Term`, :class:`LayerActivations`, :class:`HeadActivations`;
* :mod:`~cabe.activations.state` — one layer being counted (:class:`LayerState`) over the request's facts
  (:mod:`cabe.facts`), and the bottom-layer rule (``live``);
* :mod:`~cabe.activations.compose` — the composer: :func:`layer_activations` picks the rooms for one layer;
* :mod:`~cabe.activations.norms` — RMSNorm and the residual; :mod:`~cabe.activations.adapters` — LoRA, DoRA,
  dropout;
* :mod:`~cabe.activations.attention` — the kernels (eager, SDPA flash / efficient / math, sinks);
  :mod:`~cabe.activations.attention_block` — the block around them (norms, projections, output gate, LayerNorm
  blocks);
* :mod:`~cabe.activations.latent` — latent attention and V3.2's indexer; :mod:`~cabe.activations.compressed` —
  DeepSeek-V4's compressed attention and hyper-connections; :mod:`~cabe.activations.deltanet` — gated DeltaNet;
  :mod:`~cabe.activations.mamba` — Mamba-2;
* :mod:`~cabe.activations.mlp` — gated and plain MLPs; :mod:`~cabe.activations.moe` — routers, expert dispatch,
  shared experts, LoRA on expert parameters;
* :mod:`~cabe.activations.head` — the final norm, lm_head and loss kernels.
"""

from cabe.activations.adapters import dora_stray_parameter
from cabe.activations.compose import korthikanti, layer_activations
from cabe.activations.head import (
    embedding_lora_saved,
    head_activations,
    lm_head_lora_saved,
    lm_head_saved_input,
    loss_chunk_positions,
    loss_chunk_tokens,
)
from cabe.activations.norms import checkpointed_layer_bytes_per_token
from cabe.activations.terms import HeadActivations, LayerActivations, Term

__all__ = [
    "HeadActivations",
    "LayerActivations",
    "Term",
    "checkpointed_layer_bytes_per_token",
    "dora_stray_parameter",
    "embedding_lora_saved",
    "head_activations",
    "korthikanti",
    "layer_activations",
    "lm_head_lora_saved",
    "lm_head_saved_input",
    "loss_chunk_positions",
    "loss_chunk_tokens",
]
