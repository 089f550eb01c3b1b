"""``trainable_fp32``: freeze with the trained layers cast to fp32 and the frozen ones left as loaded, under autocast
(LLaMA-Factory's ``cast_trainable_params_to_fp32``, model/adapter.py:129-134, 337-349; issue 11). Traced in
tests/trace/test_trainable_fp32_trace.py."""

import pytest

from cabe import api, configs, models
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

QWEN = models.preset("qwen2.5-0.5b").spec


def test_the_trained_layers_weights_gradients_and_state_are_fp32():
    base = {"method": "freeze", "dtype": "bf16", "autocast": "bf16", "trainable_layers": 2}
    half = estimate_model(QWEN, TrainingSetup(**base))
    fp32 = estimate_model(QWEN, TrainingSetup(**base, trainable_fp32=True))
    # the two trained qwen2.5-0.5b layers: q, k, v, o, gate, up, down weights, q/k/v biases, 2 norms
    n = fp32.trainable_parameters
    assert n == half.trainable_parameters == 2 * (896 * 896 * 2 + 896 * 128 * 2 + 3 * 896 * 4864 + 1152 + 2 * 896)
    assert fp32.components["optimizer"] == pytest.approx(
        2 * half.components["optimizer"], rel=1e-3
    )  # AdamW: param dtype
    assert fp32.components["weights"] - half.components["weights"] == pytest.approx(2 * n, rel=0.01)


def test_needs_autocast():
    with pytest.raises(InvalidValueError) as e:
        TrainingSetup(method="freeze", dtype="bf16", autocast="none", trainable_fp32=True)
    assert e.value.code == "trainable_fp32_needs_autocast"
    with pytest.raises(InvalidValueError) as e:
        api.estimate_json({"model": "qwen2.5-0.5b", "method": "lora", "trainable_fp32": True})
    assert e.value.code == "not_for_method"


def test_llama_factory_freeze_reads_it():
    # adapter.py:129-134 unless pure_bf16; the recipe sets it for a --recipe llama-factory freeze run too
    on = configs.combine([configs.read_source({"finetuning_type": "freeze", "bf16": True})]).request
    assert on["trainable_fp32"] is True
    pure = configs.combine([configs.read_source({"finetuning_type": "freeze", "bf16": True, "pure_bf16": True})])
    assert pure.request["trainable_fp32"] is False
    out = api.estimate_json({"model": "qwen2.5-0.5b", "method": "freeze", "recipe": "llama-factory"})
    assert out["setup"]["trainable_fp32"] is True


def test_fp16_weights_under_fp16_autocast_train_when_the_layers_are_fp32():
    # GradScaler refuses fp16 gradients (fp16_weights_fp16_autocast); the trained layers' are fp32 here
    fp16 = {"model": "qwen2.5-0.5b", "method": "freeze", "dtype": "fp16", "autocast": "fp16"}
    with pytest.raises(InvalidValueError) as e:
        api.estimate_json(fp16)
    assert e.value.code == "fp16_weights_fp16_autocast"
    assert api.estimate_json({**fp16, "trainable_fp32": True})["total_bytes"] > 0
