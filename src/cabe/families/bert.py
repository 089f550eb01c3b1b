"""BERT: a post-LayerNorm encoder with bidirectional attention, planned as it is fine-tuned, with
``AutoModelForSequenceClassification`` (transformers ``models/bert/modeling_bert.py``).

Embeddings: word + learned absolute positions + token types, then a LayerNorm and dropout
(``BertEmbeddings``). Each layer: separate ``query``, ``key``, ``value`` (with biases) attending over
every token (no causal mask), the output ``dense``, dropout, then LayerNorm of the sum with the layer's
input (post-norm: ``BertSelfOutput``); a GELU MLP (``intermediate.dense`` h -> f, ``output.dense`` f -> h),
dropout, and a second post-LayerNorm. There is no final norm: the spec's final norm stands for the
embeddings' LayerNorm (the same 2·h parameters). On top: ``BertPooler`` (dense h -> h and tanh on the
first token) and a classifier h -> ``num_labels`` (``BertForSequenceClassification``), not an lm_head.

NOTE: cabe plans BERT with this head whatever the config's ``architectures`` says (the Hub's
checkpoints name ``BertForMaskedLM``); the masked-LM head (a vocabulary-wide decoder tied to the word
embeddings) is not modelled.

The eager attention (``eager_attention_forward``) takes the softmax without an fp32 upcast (fp32 under
autocast, which lists softmax), then dropout: as GPT-2's. PEFT's default LoRA targets for ``bert``
are ``query`` and ``value`` (peft/utils/constants.py).
"""

from __future__ import annotations

from cabe.architecture import ModelSpec
from cabe.families._common import Reader, decoder, groups
from cabe.layers import Linear

MODEL_TYPES = ("bert",)


def read(r: Reader, name: str) -> ModelSpec:
    h = r.int("hidden_size")
    nh = r.int("num_attention_heads")
    f = r.int("intermediate_size")
    linears = (
        Linear("query", h, h, True),
        Linear("key", h, h, True),
        Linear("value", h, h, True),
        Linear("dense", h, h, True, slot="o"),
        Linear("dense", h, f, True, role="mlp", slot="up"),
        Linear("dense", f, h, True, role="mlp", slot="down"),
    )
    id2label = r.c.get("id2label")
    labels = r.int("num_labels", default=len(id2label) if isinstance(id2label, dict) and id2label else 2)
    return decoder(
        r,
        name,
        "bert",
        (h, nh, nh, h // nh),
        f,
        tied=False,  # the classification head has no decoder to tie to the word embeddings
        norm="layernorm",
        norm_bias=True,
        norm_placement="post",
        activation=r.str("hidden_act", default="gelu"),
        position="learned",
        rotary_dim=0,
        max_positions=r.int("max_position_embeddings", default=512),
        layer_groups=groups(r.int("num_hidden_layers"), linears, "plain", None, 0),
        eager_softmax_fp32=False,
        attention_dropout=r.dropout("attention_probs_dropout_prob", 0.1),
        hidden_dropout=r.dropout("hidden_dropout_prob", 0.1),
        embedding_dropout=r.dropout("hidden_dropout_prob", 0.1),
        peft_default_targets=("query", "value"),
        embedding_name="word_embeddings",  # the module PEFT targets (transformers' modeling_bert.py)
        head="sequence_classification",
        num_labels=labels,
        token_types=r.int("type_vocab_size", default=2),
    )
