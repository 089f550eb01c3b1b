"""Loss kernels on the trace: torchtune's chunked cross-entropy traced on models with a big vocabulary,
against the analytic estimate (``--loss chunked``); the Triton kernels refused with a typed error."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.errors import CabeError
from cabe.trace.engine import trace_step
from cabe.training import TrainingSetup

pytestmark = pytest.mark.trace

# a trained, tied bf16 lm_head, no autocast: the chunked head's gradient moment decides the peak
GEMMA3_FULL = dict(
    method="full",
    dtype="bf16",
    autocast="none",
    optimizer="sgd-momentum",
    attention="eager",
    batch=4,
    seq=128,
    loss="chunked",
)

# Traced 2026-12-04 (transformers 5.24, torch 2.13): estimate vs trace peak, each within 0.15%.
CASES = {
    # 151,936-token vocabulary; 8 chunks of 64 positions
    "qwen-lora": ("qwen2.5-0.5b", dict(method="lora", dtype="bf16", batch=2, seq=512, loss="chunked")),
    # uneven chunks (tensor_split of 700 into 5), full fine-tuning, lm_head trains
    "qwen-full-uneven": (
        "qwen2.5-0.5b",
        dict(method="full", dtype="bf16", batch=3, seq=700, loss="chunked", loss_chunks=5),
    ),
    # 262,144-token vocabulary, chunks that do not divide the sequence
    "gemma3-lora": ("gemma-3-1b", dict(method="lora", dtype="bf16", batch=2, seq=256, loss="chunked", loss_chunks=3)),
    # Gemma 2 soft-caps its logits: the trace caps each chunk (a list cannot be divided; it failed before)
    "gemma2-softcap-lora": (
        "gemma-2-2b",
        dict(method="lora", dtype="bf16", batch=2, seq=256, attention="eager", loss="chunked", loss_chunks=4),
    ),
    # a trained, tied lm_head in bf16: its weight gradient summed across chunks (three at once) while the
    # logits gradients of the chunks not yet reached wait (analytic._chunked_head_grads); 2 and 16 chunks
    "gemma3-full-2": ("gemma-3-1b", GEMMA3_FULL | dict(loss_chunks=2)),
    "gemma3-full-16": ("gemma-3-1b", GEMMA3_FULL | dict(loss_chunks=16)),
    # fp32 weights under bf16 autocast, trained tied head: the chunks' gradients are the cached bf16 copy's,
    # summed three at once in its ToCopyBackward0's buffer (seed 610805395: -2.7% without them; 5.05 GB)
    "gpt2-medium-autocast-copy": (
        "gpt2-medium",
        dict(method="full", dtype="fp32", autocast="bf16", optimizer="sgd-momentum", batch=4, seq=128)
        | dict(loss="chunked", loss_chunks=8),
    ),
    # QLoRA: autocast casts the fp32 (k-bit prepared) tied lm_head once per chunk, each copy saved
    "llama-qlora-ckpt": (
        "llama-3.2-1b",
        dict(method="qlora", batch=2, seq=512, checkpointing=True, loss="chunked"),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_loss_estimate_matches_trace(case):
    name, kw = CASES[case]
    src = models.preset(name)
    setup = TrainingSetup(**kw)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.005


def test_chunked_loss_saves_the_upcast():
    """qwen2.5-0.5b LoRA, b=2, s=512 (1,024 tokens, V = 151,936, bf16 logits): transformers' loss holds
    logits + fp32 upcast + log-softmax = (2 + 4 + 4)·V per token at the loss; the chunked loss upcasts one
    chunk (64 positions × 2 sequences) at a time: 2·V + 4·V per token + 4·V·128 — the trace agrees to 0.1%."""
    src = models.preset("qwen2.5-0.5b")
    setup = TrainingSetup(method="lora", dtype="bf16", batch=2, seq=512, loss="chunked")
    traced = fake_trace(src.config, setup)
    v, tokens = 151936, 1024
    assert traced.components["logits"] == pytest.approx(6 * v * tokens + 4 * v * 128, rel=1e-3)
    hf = fake_trace(src.config, TrainingSetup(method="lora", dtype="bf16", batch=2, seq=512))
    assert hf.components["logits"] == pytest.approx(12 * v * tokens, rel=1e-3)  # at the head's backward


@pytest.mark.parametrize("loss", ["liger", "cce"])
def test_triton_losses_are_refused(loss):
    src = models.preset("qwen2.5-0.5b")
    with pytest.raises(CabeError) as err:
        trace_step(src.config, TrainingSetup(method="lora", batch=1, seq=64, loss=loss))
    assert err.value.code == "loss_not_traceable"
    assert err.value.field == "loss"
