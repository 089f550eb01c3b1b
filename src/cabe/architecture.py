"""Model architecture: a Hugging Face ``config.json`` turned into a small, exact description.

:class:`ModelSpec` lists, per decoder layer, every weight matrix (with the name PEFT uses to
target it), every norm, and the embeddings, so that parameter counts are exact (they equal
what transformers counts when it builds the same config) and LoRA / QLoRA / activations can be
derived from the same inventory. Supported ``model_type`` values: llama, mistral, qwen2, qwen3,
olmo2, gemma, gemma2, gemma3_text (and gemma3, via its text config), mixtral, phi3, gpt2,
gpt_neox, falcon.

No torch here: this is plain arithmetic over the config's integers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cabe.errors import ConfigError

#: ``model_type`` values cabe understands, with the family whose layer layout they share.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "olmo2": "olmo2",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gemma3": "gemma",
    "mixtral": "mixtral",
    "phi3": "phi3",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "falcon": "falcon",
}


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
class ModelSpec:
    """An exact, torch-free description of a decoder-only transformer.

    Sizes are counts of elements (not bytes). ``layer_linears`` is the weight-matrix inventory of
    ONE decoder layer; ``layer_norm_params`` the norm parameters of one layer.
    """

    model_type: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    activation: str
    rotary_dim: int
    max_positions: int
    layer_linears: tuple[Linear, ...]
    # what most decoder families share (Llama-style); builders set only what differs
    norm: str = "rmsnorm"  # "rmsnorm" | "layernorm"
    norm_bias: bool = False
    norms_per_layer: int = 2  # norms over hidden_size in one layer
    qk_norm: str = "none"  # "none" | "head" (over head_dim) | "full" (over heads*head_dim)
    mlp: str = "gated"  # "gated" | "plain"
    parallel_block: bool = False  # attention and MLP read the same input (Falcon, GPT-NeoX)
    position: str = "rotary"  # "rotary" | "learned"
    num_experts: int = 0
    experts_per_token: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many layers use the sliding window
    final_logit_softcapping: float | None = None
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embedding_dropout: float = 0.0
    name: str = ""
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
        """Output projection hidden_size × vocab_size; 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

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
    def layer_linear_count(self) -> int:
        return sum(lin.parameter_count for lin in self.layer_linears)

    @property
    def layer_norm_count(self) -> int:
        return self.norms_per_layer * self.norm_param_count + self.qk_norm_count

    @property
    def layer_count(self) -> int:
        """Parameters in one decoder layer."""
        return self.layer_linear_count + self.layer_norm_count

    @property
    def parameter_count(self) -> int:
        """All parameters, tied embeddings counted once (as ``model.parameters()`` does)."""
        return (
            self.embedding_count
            + self.position_embedding_count
            + self.num_layers * self.layer_count
            + self.norm_param_count  # final norm
            + self.lm_head_count
        )

    def parameter_breakdown(self) -> dict[str, int]:
        """Named parameter counts that sum to :attr:`parameter_count`."""
        out = {
            "embedding": self.embedding_count,
            "position_embedding": self.position_embedding_count,
            "layers_linear": self.num_layers * self.layer_linear_count,
            "layers_norm": self.num_layers * self.layer_norm_count,
            "final_norm": self.norm_param_count,
            "lm_head": self.lm_head_count,
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
        return self.num_layers * sum(lin.weight_count for lin in self.layer_linears if lin.quantized_by_bnb)

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> ModelSpec:
        """Build a spec from a Hugging Face ``config.json`` dict. Raises :class:`ConfigError`."""
        return from_config(config, name=name)


# =============================================================================================
# config.json -> ModelSpec
# =============================================================================================


def from_config(config: Mapping[str, Any], *, name: str = "") -> ModelSpec:
    if not isinstance(config, Mapping):
        raise ConfigError("config_not_object", "model")
    model_type = config.get("model_type")
    if model_type == "gemma3" and isinstance(config.get("text_config"), Mapping):
        # NOTE: multimodal Gemma 3 checkpoints: cabe plans the text model only.
        text = dict(config["text_config"])
        text.setdefault("model_type", "gemma3_text")
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
        config, model_type = text, "gemma3_text"
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("config_missing_field", "model", key="model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            "unsupported_architecture",
            "model",
            model_type=model_type,
            allowed=", ".join(sorted(SUPPORTED_MODEL_TYPES)),
        )
    builder = _BUILDERS[SUPPORTED_MODEL_TYPES[model_type]]
    try:
        spec = builder(_Reader(config, model_type), name or str(config.get("_name_or_path", "")))
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("config_bad_value", "model", detail=str(exc)) from None
    return spec


class _Reader:
    """Typed access to config keys with clear errors (never a KeyError traceback)."""

    def __init__(self, config: Mapping[str, Any], model_type: str) -> None:
        self.c = config
        self.model_type = model_type

    def int(self, *keys: str, default: int | None = None, minimum: int = 1) -> int:
        for key in keys:
            v = self.c.get(key)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int):
                    if isinstance(v, float) and v.is_integer():
                        v = int(v)
                    else:
                        raise ConfigError("config_bad_value", "model", key=key, detail=repr(v))
                if v < minimum:
                    raise ConfigError("config_bad_value", "model", key=key, detail=repr(v))
                return v
        if default is None:
            raise ConfigError("config_missing_field", "model", key=keys[0])
        return default

    def bool(self, key: str, default: bool) -> bool:
        v = self.c.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError("config_bad_value", "model", key=key, detail=repr(v))
        return v

    def float(self, key: str, default: float | None) -> float | None:
        v = self.c.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError("config_bad_value", "model", key=key, detail=repr(v))
        return float(v)

    def str(self, *keys: str, default: str) -> str:
        for key in keys:
            v = self.c.get(key)
            if isinstance(v, str):
                return v
        return default


def _attention_shape(r: _Reader, heads_key: str = "num_attention_heads") -> tuple[int, int, int, int]:
    h = r.int("hidden_size")
    nh = r.int(heads_key)
    nkv = r.int("num_key_value_heads", default=nh)
    head_dim = r.int("head_dim", default=h // nh)
    if nh % nkv:
        raise ConfigError("config_bad_value", "model", key="num_key_value_heads", detail=f"{nh} % {nkv} != 0")
    return h, nh, nkv, head_dim


def _qkvo(h: int, nh: int, nkv: int, d: int, qkv_bias: bool, o_bias: bool) -> tuple[Linear, ...]:
    return (
        Linear("q_proj", h, nh * d, qkv_bias),
        Linear("k_proj", h, nkv * d, qkv_bias),
        Linear("v_proj", h, nkv * d, qkv_bias),
        Linear("o_proj", nh * d, h, o_bias),
    )


def _gated_mlp(h: int, f: int, bias: bool) -> tuple[Linear, ...]:
    return (
        Linear("gate_proj", h, f, bias, role="mlp"),
        Linear("up_proj", h, f, bias, role="mlp"),
        Linear("down_proj", f, h, bias, role="mlp"),
    )


def _sliding(r: _Reader, layers: int) -> tuple[int | None, int]:
    window = r.c.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return None, 0
    layer_types = r.c.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return window, sum(1 for t in layer_types if t == "sliding_attention")
    if r.model_type in ("mistral", "mixtral", "qwen2", "qwen3"):
        if r.model_type in ("qwen2", "qwen3") and not r.bool("use_sliding_window", False):
            return None, 0
        return window, layers
    if r.model_type == "gemma2":  # NOTE: Gemma 2 alternates sliding / global, starting with sliding
        return window, (layers + 1) // 2
    if r.model_type == "gemma3_text":  # NOTE: Gemma 3: 5 local layers for every global one
        pattern = r.int("sliding_window_pattern", default=6)
        return window, layers - layers // pattern
    return None, 0


def _llama(r: _Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = _attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    mt = r.model_type
    if mt == "qwen2":  # NOTE: Qwen2 has biases on q, k, v only
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = r.bool("attention_bias", False)
    mlp_bias = r.bool("mlp_bias", False)
    window, sliding_layers = _sliding(r, layers)
    return ModelSpec(
        model_type=mt,
        family="llama",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        qk_norm="head" if mt == "qwen3" else "none",
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_linears=_qkvo(h, nh, nkv, d, qkv_bias, o_bias) + _gated_mlp(h, f, mlp_bias),
        sliding_window=window,
        sliding_layers=sliding_layers,
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _olmo2(r: _Reader, name: str) -> ModelSpec:
    spec = _llama(r, name)
    # NOTE: OLMo 2 normalises after attention and MLP (post-norms), and q/k over the full projection.
    from dataclasses import replace

    qkv_bias = r.bool("attention_bias", False)
    h, nh, nkv, d = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
    return replace(
        spec,
        model_type="olmo2",
        family="olmo2",
        qk_norm="full",
        layer_linears=_qkvo(h, nh, nkv, d, qkv_bias, qkv_bias) + _gated_mlp(h, spec.intermediate_size, False),
    )


def _gemma(r: _Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = _attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    mt = r.model_type
    bias = r.bool("attention_bias", False)
    window, sliding_layers = _sliding(r, layers)
    return ModelSpec(
        model_type=mt,
        family="gemma",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        # NOTE: Gemma 2 and 3 wrap attention and MLP in pre- and post-norms: 4 per layer.
        norms_per_layer=2 if mt == "gemma" else 4,
        qk_norm="head" if mt == "gemma3_text" else "none",
        activation=r.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=8192),
        layer_linears=_qkvo(h, nh, nkv, d, bias, bias) + _gated_mlp(h, f, False),
        sliding_window=window,
        sliding_layers=sliding_layers,
        final_logit_softcapping=r.float("final_logit_softcapping", None),
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _mixtral(r: _Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = _attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    experts = r.int("num_local_experts")
    top_k = r.int("num_experts_per_tok", default=2)
    window, sliding_layers = _sliding(r, layers)
    # NOTE: transformers 5 stores the experts as two 3-D parameters (gate_up_proj, down_proj) and
    # the router as a bare weight: none of them is an nn.Linear that LoRA or bnb would replace.
    moe = (
        Linear("router", h, experts, False, is_module=False, role="router"),
        Linear("experts.gate_up_proj", h, 2 * f, False, copies=experts, is_module=False, role="expert"),
        Linear("experts.down_proj", f, h, False, copies=experts, is_module=False, role="expert"),
    )
    return ModelSpec(
        model_type="mixtral",
        family="mixtral",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=32768),
        layer_linears=_qkvo(h, nh, nkv, d, False, False) + moe,
        num_experts=experts,
        experts_per_token=top_k,
        sliding_window=window,
        sliding_layers=sliding_layers,
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _phi3(r: _Reader, name: str) -> ModelSpec:
    h, nh, nkv, d = _attention_shape(r)
    f = r.int("intermediate_size")
    layers = r.int("num_hidden_layers")
    window, sliding_layers = _sliding(r, layers)
    rotary = int(d * (r.float("partial_rotary_factor", 1.0) or 1.0))
    # NOTE: Phi-3 fuses q, k, v into qkv_proj and gate, up into gate_up_proj.
    linears = (
        Linear("qkv_proj", h, (nh + 2 * nkv) * d, False),
        Linear("o_proj", nh * d, h, False),
        Linear("gate_up_proj", h, 2 * f, False, role="mlp"),
        Linear("down_proj", f, h, False, role="mlp"),
    )
    return ModelSpec(
        model_type="phi3",
        family="phi3",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        activation=r.str("hidden_act", default="silu"),
        rotary_dim=rotary,
        max_positions=r.int("max_position_embeddings", default=4096),
        layer_linears=linears,
        sliding_window=window,
        sliding_layers=sliding_layers,
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        hidden_dropout=r.float("resid_pdrop", 0.0) or 0.0,
        embedding_dropout=r.float("embd_pdrop", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _gpt2(r: _Reader, name: str) -> ModelSpec:
    h = r.int("n_embd", "hidden_size")
    nh = r.int("n_head", "num_attention_heads")
    layers = r.int("n_layer", "num_hidden_layers")
    f = r.int("n_inner", default=4 * h)
    # NOTE: GPT-2 uses Conv1D modules; PEFT targets them as c_attn, c_proj (attention and MLP), c_fc.
    linears = (
        Linear("c_attn", h, 3 * h, True),
        Linear("c_proj", h, h, True),
        Linear("c_fc", h, f, True, role="mlp"),
        Linear("c_proj", f, h, True, role="mlp"),
    )
    return ModelSpec(
        model_type="gpt2",
        family="gpt2",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nh,
        head_dim=h // nh,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        norm="layernorm",
        norm_bias=True,
        mlp="plain",
        activation=r.str("activation_function", default="gelu_new"),
        position="learned",
        rotary_dim=0,
        max_positions=r.int("n_positions", "max_position_embeddings", default=1024),
        layer_linears=linears,
        attention_dropout=r.float("attn_pdrop", 0.1) or 0.0,
        hidden_dropout=r.float("resid_pdrop", 0.1) or 0.0,
        embedding_dropout=r.float("embd_pdrop", 0.1) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _gpt_neox(r: _Reader, name: str) -> ModelSpec:
    h, nh, _, d = _attention_shape(r)
    f = r.int("intermediate_size", default=4 * h)
    layers = r.int("num_hidden_layers")
    bias = r.bool("attention_bias", True)
    rotary_pct = r.float("rotary_pct", None)
    if rotary_pct is None:
        rope = r.c.get("rope_parameters") or {}
        rotary_pct = float(rope.get("partial_rotary_factor", 0.25)) if isinstance(rope, Mapping) else 0.25
    linears = (
        Linear("query_key_value", h, 3 * h, bias),
        Linear("dense", h, h, bias),
        Linear("dense_h_to_4h", h, f, True, role="mlp"),
        Linear("dense_4h_to_h", f, h, True, role="mlp"),
    )
    return ModelSpec(
        model_type="gpt_neox",
        family="gpt_neox",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nh,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", False),
        norm="layernorm",
        norm_bias=True,
        mlp="plain",
        activation=r.str("hidden_act", default="gelu"),
        parallel_block=r.bool("use_parallel_residual", True),
        rotary_dim=int(d * rotary_pct),
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_linears=linears,
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        hidden_dropout=r.float("hidden_dropout", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


def _falcon(r: _Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size")
    nh = r.int("num_attention_heads", "n_head")
    d = h // nh
    layers = r.int("num_hidden_layers", "n_layer")
    new_arch = r.bool("new_decoder_architecture", False)
    multi_query = r.bool("multi_query", True)
    if new_arch:
        nkv = r.int("num_kv_heads", default=nh)
    else:
        nkv = 1 if multi_query else nh
    qkv_out = (nh + 2 * nkv) * d if (new_arch or multi_query) else 3 * h
    bias = r.bool("bias", False)
    f = r.int("ffn_hidden_size", default=4 * h)
    parallel = r.bool("parallel_attn", True)
    if new_arch:
        norms = r.int("num_ln_in_parallel_attn", default=2)
    else:
        norms = 1 if parallel else 2
    if r.bool("alibi", False):
        raise ConfigError("unsupported_feature", "model", feature="alibi")
    # NOTE: FalconLinear subclasses nn.Linear, which transformers' bitsandbytes integration does not
    # replace (`type(module) is nn.Linear`): under QLoRA Falcon keeps its weights (in fp32).
    linears = (
        Linear("query_key_value", h, qkv_out, bias, quantizable=False),
        Linear("dense", h, h, bias, quantizable=False),
        Linear("dense_h_to_4h", h, f, bias, role="mlp", quantizable=False),
        Linear("dense_4h_to_h", f, h, bias, role="mlp", quantizable=False),
    )
    return ModelSpec(
        model_type="falcon",
        family="falcon",
        hidden_size=h,
        num_layers=layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", True),
        norm="layernorm",
        norm_bias=True,
        norms_per_layer=norms,
        mlp="plain",
        activation=r.str("activation", default="gelu"),
        parallel_block=parallel,
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_linears=linears,
        attention_dropout=r.float("attention_dropout", 0.0) or 0.0,
        hidden_dropout=r.float("hidden_dropout", 0.0) or 0.0,
        name=name,
        config=dict(r.c),
    )


_BUILDERS: dict[str, Callable[[_Reader, str], ModelSpec]] = {
    "llama": _llama,
    "olmo2": _olmo2,
    "gemma": _gemma,
    "mixtral": _mixtral,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
}
