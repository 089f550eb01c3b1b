"""``--lora-targets all-linear,lm_head``: PEFT reads ``all-linear`` only as the whole ``target_modules`` string, so
the trace expands it with PEFT's own ``_maybe_include_all_linear_layers`` before adding the other names (issue 10,
a fresh seed's phi-3-mini row: the trace adapted lm_head alone and read 9.3 GB against the estimate's 29.2 GB)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import fake_trace

from cabe import models
from cabe.analytic import estimate_model
from cabe.training import TrainingSetup

pytestmark = [pytest.mark.trace, pytest.mark.slow]


@pytest.mark.parametrize("targets", [("all-linear", "lm_head"), ("all-linear", "embed_tokens", "lm_head")])
def test_all_linear_beside_other_names_adapts_every_linear_layer(targets):
    src = models.preset("phi-3-mini")
    setup = TrainingSetup(
        method="lora", dtype="bf16", autocast="bf16", optimizer="sgd", attention="flash", batch=2, seq=256,
        lora_targets=targets,
    )  # fmt: skip
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    # 32 layers x (qkv 3072->9216, o 3072->3072, gate_up 3072->16384, down 8192->3072) at r = 8, plus the head's
    # lm_head (3072 -> 32064) and, when named, the embedding's adapters: the same count on both sides
    assert traced.trainable_parameters == est.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.005, (est.total_bytes, traced.peak_bytes)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_an_adapted_lm_head_alone_carries_no_gradient_through_the_layers(checkpointing):
    # without checkpointing nothing below the head requires grad (+23% when every layer was in the gradient's
    # path); with it, enable_input_require_grads makes every layer's input a leaf that requires grad
    src = models.preset("phi-3-mini")
    setup = TrainingSetup(
        method="lora", dtype="bf16", autocast="bf16", optimizer="sgd", attention="flash", batch=2, seq=256,
        lora_targets=("lm_head",), checkpointing=checkpointing,
    )  # fmt: skip
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup).total_bytes
    assert abs(est - traced.peak_bytes) / traced.peak_bytes < 0.005, (est, traced.peak_bytes)


def test_all_linear_beside_other_names_reaches_the_fused_experts():
    """Qwen3-MoE: ``all-linear`` alone resolves to the attention's linears plus the v4 expert and router names
    (peft 0.21.2 utils/transformers_weight_conversion.py:364-373), which PEFT moves onto the fused 3-D expert
    parameters; expanded beside ``embed_tokens`` the trace reached only the linears (18.6M trainable against the
    estimate's 674M on the 235B-A22B's widths, +30% on seed 2424)."""
    from cabe.models import from_mapping

    src = from_mapping({**models.preset("qwen3-30b-a3b").config, "num_hidden_layers": 2}, "qwen3-30b-a3b-2l")
    setup = TrainingSetup(
        method="lora", dtype="bf16", autocast="bf16", optimizer="sgd", attention="sdpa", batch=1, seq=256,
        checkpointing=True, lora_targets=("all-linear", "embed_tokens"),
    )  # fmt: skip
    traced = fake_trace(src.config, setup)
    est = estimate_model(src.spec, setup)
    assert traced.trainable_parameters == est.trainable_parameters
    assert abs(est.total_bytes - traced.peak_bytes) / traced.peak_bytes < 0.01, (est.total_bytes, traced.peak_bytes)
