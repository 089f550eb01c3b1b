"""The decoder layer's inventory: its weight matrices (:class:`Linear`, each with the name PEFT targets and the
slot it fills, :data:`SLOTS`) and a group of identical layers (:class:`LayerGroup`). A family module in
:mod:`cabe.families` lists them from ``config.json``; :class:`cabe.architecture.ModelSpec` holds the groups.

No torch here: plain arithmetic over the config's integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
