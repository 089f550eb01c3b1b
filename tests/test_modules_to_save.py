"""``modules_to_save``: PEFT's whole modules trained beside the adapters (issue 11: unsloth's ``embed_tokens`` among
``target_modules``, LLaMA-Factory's ``additional_target``). ``ModulesToSaveWrapper`` keeps the original frozen and
trains a deep copy in the original's dtype (peft 0.21.2 utils/other.py:632-663). Traced in
tests/trace/test_modules_to_save_trace.py."""

import pytest

from cabe import api, models
from cabe.analytic import estimate_model
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup

MISTRAL = models.preset("mistral-7b-v0.1").spec  # untied: embed_tokens and lm_head 32,000 x 4,096 each
VH = 32000 * 4096


def _states(**kw):
    rep = estimate_model(MISTRAL, TrainingSetup(method="lora", dtype="bf16", **kw))
    return rep.trainable_parameters, rep.components["weights"], rep.components["optimizer"]


@pytest.mark.parametrize("saved", [("embed_tokens",), ("lm_head",), ("embed_tokens", "lm_head")])
def test_a_trainable_copy_with_its_optimizer_state(saved):
    base_train, base_weights, base_opt = _states()
    train, weights, opt = _states(modules_to_save=saved)
    n = len(saved)
    assert train - base_train == n * VH
    assert weights - base_weights == n * 2 * VH  # the copy in the original's bf16, beside the frozen original
    assert opt - base_opt == n * 2 * 2 * VH  # AdamW's two moments in the parameter's dtype (zeros_like(p))


def test_the_copy_follows_the_rest_of_the_model_under_qlora():
    # after prepare_model_for_kbit_training the embedding is fp32, and PEFT copies it as it is; without it bf16
    on = estimate_model(MISTRAL, TrainingSetup(method="qlora", modules_to_save=("embed_tokens",)))
    off = estimate_model(MISTRAL, TrainingSetup(method="qlora", kbit_prep=False, modules_to_save=("embed_tokens",)))
    base_on = estimate_model(MISTRAL, TrainingSetup(method="qlora"))
    base_off = estimate_model(MISTRAL, TrainingSetup(method="qlora", kbit_prep=False))
    assert on.components["weights"] - base_on.components["weights"] == 4 * VH
    assert off.components["weights"] - base_off.components["weights"] == 2 * VH


@pytest.mark.parametrize(
    ("model", "body", "code"),
    [
        ("mistral-7b-v0.1", {"modules_to_save": "score"}, "modules_to_save_unknown"),
        (
            "mistral-7b-v0.1",
            {"modules_to_save": "lm_head", "lora_targets": "q_proj,lm_head"},
            "modules_to_save_adapted",
        ),
        ("llama-3.2-1b", {"modules_to_save": "embed_tokens"}, "modules_to_save_tied"),
        ("mistral-7b-v0.1", {"modules_to_save": "embed_tokens", "method": "full"}, "not_for_method"),
    ],
)
def test_refusals(model, body, code):
    with pytest.raises(InvalidValueError) as e:
        api.estimate_json({"model": model, "method": "lora", **body})
    assert (e.value.code, e.value.field) == (code, "modules_to_save")


def test_unsloth_run_reads_embed_tokens_as_saved(tmp_path):
    from cabe import configs

    src = configs.read_source(
        {
            "from_pretrained": {"model_name": "unsloth/mistral-7b-v0.3-bnb-4bit"},
            "get_peft_model": {"target_modules": ["q_proj", "v_proj", "embed_tokens", "lm_head"]},
        }
    )
    assert src.fields["modules_to_save"] == ("embed_tokens",) and "lm_head" in src.fields["lora_targets"]


def test_an_fp16_copy_under_fp16_autocast_is_refused():
    # GradScaler.unscale_ refuses fp16 gradients (the trace fails with "Attempting to unscale FP16 gradients")
    with pytest.raises(InvalidValueError) as e:
        api.estimate_json(
            {
                "model": "mistral-7b-v0.1",
                "method": "lora",
                "dtype": "fp16",
                "autocast": "fp16",
                "modules_to_save": "embed_tokens",
            }
        )
    assert e.value.code == "fp16_weights_fp16_autocast"
    # after k-bit preparation the copy is fp32: accepted
    ok = {"model": "mistral-7b-v0.1", "method": "qlora", "compute_dtype": "fp16", "autocast": "fp16"}
    assert api.estimate_json({**ok, "modules_to_save": "embed_tokens"})["total_bytes"] > 0
