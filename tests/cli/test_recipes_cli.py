"""``cabe recipes``: every recipe with what it sets (en / es), one recipe's facts with their sources, JSON."""

import json

from cabe.cli import main


def test_lists_every_recipe(capsys):
    assert main(["recipes", "--lang", "es"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Recetas")
    for name in ("hf-trainer", "trl-sft", "axolotl", "llama-factory", "torchtune", "unsloth", "litgpt"):
        assert name in out
    assert "loss=chunked, loss_chunks=8" in out  # torchtune's CEWithChunkedOutputLoss(num_output_chunks=8)


def test_one_recipe_shows_sources(capsys):
    assert main(["recipes", "torchtune"]) == 0
    out = capsys.readouterr().out
    assert "torchtune/modules/loss/ce_chunked_output_loss.py" in out
    # k-bit preparation off is modelled (--no-kbit-prep, set by the recipe); what is not says what it would take
    assert "kbit_prep=false" in out and "prepare_model_for_kbit_training" not in out.split("not modelled")[-1]
    # its bf16 adapters and its optimizer in backward are modelled now (--adapter-dtype model, set by the recipe)
    assert "adapter_dtype=model" in out and "not modelled" not in out
    assert main(["recipes", "trl-sft"]) == 0
    out = capsys.readouterr().out
    assert (
        "[not modelled: TRL's cast of a 4-bit model's trainable parameters to bf16" in out
        and "modelling it takes" in out
    )


def test_json_and_unknown_name(capsys):
    assert main(["recipes", "unsloth", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["unsloth"] and rows[0]["sets"]["loss"] == "liger"
    assert main(["recipes", "nope"]) == 2
    assert "recipe" in capsys.readouterr().err
