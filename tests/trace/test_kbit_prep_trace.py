"""QLoRA without ``prepare_model_for_kbit_training`` (``--no-kbit-prep``: unsloth's and LLaMA-Factory's QLoRA): the
trace loads the 4-bit model as before and skips PEFT's preparation, so norms, embeddings and lm_head stay in the
compute dtype; the estimate counts the dtypes of LoRA on a 16-bit base with 4-bit linear weights (issue 11)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]

CASES = [
    # RMSNorm keeps the residual 16-bit: a 4-bit q_proj's adapter reads its bf16 input as it is (PEFT's bnb layer
    # skips the fp32 cast under autocast) and saves it once for q and v (+22% when counted as the prepared model)
    ("qwen2.5-0.5b", {}),
    ("qwen2.5-0.5b", {"lora_targets": ("all-linear",), "lora_dropout": 0.1}),  # the dropped bf16 copies
    ("qwen2.5-0.5b", {"compute_dtype": "fp16"}),  # fp16 weights under bf16 autocast: an fp32 residual (-16% before)
    ("qwen2.5-0.5b", {"lora_targets": ("all-linear",), "checkpointing": True}),
    # LayerNorm returns fp32 under autocast, the 4-bit MLP its input's fp32: the residual is fp32 again (-6.4% before)
    ("gpt2-medium", {}),
]


@pytest.mark.parametrize(("model", "extra"), CASES)
def test_qlora_without_kbit_preparation_matches_the_trace(model, extra):
    src = models.preset(model)
    setup = TrainingSetup(method="qlora", kbit_prep=False, optimizer="adamw", batch=2, seq=512, **extra)
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert traced.trainable_parameters == est.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005, (est.total_bytes, traced.peak_bytes)


@pytest.mark.parametrize("kbit_prep", [True, False])
def test_the_trace_casts_only_when_preparing(kbit_prep):
    # qwen2.5-0.5b QLoRA: PEFT's preparation casts the tied embedding (151,936 x 896), the 49 norms of 896 and the
    # q/k/v biases (24 x 1,152) to fp32; without it they stay in the compute dtype (bf16); the adapters are fp32
    from collections import Counter

    import torch

    from cabe.trace.build import build_model

    src = models.preset("qwen2.5-0.5b")
    model, _ = build_model(dict(src.config), TrainingSetup(method="qlora", kbit_prep=kbit_prep), [])
    found: Counter = Counter()
    for name, p in model.named_parameters():
        kind = next((k for k in ("lora", "norm", "bias", "embed") if k in name), "quantized")
        found[kind, p.dtype] += p.numel()
    rest = torch.float32 if kbit_prep else torch.bfloat16
    assert found == {
        ("embed", rest): 151936 * 896,
        ("norm", rest): 49 * 896,
        ("bias", rest): 24 * (896 + 128 + 128),
        ("lora", torch.float32): 540_672,
        ("quantized", torch.uint8): 178_913_280,  # the 4-bit weights, 0.5 B per parameter packed in uint8
    }
