"""Recipes as data: every file loads, states every topic with a source, and sets only fields cabe has,
with values the schema accepts; a recipe sets defaults and any explicit value wins."""

import pytest

from cabe import recipes, schema
from cabe.api import estimate_json, setup_from
from cabe.errors import InvalidValueError
from cabe.training import TrainingSetup


@pytest.mark.parametrize("name", recipes.NAMES)
def test_recipe_file(name):
    r = recipes.load(name)
    assert r["name"] == name and r["project"] and r["version"]
    assert tuple(f["topic"] for f in r["facts"]) == recipes.TOPICS
    for f in r["facts"]:
        assert f["source"] and f["value"]
        assert f["modelled"] or f["unmodelled"]
    for key, value in r["sets"].items():
        field = schema.field(key)
        assert field.name in {f.name for f in schema.SETUP_FIELDS}
        if field.choices:
            assert value in field.choices
    TrainingSetup(**schema.resolve_defaults({"recipe": name}))  # every set value validates


def test_recipe_names_match_files():
    from importlib import resources

    files = {
        p.name[:-5] for p in resources.files("cabe.data").joinpath("recipes").iterdir() if p.name.endswith(".json")
    }
    assert files == set(recipes.NAMES)
    assert schema.field("recipe").choices == recipes.NAMES


def test_recipe_sets_defaults_and_flags_win():
    s = setup_from({"recipe": "torchtune"})
    assert (s.dtype, s.autocast, s.loss, s.loss_chunks, s.optimizer_impl) == ("bf16", "none", "chunked", 8, "fused")
    s = setup_from({"recipe": "torchtune", "loss": "hf", "precision": "bf16-mixed"})
    assert (s.loss, s.dtype, s.autocast) == ("hf", "bf16", "bf16")
    assert setup_from({"recipe": "torchtune", "loss_chunks": 4}).loss_chunks == 4
    with pytest.raises(InvalidValueError) as e:  # transformers' loss reads no chunk count (tests/test_silent_knobs.py)
        setup_from({"recipe": "torchtune", "loss": "hf", "loss_chunks": 4})
    assert e.value.code == "chunked_only"
    assert setup_from({}).loss is None and setup_from({}).resolved_loss == "hf"
    # an optimizer given in place of the recipe's keeps its own implementation (PyTorch's pick)
    assert setup_from({"recipe": "torchtune", "optimizer": "sgd"}).optimizer_impl is None


def test_report_names_assumed_recipe_and_loss():
    out = estimate_json({"model": "qwen2.5-0.5b"})
    assert out["loss"] == {
        "recipe": None,
        "loss": "hf",
        "loss_chunks": None,
        "assumed": ["recipe", "loss"],
        "unmodelled": [],
    }
    assert "loss_assumed_hf" in out["notes"]
    out = estimate_json({"model": "qwen2.5-0.5b", "recipe": "unsloth", "method": "qlora"})
    assert out["loss"]["loss"] == "liger" and out["loss"]["assumed"] == []
    assert "loss_modelled" in out["notes"] and "kbit_preparation" not in out["loss"]["unmodelled"]  # --no-kbit-prep


def test_loss_kernels_order():
    """qwen2.5-0.5b LoRA, b=4 × s=1024 (V = 151,936): transformers' whole fp32 logits > torchtune's chunks
    > the fused kernels that never make the logits (logits component: 12·V per token for hf at the head)."""
    logits = {
        loss: estimate_json({"model": "qwen2.5-0.5b", "method": "lora", "batch": 4, "seq": 1024, "loss": loss})[
            "components"
        ].get("logits", 0)
        for loss in ("hf", "chunked", "liger", "cce")
    }
    assert logits["hf"] == 12 * 151936 * 4096
    assert logits["hf"] > logits["chunked"] > logits["liger"]
    assert logits["chunked"] > logits["cce"]


#: the recipes whose trainer leaves a 4-bit model's other weights as loaded (no prepare_model_for_kbit_training):
#: the Trainer and TRL's SFTTrainer (no call), torchtune (LoRALinear(quantize_base=True) alone), LitGPT (Fabric's
#: BitsandbytesPrecision alone), unsloth and LLaMA-Factory (their own preparation casts nothing but the adapters);
#: axolotl calls it (loaders/model.py:1143-1151). Sources in each recipe's kbit_preparation fact.
NO_KBIT_PREP = ("hf-trainer", "trl-sft", "torchtune", "unsloth", "litgpt", "llama-factory")


@pytest.mark.parametrize("name", recipes.NAMES)
def test_kbit_preparation_fact_is_modelled(name):
    """The fact sets --no-kbit-prep where the trainer does not prepare, and the QLoRA estimate follows it: the same
    as --no-kbit-prep given, not the same as --kbit-prep (norms, embeddings and lm_head in fp32 instead of bf16)."""
    r = recipes.load(name)
    fact = next(f for f in r["facts"] if f["topic"] == "kbit_preparation")
    assert fact["modelled"] and fact["field"] == "kbit_prep"
    assert r["sets"].get("kbit_prep", True) is (name not in NO_KBIT_PREP)
    ask = {"model": "llama-3.2-1b", "method": "qlora", "recipe": name, "batch": 1, "seq": 256}
    total = estimate_json(ask)["total_bytes"]
    same = estimate_json({**ask, "kbit_prep": name not in NO_KBIT_PREP})["total_bytes"]
    other = estimate_json({**ask, "kbit_prep": name in NO_KBIT_PREP})["total_bytes"]
    assert total == same != other
    # the fp32 cast of the 16-bit weights that stay (the 262 M-parameter tied embedding among them) costs more
    assert (total < other) is (name in NO_KBIT_PREP)


def test_litgpt_qlora_is_not_told_it_is_unmodelled():
    """`cabe recipes litgpt` listed k-bit preparation as not modelled although --no-kbit-prep exists (issue 29)."""
    out = estimate_json({"model": "llama-3.2-1b", "method": "qlora", "recipe": "litgpt"})
    assert "kbit_preparation" not in out["loss"]["unmodelled"]
    assert out["loss"]["unmodelled"] == []  # (its bf16-true adapters: --adapter-dtype model; its loss: --loss litgpt)


def test_torchtune_lora_adapters_are_in_the_model_dtype():
    """torchtune builds lora_a / lora_b in the model's bf16 (torchtune/modules/peft/lora.py:99): the recipe sets
    --adapter-dtype model, which halves the adapters, their gradients and their AdamW state against PEFT's fp32."""
    tt = estimate_json({"model": "llama-3.2-1b", "method": "lora", "recipe": "torchtune"})
    fp32 = estimate_json({"model": "llama-3.2-1b", "method": "lora", "recipe": "torchtune", "adapter_dtype": "fp32"})
    assert tt["setup"]["adapter_dtype"] == "model" and "adapter_dtype" not in tt["loss"]["unmodelled"]
    # (each state tensor rounded up to the allocator's 512 bytes: not exactly half)
    assert abs(tt["components"]["optimizer"] * 2 / fp32["components"]["optimizer"] - 1) < 0.01


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_unmodelled_fact_says_what_it_would_take(lang):
    """Each remaining "not modelled" names the mechanism and where it would go (a cabe file), and is worded in both
    languages; no catalog reason is left without a recipe that uses it."""
    import json
    from importlib import resources

    catalog = json.loads(resources.files("cabe").joinpath(f"i18n/{lang}/core.json").read_text(encoding="utf-8"))
    reasons = {k.split(".")[-1]: v for k, v in catalog.items() if k.startswith("recipe.unmodelled.")}
    used = {f["unmodelled"] for n in recipes.NAMES for f in recipes.load(n)["facts"] if not f["modelled"]}
    assert used == set(reasons)
    takes = "modelling it takes" if lang == "en" else "requiere"
    for code, text in reasons.items():
        assert takes in text and "cabe/" in text, (code, text)
