"""GPTBigCode (SantaCoder, StarCoder, StarCoderBase): GPT-2's block with multi-query attention.

LayerNorm blocks (ln_1, attention, ln_2, MLP; biases everywhere), learned absolute positions (wpe), a plain
MLP (c_fc, ``gelu_pytorch_tanh`` — one fused op —, c_proj), tied embeddings. Unlike GPT-2 its projections are
``nn.Linear``, not Conv1D, and attention is multi-query when ``multi_query`` (the default): one key/value head
of ``head_dim`` for all query heads, so the fused ``c_attn`` is h -> h + 2·head_dim
(transformers 5.24, models/gpt_bigcode/modeling_gpt_bigcode.py, ``GPTBigCodeAttention.__init__``:
``kv_heads = 1 if multi_query else num_heads``; ``c_attn = nn.Linear(embed_dim, embed_dim + 2 * kv_dim)``).
q, k and v are views of c_attn's output (``split`` along the last dimension); attention runs through
transformers' attention interface (``_supports_sdpa``, ``_supports_flash_attn``): SDPA with ``enable_gqa``
when there is no mask, eager with ``repeat_kv`` and an fp32 softmax cast back.
PEFT targets ``c_attn`` by default (peft/utils/constants.py).
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, decoder, groups
from cabe.layers import Linear
from cabe.units import round_alloc

MODEL_TYPES = ("gpt_bigcode",)


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("n_embd", "hidden_size")
    nh = r.int("n_head", "num_attention_heads")
    d = h // nh
    nkv = 1 if r.bool("multi_query", True) else nh
    f = r.int("n_inner", default=4 * h)
    linears = (
        Linear("c_attn", h, h + 2 * nkv * d, True),
        Linear("c_proj", h, h, True, slot="o"),
        Linear("c_fc", h, f, True, role="mlp", slot="up"),
        Linear("c_proj", f, h, True, role="mlp", slot="down"),
    )
    return decoder(
        r,
        name,
        "gpt_bigcode",
        (h, nh, nkv, d),
        f,
        tied=True,
        norm="layernorm",
        norm_bias=True,
        activation=r.str("activation_function", default="gelu_pytorch_tanh"),
        position="learned",
        # models/gpt_bigcode/modeling_gpt_bigcode.py:203 (5.24): ``c_attn(hidden_states).unsqueeze(1).split(...)``
        # — query, key and value are views of the fused output (nothing rotates them)
        qkv_views=True,
        rotary_dim=0,
        max_positions=r.int("n_positions", "max_position_embeddings", default=1024),
        layer_groups=groups(r.int("n_layer", "num_hidden_layers"), linears, "plain", None, 0),
        attention_dropout=r.dropout("attn_pdrop", 0.1),
        hidden_dropout=r.dropout("resid_pdrop", 0.1),
        embedding_dropout=r.dropout("embd_pdrop", 0.1),
        peft_default_targets=("c_attn",),
        module_prefixes=(("attn", "attn."), ("mlp", "mlp.")),  # GPTBigCodeBlock: self.attn, self.mlp
        # models/gpt_bigcode/modeling_gpt_bigcode.py:381 (5.24): ``self.bias = nn.Buffer(torch.tril(torch.ones(
        # (max_positions, max_positions), dtype=torch.bool)), persistent=False)`` — 64 MiB at 8192 positions
        buffer_bytes=round_alloc(r.int("n_positions", "max_position_embeddings", default=1024) ** 2),
        embedding_name="wte",  # the module PEFT targets (transformers' modeling_gpt_bigcode.py)
    )
