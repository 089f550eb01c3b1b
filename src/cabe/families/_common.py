"""What family modules share: typed access to ``config.json`` and the usual building blocks."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.layers import LayerGroup, Linear


def config_section(c: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A nested config (``text_config``, ``vision_config``): a copy of it, None when the key is absent or null,
    a typed error when it is not a mapping."""
    sub = c.get(key)
    if sub is None:
        return None
    if not isinstance(sub, Mapping):
        raise ConfigError("config_bad_value", "model", key=key, detail=type(sub).__name__)
    return dict(sub)


class Reader:
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

    def dropout(self, key: builtins.str, default: builtins.float = 0.0) -> builtins.float:
        return self.float(key, default) or 0.0


def attention_shape(r: Reader, heads_key: str = "num_attention_heads") -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head_dim) of a Llama-style config."""
    h = r.int("hidden_size")
    nh = r.int(heads_key)
    nkv = r.int("num_key_value_heads", default=nh)
    head_dim = r.int("head_dim", default=h // nh)
    if nh % nkv:
        raise ConfigError("config_bad_value", "model", key="num_key_value_heads", detail=f"{nh} % {nkv} != 0")
    return h, nh, nkv, head_dim


def qkvo(h: int, nh: int, nkv: int, d: int, qkv_bias: bool, o_bias: bool) -> tuple[Linear, ...]:
    """Separate q, k, v and o projections (PEFT names q_proj, k_proj, v_proj, o_proj)."""
    return (
        Linear("q_proj", h, nh * d, qkv_bias),
        Linear("k_proj", h, nkv * d, qkv_bias),
        Linear("v_proj", h, nkv * d, qkv_bias),
        Linear("o_proj", nh * d, h, o_bias, slot="o"),
    )


def gated_mlp(h: int, f: int, bias: bool) -> tuple[Linear, ...]:
    """SwiGLU / GeGLU: gate_proj and up_proj read the input, down_proj writes the output."""
    return (
        Linear("gate_proj", h, f, bias, role="mlp", slot="up"),
        Linear("up_proj", h, f, bias, role="mlp", slot="up"),
        Linear("down_proj", f, h, bias, role="mlp", slot="down"),
    )


def window(r: Reader) -> int | None:
    """The config's ``sliding_window`` when it is a positive integer."""
    w = r.c.get("sliding_window")
    return w if isinstance(w, int) and not isinstance(w, bool) and w > 0 else None


def listed_sliding_layers(r: Reader) -> int | None:
    """How many entries of ``layer_types`` are sliding, when the config lists them."""
    layer_types = r.c.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        return sum(1 for t in layer_types if t == "sliding_attention")
    return None


def groups(layers: int, linears: tuple[Linear, ...], mlp: str, win: int | None, sliding: int) -> tuple[LayerGroup, ...]:
    """``layers`` layers of the same tensors: full-attention ones, then ``sliding`` windowed ones."""
    sliding = min(sliding, layers)
    if win is None or sliding <= 0:
        return (LayerGroup(layers, linears, mlp),)
    out = []
    if layers - sliding > 0:
        out.append(LayerGroup(layers - sliding, linears, mlp))
    out.append(LayerGroup(sliding, linears, mlp, attention="sliding", window=win))
    return tuple(out)


def decoder(
    r: Reader,
    name: str,
    family: str,
    shape: tuple[int, int, int, int],
    f: int,
    *,
    tied: bool,
    **kinds: Any,
) -> ModelSpec:
    """The :class:`ModelSpec` every family builds: ``shape`` is (hidden, heads, kv heads, head_dim), ``f`` the
    MLP width, ``tied`` the default of ``tie_word_embeddings``; ``kinds`` are what the family sets beyond
    that (its layer groups, positions, norms and the rest of :class:`ModelSpec`)."""
    h, nh, nkv, d = shape
    return ModelSpec(
        model_type=r.model_type,
        family=family,
        hidden_size=h,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=d,
        intermediate_size=f,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", tied),
        name=name,
        config=dict(r.c),
        **kinds,
    )


#: PEFT 0.22.0's target renames for transformers 5's fused MoE layouts (peft/utils/transformers_weight_conversion.py,
#: ``_MOE_TARGET_MODULE_MAPPING``): the v4 name a user targets -> the bare parameter's Linear name in cabe's layer.
#: Which model types get which pattern: transformers' conversion_mapping.py ``_MODEL_TO_CONVERSION_PATTERN``.
QWEN2_MOE_PEFT_PARAMETERS = (
    ("gate", "gate"),
    ("gate_proj", "experts.gate_up_proj"),
    ("up_proj", "experts.gate_up_proj"),
    ("down_proj", "experts.down_proj"),
)
MIXTRAL_PEFT_PARAMETERS = (
    ("gate", "router"),
    ("w1", "experts.gate_up_proj"),
    ("w3", "experts.gate_up_proj"),
    ("w2", "experts.down_proj"),
)
