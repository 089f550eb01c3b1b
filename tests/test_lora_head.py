"""LoRA on the token embedding and the lm_head (issue 11): names, parameters, what they save, refusals.

PEFT 0.21 wraps an ``nn.Embedding`` in tuners/lora/layer.py ``Embedding`` (``lora_embedding_A`` r × vocab,
``lora_embedding_B`` hidden × r) and the lm_head in ``Linear`` (lora_A r × hidden, lora_B vocab × r)."""

import json

import pytest

from cabe import method, models
from cabe.analytic import estimate_model
from cabe.cli import main
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

QWEN = models.preset("qwen2.5-0.5b").spec  # h 896, vocab 151,936, 24 layers, tied embeddings
KW = dict(method="lora", batch=2, seq=128, lora_rank=16)


@pytest.mark.parametrize(
    ("model", "embedding", "head"),
    [
        ("qwen2.5-0.5b", "embed_tokens", "lm_head"),
        ("gpt2", "wte", "lm_head"),
        ("pythia-1.4b", "embed_in", "lm_head"),  # transformers 5 calls GPT-NeoX's head lm_head, not embed_out
        ("falcon-7b", "word_embeddings", "lm_head"),
        ("starcoderbase-1b", "wte", "lm_head"),
    ],
)
def test_each_family_names_its_embedding_and_head(model, embedding, head):
    spec = models.preset(model).spec
    assert method.head_module_names(spec) == (embedding, head)
    r = estimate_model(spec, TrainingSetup(**KW, lora_targets=(embedding, head)))
    h, v = spec.hidden_size, spec.vocab_size
    assert r.trainable_parameters == 16 * (v + h) * 2  # r · (in + out) for each of the two


def test_the_parameters_and_their_states():
    base = estimate_model(QWEN, TrainingSetup(**KW, precision="fp32", lora_targets=("q_proj",)))
    head = estimate_model(QWEN, TrainingSetup(**KW, precision="fp32", lora_targets=("q_proj", "lm_head")))
    extra = 16 * (896 + 151936)  # 2,445,312 parameters (as the trace's PEFT model counts them)
    assert head.trainable_parameters - base.trainable_parameters == extra
    # fp32 adapters (r × h = 57,344 B and V × r = 9,723,904 B, both multiples of 512): 4 B each, AdamW's two
    # fp32 moments 8 B
    assert head.components["weights"] - base.components["weights"] == extra * 4
    assert head.components["optimizer"] - base.components["optimizer"] == extra * 8


def test_what_the_lm_head_adapter_saves():
    """lora_A saves its input (the final norm's output) and lora_B lora_A's output: under bf16 autocast their
    16-bit casts, 2·h + 2·r per token; in fp32, 4·h + 4·r. They are counted with the head (the final norm's
    line), so the difference is all in the activations at the peak (the top layer's backward)."""
    for precision, per_token in (("bf16-mixed", 2 * 896 + 2 * 16), ("fp32", 4 * 896 + 4 * 16)):
        base = estimate_model(QWEN, TrainingSetup(**KW, precision=precision, lora_targets=("q_proj",)))
        head = estimate_model(QWEN, TrainingSetup(**KW, precision=precision, lora_targets=("q_proj", "lm_head")))
        assert head.components["activations"] - base.components["activations"] == 256 * per_token


def test_what_the_embedding_adapter_saves():
    """``after_A @ lora_embedding_B.T`` saves after_A: r values per token (bf16 under autocast) until backward
    reaches the embedding; autocast's cast of lora_embedding_B.T (h × r, bf16) is saved with it. And the
    embedding's output now requires grad, so layer 0's input RMSNorm saves its fp32 upcast and rsqrt (4·h + 4 per
    token), which it does not when that input needs no grad (q_proj alone: the norm runs outside autograd)."""
    base = estimate_model(QWEN, TrainingSetup(**KW, precision="bf16-mixed", lora_targets=("q_proj",)))
    emb = estimate_model(QWEN, TrainingSetup(**KW, precision="bf16-mixed", lora_targets=("q_proj", "embed_tokens")))
    assert emb.components["activations"] - base.components["activations"] == 256 * 16 * 2 + 256 * (4 * 896 + 4)
    assert emb.components["weight_copies"] - base.components["weight_copies"] == 896 * 16 * 2


def test_unknown_targets_list_the_embedding_and_head():
    with pytest.raises(InvalidValueError) as e:
        estimate_model(QWEN, TrainingSetup(**KW, lora_targets=("embed_out",)))
    assert e.value.code == "unknown_lora_target" and "embed_tokens, lm_head" in e.value.params["allowed"]
    # all-linear leaves the output layer out (PEFT), and the embedding is not a linear layer
    r = estimate_model(QWEN, TrainingSetup(**KW, lora_targets=("all-linear",)))
    assert not method.head_targets(QWEN, ("all-linear",)) and r.trainable_parameters == 8798208


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["--lora-targets", "lm_head", "--dora"], "lora_head_dora", "DoRA on lm_head"),
        (["--lora-targets", "embed_tokens,q_proj", "--dora"], "lora_head_dora", "DoRA on embed_tokens"),
        (["--lora-targets", "lm_head", "--loss", "liger"], "lora_head_loss", "LoRA on lm_head"),
        (["--lora-targets", "lm_head", "--recipe", "torchtune"], "lora_head_loss", "the chunked loss"),
    ],
)
def test_what_is_not_modelled_is_refused(capsys, argv, code, needle):
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--method", "lora", "--lang", "en", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    assert main(["estimate", "--model", "qwen2.5-0.5b", "--method", "lora", "--json", *argv]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == code


def test_the_api_takes_and_refuses_the_same():
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    body = {"model": "gpt2", "method": "lora", "lora_targets": ["c_attn", "wte", "lm_head"]}
    with TestClient(create_app()) as c:
        r = c.post("/api/estimate", json=body)
        assert r.status_code == 200 and r.json()["trainable_parameters"] == 294912 + 2 * 8 * (50257 + 768)
        r = c.post("/api/estimate", json={**body, "dora": True})
        assert (r.status_code, r.json()["error"]["code"]) == (422, "lora_head_dora")
