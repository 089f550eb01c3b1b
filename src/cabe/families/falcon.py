"""Falcon: LayerNorm blocks (attention and MLP in parallel by default), fused query_key_value with
multi-query or grouped kv heads (v a view of the fused qkv output only in the classic layout). FalconLinear subclasses nn.Linear,
which transformers' bitsandbytes integration does not replace (``type(module) is nn.Linear``): under
QLoRA Falcon keeps its weights. With one kv head, SDPA's call (a broadcast k/v head and a mask)
makes PyTorch pick its math kernel. PEFT targets query_key_value by default.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.errors import ConfigError
from cabe.families._common import Reader, decoder, groups
from cabe.layers import Linear

MODEL_TYPES = ("falcon",)


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size")
    nh = r.int("num_attention_heads", "n_head")
    d = h // nh
    new_arch = r.bool("new_decoder_architecture", False)
    multi_query = r.bool("multi_query", True)
    nkv = r.int("num_kv_heads", default=nh) if new_arch else (1 if multi_query else nh)
    qkv_out = (nh + 2 * nkv) * d if (new_arch or multi_query) else 3 * h
    bias = r.bool("bias", False)
    f = r.int("ffn_hidden_size", default=4 * h)
    parallel = r.bool("parallel_attn", True)
    norms = r.int("num_ln_in_parallel_attn", default=2) if new_arch else (1 if parallel else 2)
    if r.bool("alibi", False):
        raise ConfigError("unsupported_feature", "model", feature="alibi")
    linears = (
        Linear("query_key_value", h, qkv_out, bias, quantizable=False),
        Linear("dense", h, h, bias, quantizable=False, slot="o"),
        Linear("dense_h_to_4h", h, f, bias, role="mlp", quantizable=False, slot="up"),
        Linear("dense_4h_to_h", f, h, bias, role="mlp", quantizable=False, slot="down"),
    )
    return decoder(
        r,
        name,
        "falcon",
        (h, nh, nkv, d),
        f,
        tied=True,
        norm="layernorm",
        norm_bias=True,
        norms_per_layer=norms,
        activation=r.str("activation", default="gelu"),
        parallel_block=parallel,
        rotary_dim=d,
        max_positions=r.int("max_position_embeddings", default=2048),
        layer_groups=groups(r.int("num_hidden_layers", "n_layer"), linears, "plain", None, 0),
        # FalconAttention.forward as transformers 5.25 runs it (models/falcon/modeling_falcon.py 5.25.0:297-331):
        # q, k and v are views of the fused output in every layout (split / unbind / the grouped view), and the
        # kernels are the shared ones (ALL_ATTENTION_FUNCTIONS: eager with repeat_kv and an fp32 softmax, SDPA as
        # every model calls it). Before 5.25 Falcon ran its own (cabe.transformers_line._falcon_own: copies of k and
        # v, a softmax in the LayerNorm output's dtype, SDPA's math kernel for multi-query)
        value_is_qkv_view=True,
        attention_dropout=r.dropout("attention_dropout"),
        hidden_dropout=r.dropout("hidden_dropout"),
        peft_default_targets=("query_key_value",),
        module_prefixes=(("attn", "self_attention."), ("mlp", "mlp.")),  # FalconDecoderLayer.self_attention
        embedding_name="word_embeddings",  # the module PEFT targets (transformers' modeling_falcon.py)
    )
