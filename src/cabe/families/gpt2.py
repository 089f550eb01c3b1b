"""GPT-2: LayerNorm blocks, learned positions, fused c_attn, a plain MLP (gelu_new), tied embeddings.

Its modules are Conv1D (weights stored transposed); PEFT targets them as c_attn, c_proj (attention
and MLP) and c_fc, c_attn by default. Its eager attention takes the softmax in the compute dtype.
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, decoder, groups
from cabe.layers import Linear

MODEL_TYPES = ("gpt2",)


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("n_embd", "hidden_size")
    nh = r.int("n_head", "num_attention_heads")
    f = r.int("n_inner", default=4 * h)
    linears = (
        Linear("c_attn", h, 3 * h, True),
        Linear("c_proj", h, h, True, slot="o"),
        Linear("c_fc", h, f, True, role="mlp", slot="up"),
        Linear("c_proj", f, h, True, role="mlp", slot="down"),
    )
    return decoder(
        r,
        name,
        "gpt2",
        (h, nh, nh, h // nh),
        f,
        tied=True,
        norm="layernorm",
        norm_bias=True,
        activation=r.str("activation_function", default="gelu_new"),
        position="learned",
        rotary_dim=0,
        max_positions=r.int("n_positions", "max_position_embeddings", default=1024),
        layer_groups=groups(r.int("n_layer", "num_hidden_layers"), linears, "plain", None, 0),
        eager_softmax_fp32=False,
        attention_dropout=r.dropout("attn_pdrop", 0.1),
        hidden_dropout=r.dropout("resid_pdrop", 0.1),
        embedding_dropout=r.dropout("embd_pdrop", 0.1),
        peft_default_targets=("c_attn",),
        module_prefixes=(("attn", "attn."), ("mlp", "mlp.")),
        conv1d=True,  # GaLore (trainer_optimizer.py:143) takes nn.Linear only
        embedding_name="wte",  # the module PEFT targets (transformers' modeling_gpt2.py)
    )
