"""Model architecture: a Hugging Face ``config.json`` turned into a small, exact description.

:class:`ModelSpec` lists, per group of identical decoder layers (:class:`LayerGroup`), every weight
matrix (with the name PEFT uses to target it and the slot it fills in the block), the norms and the
embeddings, so that parameter counts are exact (they equal what transformers counts when it builds
the same config) and LoRA / QLoRA / activations can be derived from the same inventory. What a
family's layers are made of is data on the spec (attention, MLP and norm kinds, fused projections,
PEFT's names and default targets), read from ``config.json`` by one module per family in
:mod:`cabe.families`; the estimators dispatch on these kinds, never on family names.

No torch here: this is plain arithmetic over the config's integers.

Over 600 lines for now: it is the data model every room reads (ModelSpec, LayerGroup, Linear and their derived
properties); the seam (data vs the derived counts) is known, the split is issue 28's open remainder.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

#: Slots of a linear layer in a decoder block: what the estimators need to know about it.
#: ``qkv`` reads the attention input (q, k, v or one fused projection), ``o`` is the attention
#: output, ``up`` reads the MLP input (gate and up, or one fused gate_up / fc), ``down`` is the MLP
#: output; ``router`` and ``experts`` are a mixture-of-experts' bare parameters; ``shared_up``,
#: ``shared_down`` and ``shared_gate`` are a shared expert beside the routed ones (Qwen2-MoE: a SwiGLU MLP
#: every token goes through, scaled by a sigmoid of one linear output); ``sinks`` is gpt-oss's learned per-head
#: attention-sink logit (a bare ``nn.Parameter`` of num_heads, counted as a 1 -> num_heads matrix); ``ssm`` is a
#: Mamba-2 mixer's small tensors beside its in_proj / out_proj (conv1d weight and bias, dt_bias, A_log, D, the gated
#: norm's weight: counted as matrices, never LoRA's or bitsandbytes' modules).
SLOTS = (
    "qkv",
    "o",
    "up",
    "down",
    "router",
    "experts",
    "shared_up",
    "shared_down",
    "shared_gate",
    "sinks",
    "ssm",
    "mixer",
    "indexer",
    "hc",
    "vector",
    "o_group",
)
#: ``mixer``: the bare parameters of a linear-attention token mixer (a gated DeltaNet's depthwise conv1d weight,
#: ``dt_bias``, ``A_log`` and its gated norm's weight), none of them an ``nn.Linear``
#: ``indexer`` is DeepSeek-V3.2's lightning indexer (``wq_b``, ``wk``, ``weights_proj``), which runs under
#: ``torch.no_grad``.
#: ``hc`` is the matrix of DeepSeek-V4's manifold-constrained hyper-connections (``attn_hc.fn`` / ``ffn_hc.fn``, a
#: bare fp32 parameter ``F.linear`` reads); ``vector`` a bare parameter only element-wise ops read (their ``base``
#: and ``scale``, norm weights, a compressor's ``position_bias``): never cast by autocast, never a LoRA module;
#: ``o_group`` DeepSeek-V4's grouped ``o_a_proj`` (per head group, before the ``o`` projection to hidden_size).


@dataclass(frozen=True)
class Linear:
    """A weight matrix ``in_features -> out_features`` inside every decoder layer.

    ``name`` is the leaf module name PEFT matches in ``target_modules`` (``q_proj``, ``c_attn``...).
    ``copies`` > 1 for MoE experts stored as one 3-D parameter. ``is_module`` is False when the
    weight is a bare ``nn.Parameter`` (fused experts, MoE routers): PEFT's LoRA and
    bitsandbytes' 4-bit replacement only act on real ``nn.Linear`` / ``Conv1D`` modules.
    """

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    copies: int = 1
    is_module: bool = True
    role: str = "attn"  # attn | mlp | router | expert
    # transformers' bitsandbytes integration replaces `type(m) is nn.Linear` and Conv1D, not subclasses
    quantizable: bool = True
    slot: str = "qkv"  # one of SLOTS
    #: the model keeps this tensor in fp32 whatever dtype it is loaded in (transformers'
    #: ``_keep_in_fp32_modules_strict``, or an ``.to(torch.float32)`` in the module's ``__init__``: DeepSeek-V4)
    fp32: bool = False

    @property
    def quantized_by_bnb(self) -> bool:
        return self.is_module and self.quantizable

    @property
    def weight_count(self) -> int:
        return self.in_features * self.out_features * self.copies

    @property
    def parameter_count(self) -> int:
        return self.weight_count + (self.out_features * self.copies if self.bias else 0)


@dataclass(frozen=True)
class LayerGroup:
    """``count`` decoder layers that are made of the same tensors and attend the same way.

    ``attention``: ``"full"`` (every earlier token), ``"sliding"`` (the last ``window`` tokens) or ``"chunked"``
    (the earlier tokens of the same ``window``-token chunk: Llama 4's local layers).
    ``mlp``: ``"gated"`` (SwiGLU / GeGLU), ``"plain"`` (one activation between two matrices) or
    ``"moe"`` (routed experts). ``intermediate_size``: the MLP's (or one expert's) width, 0 for the
    model's ``intermediate_size``. A model whose layers differ (sliding and global layers, dense layers
    then MoE layers) is several groups, listed from the bottom layer up: where the groups differ in their
    tensors, each group is a run of consecutive layers (freeze trains the top ones, pipeline stages
    hold consecutive ones). ``rope``: the layer rotates q and k (False: Llama 4's NoPE layers, whose queries are
    temperature-tuned instead and whose q and k are not L2-normalised); layers that differ in it save different
    tensors, so they are separate runs even though their weights are alike.
    """

    count: int
    linears: tuple[Linear, ...]
    mlp: str = "gated"
    attention: str = "full"
    window: int | None = None
    intermediate_size: int = 0
    rope: bool = True
    #: the token mixer: ``"attention"`` (softmax attention over q, k, v), ``"mamba2"`` (a Mamba-2 SSD mixer,
    #: :class:`Mamba2`: in_proj in the ``qkv`` slot, out_proj in ``o``, its small tensors in ``ssm``) or
    #: ``"gated_deltanet"`` (Qwen3-Next's linear attention, :class:`GatedDeltaNet`); the last two keep a fixed
    #: state per sequence, no KV cache
    mixer: str = "attention"
    #: how this group's MoE picks its experts when it differs from the model's ``router``: ``"hash"`` (DeepSeek-V4's
    #: ``hash_moe`` layers: a frozen token id -> experts table, ``tid2eid[input_ids]``; the gate only weighs them)
    router: str = ""

    @cached_property
    def linear_count(self) -> int:
        return sum(lin.parameter_count for lin in self.linears)

    def same_tensors(self, other: LayerGroup) -> bool:
        """True when ``other``'s layers are made of the same tensors and save the same ones (only the attention
        span may differ; DeepSeek-V4's compressed kinds save different tensors, so they differ in tensors)."""
        compressed = ("compressed_sparse", "heavily_compressed")
        kind = self.attention if self.attention in compressed else ""
        other_kind = other.attention if other.attention in compressed else ""
        return (self.linears, self.mlp, self.intermediate_size, self.rope, self.mixer, kind, self.router) == (
            other.linears,
            other.mlp,
            other.intermediate_size,
            other.rope,
            other.mixer,
            other_kind,
            other.router,
        )

    def slot_names(self, slot: str) -> list[str]:
        """PEFT names of this group's linears in ``slot`` (see :data:`SLOTS`), in order."""
        return [lin.name for lin in self.linears if lin.slot == slot]


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


@dataclass(frozen=True)
class VisionTower:
    """A vision tower whose images join the text (Qwen2.5-VL's ViT: transformers 5.24
    ``Qwen2_5_VisionTransformerPretrainedModel``, models/qwen2_5_vl/modeling_qwen2_5_vl.py:386-489).

    An image of ``H x W`` pixels (after the processor's resize to multiples of ``patch_size * merge_size``)
    becomes ``(H / patch_size) * (W / patch_size)`` patch tokens of ``hidden_size`` (a Conv3d patch embedding over
    ``temporal_patch_size`` copies of the frame, no bias), ``depth`` blocks (RMSNorm, one fused ``qkv`` with bias
    and 2-D rotary, ``proj`` with bias, RMSNorm, a gated MLP with biases), then the merger: an RMSNorm and two
    linears over ``merge_size**2`` neighbouring patches (``merge_size**2 * hidden_size`` wide, GELU between) to
    ``out_hidden_size``: one text token per ``merge_size**2`` patches. The blocks of ``full_attention_blocks``
    attend over the whole image, the others over windows of ``window_size`` pixels.
    """

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    window_size: int = 112
    full_attention_blocks: tuple[int, ...] = ()
    in_channels: int = 3
    #: the processor's pixel bounds (transformers 5.24 ``Qwen2VLImageProcessor.size``, image_processing_qwen2_vl.py:96:
    #: shortest_edge 56*56, longest_edge 28*28*1280) that ``smart_resize`` keeps an image within
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    #: what the tower is made of: ``"qwen2_5_vl"`` (above), ``"siglip"`` (Gemma 3's SigLIP encoder and
    #: ``Gemma3MultiModalProjector``: a Conv2d patch embedding with bias and learned positions, LayerNorm blocks with
    #: separate q / k / v / out projections and a plain GELU MLP, all with biases, a post-LayerNorm, then an
    #: average pool to ``tokens_per_image`` tokens, an RMSNorm and a bare projection matrix; images resized to
    #: ``image_size`` squares: cabe.vision.siglip)
    kind: str = "qwen2_5_vl"
    #: SigLIP: the square side every image is resized to (pixels), and the soft tokens one image becomes
    image_size: int = 0
    tokens_per_image: int = 0
    #: SigLIP: the encoder's attention-pooling head (``vision_use_head``; Gemma 3's checkpoints have none)
    use_head: bool = False
    #: the blocks' MLP activation (SigLIP's ``hidden_act``; Qwen2.5-VL's gated MLP is SiLU)
    hidden_act: str = "silu"
    #: Qwen3-VL: the learned position table (``pos_embed``, bilinearly resampled to each image's grid) and the
    #: blocks after which a DeepStack merger feeds the decoder's bottom layers
    num_position_embeddings: int = 0
    deepstack_indexes: tuple[int, ...] = ()

    @property
    def image_mask(self) -> bool:
        """The decoder attends over each image's tokens both ways, so SDPA gets a mask in every layer: Gemma 3's
        ``token_type_ids`` (modeling_gemma3.py:867-881, ``create_masks_for_vision_model``; masking_utils.py:997-1000
        sets ``allow_is_causal_skip = False``)."""
        return self.kind == "siglip"

    @property
    def merged_width(self) -> int:
        """The merger's width: ``merge_size**2`` patches side by side."""
        return self.hidden_size * self.merge_size**2

    @property
    def block_linears(self) -> tuple[Linear, ...]:
        """The linears of one block, with PEFT's names (``attn.qkv``, ``attn.proj``, ``mlp.*_proj``; SigLIP's
        ``self_attn.{q,k,v,out}_proj`` and ``mlp.fc1`` / ``mlp.fc2``)."""
        h, f = self.hidden_size, self.intermediate_size
        if self.kind == "siglip":
            return (
                Linear("q_proj", h, h, True),
                Linear("k_proj", h, h, True),
                Linear("v_proj", h, h, True),
                Linear("out_proj", h, h, True, slot="o"),
                Linear("fc1", h, f, True, role="mlp", slot="up"),
                Linear("fc2", f, h, True, role="mlp", slot="down"),
            )
        if self.kind == "qwen3_vl":  # Qwen3VLVisionBlock: fused qkv, proj, a plain MLP (modeling_qwen3_vl.py:78-90)
            return (
                Linear("qkv", h, 3 * h, True),
                Linear("proj", h, h, True, slot="o"),
                Linear("linear_fc1", h, f, True, role="mlp", slot="up"),
                Linear("linear_fc2", f, h, True, role="mlp", slot="down"),
            )
        return (
            Linear("qkv", h, 3 * h, True),
            Linear("proj", h, h, True, slot="o"),
            Linear("gate_proj", h, f, True, role="mlp", slot="up"),
            Linear("up_proj", h, f, True, role="mlp", slot="up"),
            Linear("down_proj", f, h, True, role="mlp", slot="down"),
        )

    @property
    def merger_linears(self) -> tuple[Linear, ...]:
        """The merger's two linears (``merger.mlp.0`` and ``merger.mlp.2``, with biases); none for SigLIP, whose
        projector is a bare matrix (``mm_input_projection_weight``: no ``nn.Linear`` for PEFT or bitsandbytes)."""
        if self.kind == "siglip":
            return ()
        m = self.merged_width
        if self.kind == "qwen3_vl":  # Qwen3VLVisionPatchMerger (modeling_qwen3_vl.py:171-185), also each DeepStack one
            return (
                Linear("linear_fc1", m, m, True, role="mlp", slot="up"),
                Linear("linear_fc2", m, self.out_hidden_size, True, slot="down"),
            )
        return (Linear("0", m, m, True, role="mlp", slot="up"), Linear("2", m, self.out_hidden_size, True, slot="down"))

    @property
    def patch_embed_count(self) -> int:
        """The Conv3d patch embedding: channels x temporal x patch x patch -> hidden, no bias (SigLIP's Conv2d:
        ``temporal_patch_size`` 1)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2 * self.hidden_size

    @property
    def norm_bias(self) -> bool:
        """The tower's norms are LayerNorms with a bias (SigLIP, Qwen3-VL) rather than RMSNorms."""
        return self.kind in ("siglip", "qwen3_vl")

    @property
    def input_hooked(self) -> bool:
        """transformers' ``enable_input_require_grads`` hooks the tower's patch embedding (its class names it:
        ``_input_embed_layer``, Qwen2.5-VL's ``patch_embed``, SigLIP's ``patch_embedding``); Qwen3-VL's tower names
        none, so ``get_input_embeddings`` raises and is skipped (modeling_utils.py ``enable_input_require_grads``,
        ``get_input_embeddings``, 5.24)."""
        return self.kind != "qwen3_vl"

    @property
    def mergers(self) -> int:
        """How many patch mergers the tower has: the final one and Qwen3-VL's DeepStack ones."""
        return 1 + len(self.deepstack_indexes)

    @property
    def block_count(self) -> int:
        """Parameters of one block: its linears and two norms (RMSNorm weights; SigLIP's LayerNorm weight and
        bias)."""
        norms = 2 * self.hidden_size * (2 if self.norm_bias else 1)
        return sum(lin.parameter_count for lin in self.block_linears) + norms

    @property
    def patches_per_image(self) -> int:
        """SigLIP: patch tokens of one (resized) image."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def around_tensors(self) -> tuple[tuple[str, int, int, str], ...]:
        """The tower's parameters outside its blocks' linears, as (name, elements, count, kind): the patch
        embedding, the norms, and SigLIP's positions, head and projector (transformers 5.24 siglip/
        modeling_siglip.py ``SiglipVisionEmbeddings``, ``SiglipMultiheadAttentionPoolingHead``; gemma3/
        modeling_gemma3.py:635-650 ``Gemma3MultiModalProjector``)."""
        h = self.hidden_size
        if self.kind == "qwen3_vl":  # Qwen3VLVisionModel (modeling_qwen3_vl.py:621-665): Conv3d with bias, LayerNorms
            m, ds = self.merged_width, len(self.deepstack_indexes)
            return (
                ("patch_embed", self.patch_embed_count, 1, "base"),
                ("patch_embed.bias", h, 1, "base"),
                ("position_embedding", self.num_position_embeddings * h, 1, "base"),
                ("norm", h, 2 * self.depth + 1, "norm"),
                ("norm.bias", h, 2 * self.depth + 1, "norm"),
                ("deepstack_norm", m, ds, "norm"),  # the DeepStack mergers' LayerNorm is over 4h (postshuffle)
                ("deepstack_norm.bias", m, ds, "norm"),
            )
        if self.kind != "siglip":
            return (("patch_embed", self.patch_embed_count, 1, "base"), ("norm", h, 2 * self.depth + 1, "norm"))
        f = self.intermediate_size
        # the head: probe, nn.MultiheadAttention (in_proj weight and bias, out_proj), LayerNorm, the MLP's biases;
        # the MLP's two matrices apart (``head.mlp``: nn.Linear, see :attr:`around_linears`)
        head = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + f + h if self.use_head else 0
        return (
            ("patch_embed", self.patch_embed_count, 1, "base"),
            ("patch_embed.bias", h, 1, "base"),
            ("position_embedding", self.patches_per_image * h, 1, "base"),
            ("norm", h, 2 * self.depth + 1, "norm"),
            ("norm.bias", h, 2 * self.depth + 1, "norm"),
            ("head", head, 1 if head else 0, "base"),
            ("head.mlp", 2 * h * f, 1 if head else 0, "base"),
            ("projector", h * self.out_hidden_size, 1, "base"),
            ("projector_norm", h, 1, "norm"),
        )

    @property
    def around_linears(self) -> tuple[str, ...]:
        """The entries of :attr:`around_tensors` that are ``nn.Linear`` weights, which QLoRA's bitsandbytes
        quantizes (``replace_with_bnb_linear`` converts modules whose type is exactly ``nn.Linear``,
        integrations/bitsandbytes.py:189, 5.24): SigLIP's head MLP (``SiglipMLP``'s fc1 and fc2,
        siglip/modeling_siglip.py:315-316). The head's ``nn.MultiheadAttention`` keeps its packed ``in_proj_weight``
        (a bare parameter) and its ``out_proj`` (``NonDynamicallyQuantizableLinear``, a subclass): both stay; so do
        the patch embeddings (Conv2d / Conv3d), the positions and Gemma 3's projector (``mm_input_projection_weight``,
        a bare parameter, gemma3/modeling_gemma3.py:639)."""
        return ("head.mlp",) if self.kind == "siglip" and self.use_head else ()

    @property
    def parameter_count(self) -> int:
        around = sum(numel * count for _, numel, count, _ in self.around_tensors)
        linears = self.depth * sum(lin.parameter_count for lin in self.block_linears)
        return around + linears + self.mergers * sum(lin.parameter_count for lin in self.merger_linears)


@dataclass(frozen=True)
class ModelSpec:
    """An exact, torch-free description of a decoder-only transformer.

    Sizes are counts of elements (not bytes). ``layer_groups`` are the decoder layers, grouped by
    what they are made of (bottom layer first); :attr:`runs` merges neighbouring groups made of the same
    tensors, and every estimator sums over them. :meth:`uniform` says whether all layers share their tensors.
    """

    model_type: str
    family: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    activation: str
    rotary_dim: int
    max_positions: int
    layer_groups: tuple[LayerGroup, ...]
    # what most decoder families share (Llama-style); family modules set only what differs
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    norm_bias: bool = False
    norms_per_layer: int = 2  # norms over hidden_size in one layer
    # where the norms sit: "pre" (before attention and MLP), "post" (after them, OLMo 2),
    # "sandwich" (before and after, Gemma 2 / 3)
    norm_placement: str = "pre"
    norm_weight_fp32: bool = False  # the norm multiplies by its weight in fp32 (Gemma, OLMo 2)
    norm_plus_one: bool = False  # Gemma: x · (1 + w), the (1 + w) an fp32 tensor saved per layer
    # "none" | "head" (over head_dim) | "full" (over heads*head_dim) | "l2" (Llama 4: over head_dim, no weight,
    # in the layers that rotate q and k)
    qk_norm: str = "none"
    parallel_block: bool = False  # attention and MLP read the same input (Falcon, GPT-NeoX)
    position: str = "rotary"  # "rotary" | "learned"
    # rotary applied with torch.cat (partial rotary, Phi-3's and GPT-NeoX's code): the attention
    # output is copied before the output projection, cos and sin are cast in every layer
    rotary_by_cat: bool = False
    # v is a view of one fused qkv output, whose whole storage stays alive while v is saved
    value_is_qkv_view: bool = False
    # q, k and v are all split views of one fused qkv output (no rotary makes new q and k: GPTBigCode)
    qkv_views: bool = False
    eager_softmax_fp32: bool = True  # GPT-2's eager attention takes softmax in the compute dtype
    sdpa_fallback: str = ""  # what attn_implementation="sdpa" really runs, when not a fused kernel
    # transformers builds a sliding-window mask for SDPA on every layer from this window, whatever the layer
    # groups say (Phi-3: create_sliding_window_causal_mask whenever config.sliding_window is set)
    sdpa_mask_window: int | None = None
    attn_logit_softcapping: float | None = None
    #: multi-head latent attention (DeepSeek-V3); None for attention with separate q, k, v projections
    latent_attention: LatentAttention | None = None
    #: DeepSeek-V4's compressed attention (:class:`CompressedAttention`), whose kind each group's ``attention``
    #: names (``sliding``, ``compressed_sparse``, ``heavily_compressed``); None for other attentions
    compressed_attention: CompressedAttention | None = None
    #: manifold-constrained hyper-connections (DeepSeek-V4, ``hc_mult``): the residual is this many streams of
    #: hidden_size, mixed into each block's input and out of its output; 0 for a plain residual
    hyper_connections: int = 0
    #: parameters on top of the last layer kept in fp32 besides the final norm (DeepSeek-V4's ``hc_head``:
    #: hc_fn, hc_base, hc_scale); the norms' weights too are fp32 when ``fp32_norms`` (``_keep_in_fp32_modules_strict``)
    fp32_head_parameters: int = 0
    fp32_norms: bool = False
    #: the Mamba-2 mixer of the layers whose ``mixer`` is ``"mamba2"`` (Granite-4.0-H); None without one
    mamba2: Mamba2 | None = None
    #: the shape of the gated DeltaNet layers (groups whose ``mixer`` is ``"gated_deltanet"``); None when none
    gated_deltanet: GatedDeltaNet | None = None
    #: the attention layers' q_proj also makes a per-channel gate: ``o_proj(attn * sigmoid(gate))`` (Qwen3-Next)
    attention_output_gate: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    #: how the router picks experts: ``"softmax"`` (a softmax over the router's logits, top-k; Mixtral, Qwen),
    #: ``"sigmoid_groups"`` (DeepSeek-V3: an fp32 router, sigmoid scores, the best ``expert_groups[1]`` of
    #: ``expert_groups[0]`` groups, top-k among their experts, weights renormalised) or ``"topk_softmax"``
    #: (gpt-oss: top-k of the biased logits, then a softmax over the k values in their dtype)
    #: ``"topk_sigmoid"`` (Llama 4: top-k of the logits, the others set to -inf, a sigmoid over all E in fp32)
    router: str = "softmax"
    #: how tokens reach the experts: ``"grouped"`` (each token to its k experts: transformers 5's grouped_mm) or
    #: ``"dense"`` (Llama 4's ``Llama4TextMoe``: every token through every expert, scaled by its router score,
    #: zero for the experts not picked: E× the activations and FLOPs of the k picked)
    expert_dispatch: str = "grouped"
    #: transformers can run ``flash_attention_2`` for this model (False: ``_supports_flash_attn = False``, Llama 4)
    flash_attention: bool = True
    #: names of ``nn.Linear`` subclasses PEFT wraps (by name, or under ``all-linear``) whose forward LoRA cannot run:
    #: Llama 4's router returns a tuple, and PEFT 0.21's ``Linear.forward`` reads ``result.dtype``
    #: (peft/tuners/lora/layer.py:1089)
    lora_breaks: tuple[str, ...] = ()
    #: module names PEFT matches in ``target_modules`` (by the module's last name) but refuses to wrap: not an
    #: ``nn.Linear`` / ``Conv1D`` / ``Embedding`` and not moved onto parameters for this model type (Qwen3-VL-MoE's
    #: ``gate``, a ``Qwen3VLMoeTextTopKRouter``, and ``experts``): "Target module ... is not supported"
    #: (peft/tuners/lora/model.py:559, ``_create_new_module``, 0.21.2)
    lora_unsupported: tuple[str, ...] = ()
    #: Llama 4: the queries of the layers without rotary are scaled per position (``attn_temperature_tuning``)
    nope_temperature_tuning: bool = False
    expert_groups: tuple[int, int] = (1, 1)
    #: LoRA target names PEFT (0.21) moves onto the fused experts' 3-D parameters and the router for this model
    #: type (its transformers v4 -> v5 MoE conversion: peft/utils/transformers_weight_conversion.py,
    #: ``_convert_peft_config_moe``, through transformers' ``_MODEL_TO_CONVERSION_PATTERN``), each with the bare
    #: parameter's Linear name in the layer it goes to; empty when none (cabe.method.lora_parameter_targets)
    peft_parameter_targets: tuple[tuple[str, str], ...] = ()
    # gpt-oss: the eager attention appends one learned logit per head to every row of scores before the
    # softmax (in the scores' dtype) and drops its column after (an "attention sink")
    attention_sinks: bool = False
    # the experts' gate: "swiglu" (silu(gate) * up, Mixtral / Qwen) or "swiglu_clamp" (gpt-oss: gate and up
    # interleaved and clamped, gate * sigmoid(alpha * gate) * (up + 1))
    expert_gate: str = "swiglu"
    final_logit_softcapping: float | None = None
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embedding_dropout: float = 0.0
    #: PEFT's default LoRA targets for this model type (peft/utils/constants.py), or all-linear
    #: where PEFT has none and asks for target_modules
    peft_default_targets: tuple[str, ...] = ("q_proj", "v_proj")
    #: the module names of the token embedding and of the output projection (transformers' attribute names,
    #: which PEFT's ``target_modules`` match): LoRA may target them (peft tuners/lora/layer.py ``Embedding``,
    #: ``Linear``)
    embedding_name: str = "embed_tokens"
    lm_head_name: str = "lm_head"
    #: what sits on top of the last layer: ``"lm"`` (an lm_head over the vocabulary, logits per token) or
    #: ``"sequence_classification"`` (BERT's pooler, a dense h -> h with tanh on the first token, then a
    #: classifier h -> num_labels: no per-token logits)
    head: str = "lm"
    num_labels: int = 0
    #: token-type (segment) embeddings added to the input (BERT's type_vocab_size); 0 when none
    token_types: int = 0
    #: the checkpoint's dtype as its config says (``dtype``, or ``torch_dtype`` before transformers 5):
    #: what ``from_pretrained(dtype="auto")`` loads; None when the config does not say
    dtype: str | None = None
    #: the format the checkpoint stores its weights in, for serving it as shipped (``cabe infer --weights auto``):
    #: its ``quantization_config`` (gpt-oss's ``mxfp4`` experts, DeepSeek-V3's block-scaled ``fp8``, GPTQ / AWQ /
    #: bitsandbytes checkpoints), else its dtype; None when the config says neither
    weights_format: str | None = None
    #: parameters of a vision tower and its projector the checkpoint carries (Gemma 3's SigLIP):
    #: held as frozen weights; their activations are not modelled (0 for a text-only model)
    vision_parameters: int = 0
    #: of ``vision_parameters``: the weights of the tower's and projector's ``nn.Linear`` layers, which QLoRA's
    #: bitsandbytes quantizes with the decoder's (every nn.Linear but the LM head); 0 when not known
    vision_linear_parameters: int = 0
    #: transformers' AutoModelForCausalLM builds the decoder alone (Llama 4: ``Llama4ForCausalLM``), dropping the
    #: ``vision_parameters`` the spec counts: text-only trainers (and ``cabe trace``) load less (a report note)
    causal_lm_drops_tower: bool = False
    #: the vision tower whose images join the text sequence (:class:`VisionTower`; Qwen2.5-VL), when the family
    #: models its activations; ``vision_parameters`` is then its parameter count
    vision: VisionTower | None = None
    #: bytes of the model's buffers on the device that are not parameters (transformers' modules, not vLLM's):
    #: GPTBigCode's causal mask ``transformer.bias``, n_positions² bools
    buffer_bytes: int = 0
    #: where each role's linears sit in a decoder layer, as transformers names the modules (what
    #: ``optim_target_modules`` is matched against, as substrings: trainer_utils ``check_target_module_exists``)
    module_prefixes: tuple[tuple[str, str], ...] = (("attn", "self_attn."), ("mlp", "mlp."), ("router", "mlp."))
    #: the layer's matrices are transformers' Conv1D (GPT-2), not ``nn.Linear``: GaLore cannot target them
    conv1d: bool = False
    name: str = ""
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- the layers ---------------------------------------------------------------------------
    # NOTE: cached_property on a frozen dataclass: the values live in the instance's __dict__, outside the
    # fields that equality and hashing read; an estimate asks for them dozens of times
    @property
    def residual_width(self) -> int:
        """Values per token of the residual stream between layers: hidden_size, or ``hyper_connections`` streams of
        it (DeepSeek-V4: the decoder layers' input is (b, s, hc_mult, h))."""
        return self.hidden_size * max(1, self.hyper_connections)

    @cached_property
    def num_layers(self) -> int:
        return sum(g.count for g in self.layer_groups)

    @cached_property
    def runs(self) -> tuple[LayerGroup, ...]:
        """The layers as runs of consecutive layers made of the same tensors, bottom first: neighbouring
        groups that differ only in their attention span (Gemma's sliding and global layers) are one run,
        whose ``attention`` and ``window`` are its first group's. One run when the layers are uniform."""
        out: list[LayerGroup] = []
        for g in self.layer_groups:
            if out and out[-1].same_tensors(g):
                out[-1] = replace(out[-1], count=out[-1].count + g.count)
            else:
                out.append(g)
        return tuple(out)

    @cached_property
    def _uniform(self) -> bool:
        first = self.layer_groups[0]
        return all(g.same_tensors(first) for g in self.layer_groups)

    def uniform(self) -> bool:
        """True when every layer group has the same tensors (only its attention span differs)."""
        return self._uniform

    def top_split(self, trained: int) -> tuple[tuple[LayerGroup, int, bool], ...]:
        """``(run, layers, trained)`` bottom first, the top ``trained`` layers trained (as freeze trains
        them) and the rest frozen; parts with no layers are left out."""
        out: list[tuple[LayerGroup, int, bool]] = []
        below = self.num_layers - trained  # layers under the trained ones
        for run in self.runs:
            frozen = max(0, min(run.count, below))
            below -= frozen
            out += [(run, n, t) for n, t in ((frozen, False), (run.count - frozen, True)) if n]
        return tuple(out)

    def ffn_size(self, group: LayerGroup) -> int:
        """The MLP width of ``group`` (one expert's, for a mixture of experts)."""
        return group.intermediate_size or self.intermediate_size

    @cached_property
    def layer_linears(self) -> tuple[Linear, ...]:
        """Every distinct weight matrix of the decoder layers, over all groups (one layer's when uniform):
        what a name means (its role, its copies), never a count of one layer's tensors."""
        seen: dict[Linear, None] = {}
        for g in self.runs:
            for lin in g.linears:
                seen.setdefault(lin, None)
        return tuple(seen)

    @property
    def attention_kind(self) -> str:
        """How a layer attends, as a code: ``mla`` (multi-head latent attention), ``mqa`` (one kv head), ``gqa``
        (fewer kv heads than query heads) or ``mha``; ``+sliding`` when some layers slide over a window."""
        if self.latent_attention:
            kind = "mla"
        elif self.num_kv_heads == 1 and self.num_heads > 1:
            kind = "mqa"
        else:
            kind = "gqa" if self.num_kv_heads < self.num_heads else "mha"
        chunked = any(g.attention == "chunked" for g in self.layer_groups)
        kind += ("+sliding" if self.sliding_layers else "") + ("+chunked" if chunked else "")
        compressed = {"compressed_sparse": "+csa", "heavily_compressed": "+hca"}  # DeepSeek-V4's compressors
        kind += "".join(dict.fromkeys(compressed[g.attention] for g in self.layer_groups if g.attention in compressed))
        mixers = dict.fromkeys(g.mixer for g in self.layer_groups if g.mixer != "attention")
        return kind + ("+gated" if self.attention_output_gate else "") + "".join("+" + m for m in mixers)

    @property
    def attention_layers(self) -> int:
        """Layers that attend (and keep a KV cache): all but the state-space mixers'."""
        return sum(g.count for g in self.layer_groups if g.mixer == "attention")

    @property
    def mlp_kinds(self) -> str:
        """The MLP kinds of the layers, bottom first (``gated``, ``plain``, ``moe``; ``gated+moe`` for dense
        layers then MoE layers); ``+shared`` when the MoE layers have a shared expert."""
        kinds = list(dict.fromkeys(g.mlp for g in self.runs))
        shared = any(g.slot_names("shared_up") for g in self.runs)
        hashed = any(g.router == "hash" for g in self.runs)  # DeepSeek-V4's hash-routed MoE layers
        return "+".join(kinds) + ("+hash" if hashed else "") + ("+shared" if shared else "")

    @property
    def sliding_layers(self) -> int:
        """How many layers attend over a sliding window."""
        return sum(g.count for g in self.layer_groups if g.attention == "sliding")

    @property
    def sliding_window(self) -> int | None:
        return next((g.window for g in self.layer_groups if g.attention == "sliding"), None)

    # ---- parameter counts -----------------------------------------------------------------
    @property
    def embedding_count(self) -> int:
        """Token embedding matrix: vocab_size × hidden_size."""
        return self.vocab_size * self.hidden_size

    @property
    def position_embedding_count(self) -> int:
        """Learned absolute positions (GPT-2): max_positions × hidden_size; 0 with rotary."""
        return self.max_positions * self.hidden_size if self.position == "learned" else 0

    @property
    def lm_head_count(self) -> int:
        """Output projection hidden_size × vocab_size; 0 when tied to the embedding or with another head."""
        return 0 if self.tie_word_embeddings or self.head != "lm" else self.vocab_size * self.hidden_size

    @property
    def token_type_count(self) -> int:
        """Token-type embeddings: type_vocab_size × hidden_size (BERT); 0 otherwise."""
        return self.token_types * self.hidden_size

    @property
    def classifier_count(self) -> int:
        """A sequence-classification head: pooler (h × h + h) and classifier (h × labels + labels)."""
        if self.head != "sequence_classification":
            return 0
        h = self.hidden_size
        return h * h + h + h * self.num_labels + self.num_labels

    @property
    def norm_param_count(self) -> int:
        """Parameters of one hidden-size norm: weight (+ bias for LayerNorm)."""
        return self.hidden_size * (2 if self.norm_bias else 1)

    @property
    def qk_norm_count(self) -> int:
        if self.qk_norm == "head":
            return 2 * self.head_dim
        if self.qk_norm == "full":
            return (self.num_heads + self.num_kv_heads) * self.head_dim
        return 0

    @property
    def latent_norm_count(self) -> int:
        """Parameters of multi-head latent attention's norms in one layer (0 without it)."""
        return self.latent_attention.norm_count if self.latent_attention else 0

    @property
    def layer_norm_count(self) -> int:
        return self.norms_per_layer * self.norm_param_count + self.qk_norm_count + self.latent_norm_count

    def group_norm_count(self, group: LayerGroup) -> int:
        """Norm parameters in one layer of ``group``: a linear-attention layer has no q / k norms (its gated norm's
        weight is one of its bare ``mixer`` parameters)."""
        if group.mixer == "attention":
            return self.layer_norm_count
        return self.norms_per_layer * self.norm_param_count

    def layer_count(self, group: LayerGroup) -> int:
        """Parameters in one decoder layer of ``group``."""
        return group.linear_count + self.group_norm_count(group)

    @cached_property
    def parameter_count(self) -> int:
        """All parameters, tied embeddings counted once (as ``model.parameters()`` does)."""
        return (
            self.embedding_count
            + self.position_embedding_count
            + self.token_type_count
            + sum(g.count * g.linear_count for g in self.layer_groups)
            + sum(g.count * self.group_norm_count(g) for g in self.layer_groups)
            + self.norm_param_count  # final norm (BERT: the embeddings' LayerNorm, the same size)
            + self.lm_head_count
            + self.classifier_count
            + self.vision_parameters
            + self.fp32_head_parameters
        )

    def parameter_breakdown(self) -> dict[str, int]:
        """Named parameter counts that sum to :attr:`parameter_count`."""
        out = {
            "embedding": self.embedding_count,
            "position_embedding": self.position_embedding_count,
            "token_type_embedding": self.token_type_count,
            "layers_linear": sum(g.count * g.linear_count for g in self.layer_groups),
            "layers_norm": sum(g.count * self.group_norm_count(g) for g in self.layer_groups),
            "final_norm": self.norm_param_count,
            "lm_head": self.lm_head_count,
            "classifier": self.classifier_count,
            "vision_tower": self.vision_parameters,
            "hyper_connection_head": self.fp32_head_parameters,
        }
        return {k: v for k, v in out.items() if v}

    # ---- helpers used by LoRA / QLoRA -----------------------------------------------------
    @property
    def linear_names(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for lin in self.layer_linears:
            if lin.is_module:
                seen.setdefault(lin.name, None)
        return tuple(seen)

    @property
    def quantizable_count(self) -> int:
        """Weights bitsandbytes turns to 4 bit: every ``nn.Linear`` in the layers (not lm_head)."""
        return sum(
            g.count * sum(lin.weight_count for lin in g.linears if lin.quantized_by_bnb) for g in self.layer_groups
        )

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim
