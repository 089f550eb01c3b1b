"""The trace runs causal LMs no family module reads: the built model's facts (trace.build.model_facts) and the
patches older modeling code needs (trace.patches: ``torch.tensor(data, device="cuda")``)."""

from __future__ import annotations

import pytest
from conftest import fake_trace

from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

#: GPT-Neo (no family module): its eager attention builds ``torch.tensor(mask_value, device=...)`` in every
#: layer (transformers 5.24 modeling_gpt_neo.py:120), which the fake mode never saw on a CPU-only build.
GPT_NEO = {
    "model_type": "gpt_neo",
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "attention_types": [[["global", "local"], 1]],
    "window_size": 16,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "intermediate_size": 128,
}
#: wte 256·64 + wpe 128·64; per layer: ln_1, ln_2 (2·2·64), q, k, v without bias (3·64·64), out_proj with
#: bias (64·64 + 64), c_fc (64·128 + 128), c_proj (128·64 + 64); ln_f 2·64; the lm_head tied to wte.
GPT_NEO_PARAMETERS = (
    256 * 64 + 128 * 64 + 2 * (4 * 64 + 3 * 64 * 64 + 64 * 64 + 64 + 64 * 128 + 128 + 128 * 64 + 64) + 128
)


def test_gpt_neo_traces_with_its_facts():
    res = fake_trace(dict(GPT_NEO), TrainingSetup(method="full", dtype="bf16", batch=1, seq=32))
    assert res.parameters == GPT_NEO_PARAMETERS == 91_264
    m = res.model
    assert (m["architecture"], m["num_layers"], m["hidden_size"], m["parameters"]) == (
        "GPTNeoForCausalLM",
        2,
        64,
        GPT_NEO_PARAMETERS,
    )
    assert m["tie_word_embeddings"] is True
    assert res.peak_bytes == sum(res.components.values()) > 0


def test_gpt_neo_freeze_finds_its_layers():
    res = fake_trace(dict(GPT_NEO), TrainingSetup(method="freeze", dtype="bf16", trainable_layers=1, batch=1, seq=32))
    # the top block: 2·2·64 + 3·64·64 + 64·64 + 64 + 64·128 + 128 + 128·64 + 64
    assert res.trainable_parameters == 4 * 64 + 3 * 64 * 64 + 64 * 64 + 64 + 64 * 128 + 128 + 128 * 64 + 64


#: Blenderbot's causal LM builds only the decoder: its ``num_hidden_layers`` is the encoder's count (3 here).
BLENDERBOT = {
    "model_type": "blenderbot",
    "d_model": 64,
    "encoder_layers": 3,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 1,
}


def test_freeze_finds_the_decoder_of_a_decoder_only_wrapper():
    res = fake_trace(
        dict(BLENDERBOT), TrainingSetup(method="freeze", dtype="bf16", trainable_layers=1, batch=1, seq=32)
    )
    assert res.model["num_layers"] == 2  # the decoder's list, found by its ``decoder_layers`` count
    # one BlenderbotDecoderLayer: self- and cross-attention q, k, v, o with biases 8·(64·64 + 64), fc1 64·128 + 128,
    # fc2 128·64 + 64, three LayerNorms 3·2·64 (the cross-attention's weights exist, unused without an encoder)
    assert res.trainable_parameters == 8 * (64 * 64 + 64) + 64 * 128 + 128 + 128 * 64 + 64 + 3 * 2 * 64
