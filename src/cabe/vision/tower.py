"""A vision tower's shape (:class:`VisionTower`): its blocks, merger and parameters outside the blocks, for the
three tower kinds cabe models (Qwen2.5-VL's ViT, Gemma 3's SigLIP, Qwen3-VL). The rest of :mod:`cabe.vision` turns
it into memory: the images it reads, its activations in training and its prefill in serving.

No torch here: plain arithmetic over the config's integers.
"""

from __future__ import annotations

from dataclasses import dataclass

from cabe.layers import Linear


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
