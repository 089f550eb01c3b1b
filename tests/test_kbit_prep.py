"""``kbit_prep``: whether QLoRA runs PEFT's prepare_model_for_kbit_training (issue 11). On (the default, TRL's and
axolotl's QLoRA) every parameter that is not 4-bit is cast to fp32; off (unsloth's and LLaMA-Factory's recipes) the
rest of the model stays in the compute dtype. The traced side is tests/trace/test_kbit_prep_trace.py."""

import pytest

from cabe import api, models
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.precision import dtypes_for
from cabe.training import TrainingSetup


def test_weights_lose_the_fp32_cast():
    # qwen2.5-0.5b: the tied embedding 151,936 x 896 (2 B less per value), 49 norms of 896 (fp32 3,584 B, bf16
    # 1,792 B rounded to 2,048: 1,536 less each) and 24 q biases of 896 (1,536 less each; k and v biases of 128
    # take one 512 B block either way)
    spec = models.preset("qwen2.5-0.5b").spec
    on = estimate_model(spec, TrainingSetup(method="qlora")).components["weights"]
    off = estimate_model(spec, TrainingSetup(method="qlora", kbit_prep=False)).components["weights"]
    assert on - off == 2 * 151936 * 896 + 49 * 1536 + 24 * 1536


def test_dtypes_are_lora_on_the_compute_dtype():
    off = dtypes_for(TrainingSetup(method="qlora", kbit_prep=False, compute_dtype="bf16"))
    lora = dtypes_for(TrainingSetup(method="lora", dtype="bf16", autocast="bf16"))
    assert off == lora
    assert (off.frozen, off.residual, off.adapter) == (2, 2, 4)
    on = dtypes_for(TrainingSetup(method="qlora"))
    assert (on.frozen, on.residual) == (4, 4)  # prepare_model_for_kbit_training's fp32


def test_recipes_turn_it_off_and_a_request_turns_it_back_on():
    for recipe in ("unsloth", "llama-factory"):
        out = api.estimate_json({"model": "qwen2.5-0.5b", "method": "qlora", "recipe": recipe})
        assert out["setup"]["kbit_prep"] is False and "qlora_no_kbit_prep" in out["notes"]
        assert "kbit_preparation" not in out["loss"]["unmodelled"]
    out = api.estimate_json({"model": "qwen2.5-0.5b", "method": "qlora", "recipe": "unsloth", "kbit_prep": True})
    assert out["setup"]["kbit_prep"] is True and "qlora_no_kbit_prep" not in out["notes"]
    assert api.estimate_json({"model": "qwen2.5-0.5b", "method": "qlora", "recipe": "axolotl"})["setup"]["kbit_prep"]


def test_only_qlora_reads_it():
    with pytest.raises(InvalidValueError) as e:
        api.estimate_json({"model": "qwen2.5-0.5b", "method": "lora", "kbit_prep": False})
    assert e.value.code == "not_for_method"
    # a recipe's default is no request: unsloth's LoRA run is not refused
    assert api.estimate_json({"model": "qwen2.5-0.5b", "method": "lora", "recipe": "unsloth"})["total_bytes"] > 0


def test_cli_flag(capsys):
    from cabe.cli import main

    assert main(["estimate", "--model", "qwen2.5-0.5b", "--method", "qlora", "--no-kbit-prep", "--json"]) == 0
    assert '"kbit_prep": false' in capsys.readouterr().out
