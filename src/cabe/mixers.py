"""The shapes of the token mixers other than plain softmax attention over q, k, v: multi-head latent attention
(:class:`LatentAttention`, DeepSeek-V2 / V3), DeepSeek-V4's compressed attention (:class:`CompressedAttention`),
the Mamba-2 SSD mixer (:class:`Mamba2`) and the gated DeltaNet (:class:`GatedDeltaNet`). Each is data on
:class:`cabe.architecture.ModelSpec`, read from ``config.json`` by its family module; the activation rooms
(:mod:`cabe.activations`) and the serving rooms read them.

No torch here: plain arithmetic over the config's integers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention (DeepSeek-V2 / V3, transformers 5.24 ``DeepseekV3Attention``).

    q is ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` (or one ``q_proj`` when ``q_lora_rank`` is 0); k and v come
    from one latent: ``kv_a_proj_with_mqa(x)`` is split into ``kv_lora_rank`` values, normalised
    (``kv_a_layernorm``) and expanded by ``kv_b_proj`` to every head's ``nope_dim`` key part and ``v_head_dim``
    value, and ``rope_dim`` values of one rotary key shared by every head. A query / key head is
    ``nope_dim + rope_dim`` wide, a value head ``v_head_dim``.
    """

    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_head_dim: int
    #: DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, transformers 5.24
    #: models/deepseek_v32/modeling_deepseek_v32.py ``DeepseekV32Indexer``): its query heads, head width and the
    #: tokens it keeps per query; 0 heads when the attention has no indexer
    index_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0

    @property
    def qk_head_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def norm_count(self) -> int:
        """Parameters of the latent norms in one layer: q_a_layernorm (when q is low-rank) and kv_a_layernorm;
        with an indexer, its ``k_norm`` (an ``nn.LayerNorm(index_head_dim)``: weight and bias)."""
        return self.q_lora_rank + self.kv_lora_rank + 2 * self.index_head_dim

    @property
    def cache_width(self) -> int:
        """Elements cached per token per layer: the normalised latent and the rotary key (transformers 5.24
        ``DeepseekV3Attention.forward`` calls ``cache.update(kv_nope, k_rot, ...)`` before ``expand_kv``), and
        with an indexer its key (``cache.update_indexer(k)``: ``DynamicIndexedLayer.indexer_keys``, (b, s,
        index_head_dim), cache_utils.py 5.24)."""
        return self.kv_lora_rank + self.rope_dim + self.index_head_dim


@dataclass(frozen=True)
class CompressedAttention:
    """DeepSeek-V4's attention (transformers 5.24, models/deepseek_v4/modeling_deepseek_v4.py,
    ``DeepseekV4Attention``): a low-rank query (``q_a_proj`` h -> q_lora_rank, fp32 ``q_a_norm``, ``q_b_proj`` ->
    heads × head_dim, an unweighted RMSNorm per head), one shared key = value head (``kv_proj`` h -> head_dim, fp32
    ``kv_norm``), partial interleaved rotary on the last ``rope_dim`` channels, eager attention with a learned sink
    per head over the last ``window`` tokens, and a grouped low-rank output (``o_a_proj``: ``o_groups`` blocks of
    heads × head_dim / o_groups -> ``o_lora_rank``, then ``o_b_proj`` o_groups × o_lora_rank -> h).

    Layers whose group ``attention`` is ``compressed_sparse`` (CSA) or ``heavily_compressed`` (HCA) add a compressor
    (``kv_proj`` / ``gate_proj`` h -> 2 × head_dim for CSA's overlapping windows, head_dim for HCA; an fp32
    ``position_bias`` (rate × width) and ``kv_norm``) whose softmax-pooled entries, one per ``csa_rate`` /
    ``hca_rate`` tokens, join the keys; CSA's lightning indexer (kv_proj / gate_proj h -> 2 × index_head_dim, fp32
    position_bias and kv_norm, ``q_b_proj`` q_lora_rank -> index_heads × index_head_dim, ``weights_proj`` h ->
    index_heads) keeps ``index_topk`` of them per query: its output is integer indices, so its weights get no
    gradient."""

    head_dim: int
    q_lora_rank: int
    rope_dim: int
    o_groups: int
    o_lora_rank: int
    window: int
    csa_rate: int
    hca_rate: int
    index_heads: int
    index_head_dim: int
    index_topk: int

    def rate(self, attention: str) -> int:
        """Tokens per compressed entry of a layer kind (0: a sliding layer, no compressor)."""
        return {"compressed_sparse": self.csa_rate, "heavily_compressed": self.hca_rate}.get(attention, 0)


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 (SSD) mixer's shape (transformers 5.24 ``GraniteMoeHybridMambaLayer`` / ``Mamba2Mixer``).

    ``in_proj`` (h -> d_inner + conv_dim + heads) makes the gate z, the convolved x, B, C and dt; ``conv1d`` is
    depthwise over ``conv_dim = d_inner + 2 · groups · state`` channels with a ``conv_kernel``-tap window;
    ``d_inner = heads · head_dim``; the scan runs in chunks of ``chunk`` tokens; a gated RMSNorm over groups of
    ``d_inner / groups``, then ``out_proj`` (d_inner -> h).
    """

    heads: int
    head_dim: int
    state: int
    groups: int
    conv_kernel: int
    chunk: int

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_proj_width(self) -> int:
        return self.d_inner + self.conv_dim + self.heads

    @property
    def conv_state_elements(self) -> int:
        """One sequence's convolution state: ``conv_dim × conv_kernel`` (transformers 5.24 cache_utils.py,
        ``LinearAttentionLayer.update_conv_state`` pads to ``conv_kernel_size``; vLLM keeps ``conv_kernel - 1``)."""
        return self.conv_dim * self.conv_kernel

    @property
    def ssm_state_elements(self) -> int:
        """One sequence's SSM state: ``heads × head_dim × state``."""
        return self.heads * self.head_dim * self.state


@dataclass(frozen=True)
class GatedDeltaNet:
    """Gated DeltaNet linear attention (transformers 5.24, models/qwen3_next/modeling_qwen3_next.py,
    ``Qwen3NextGatedDeltaNet``): ``num_k_heads`` query / key heads of ``head_k_dim``, ``num_v_heads`` value heads
    of ``head_v_dim``; q, k and v go through a depthwise causal conv1d of ``conv_kernel`` taps, then the gated
    delta rule keeps one ``head_k_dim × head_v_dim`` state per value head."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the conv1d: q, k and v (``key_dim * 2 + value_dim``)."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_elements(self) -> int:
        """Elements of one sequence's conv state in one layer: the last ``conv_kernel`` inputs of every channel
        (transformers 5.24 cache_utils.py ``LinearAttentionLayer.update_conv_state`` pads / keeps
        ``conv_kernel_size`` positions; vLLM keeps ``conv_kernel - 1``: see cabe.linear_attention)."""
        return self.conv_dim * self.conv_kernel

    @property
    def recurrent_state_elements(self) -> int:
        """Elements of one sequence's recurrent state in one layer: ``num_v_heads × head_k_dim × head_v_dim``."""
        return self.num_v_heads * self.head_k_dim * self.head_v_dim
