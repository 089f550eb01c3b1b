"""Model architecture: a Hugging Face ``config.json`` turned into a small, exact description.

:class:`ModelSpec` lists, per group of identical decoder layers (:class:`LayerGroup`), every weight
matrix (with the name PEFT uses to target it and the slot it fills in the block), the norms and the
embeddings, so that parameter counts are exact (they equal what transformers counts when it builds
the same config) and LoRA / QLoRA / activations can be derived from the same inventory. What a
family's layers are made of is data on the spec (attention, MLP and norm kinds, fused projections,
PEFT's names and default targets), read from ``config.json`` by one module per family in
:mod:`cabe.families`; the estimators dispatch on these kinds, never on family names.

No torch here: this is plain arithmetic over the config's integers.

The layer inventory (:class:`~cabe.layers.Linear`, :class:`~cabe.layers.LayerGroup`) is in :mod:`cabe.layers`, the
token mixers' shapes in :mod:`cabe.mixers` and the vision tower's in :mod:`cabe.vision.tower`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from cabe.layers import LayerGroup, Linear
from cabe.mixers import CompressedAttention, GatedDeltaNet, LatentAttention, Mamba2
from cabe.vision.tower import VisionTower


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
    #: LoRA target names PEFT (0.22.0) turns into LoRA on the fused experts' 3-D parameters and the router for this
    #: model type (its transformers v4 -> v5 MoE conversion: peft/utils/transformers_weight_conversion.py,
    #: ``_convert_peft_config_moe``, through its copy of transformers' ``_MODEL_TO_CONVERSION_PATTERN``), each with
    #: the bare parameter's Linear name in the layer it goes to; empty when none (cabe.method.lora_parameter_targets;
    #: the names' nn.Linear modules keep their adapters too: cabe.method.kept_targets)
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
    def local_windows(self) -> tuple[tuple[int, int], ...]:
        """(window, layers) of the sliding and chunked layers, one entry per window size (ascending)."""
        by: dict[int, int] = {}
        for g in self.layer_groups:
            if g.attention in ("sliding", "chunked") and g.window:
                by[g.window] = by.get(g.window, 0) + g.count
        return tuple(sorted(by.items()))

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
