"""Every option acts or is refused (issue 12): a flag that does not apply to the chosen mode is one
sentence naming it (CLI exit 2, API 422), inputs beyond the model's limits are flagged."""

from __future__ import annotations

import json

import pytest

from cabe.cli import main


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["estimate", "--model", "llama-7b", "--activations-gb", "3"], "activations-gb belongs to the simple mode"),
        (["estimate", "--model", "llama-7b", "--bytes-per-param", "2"], "bytes-per-param belongs to the simple mode"),
        (["estimate", "--params", "7", "--method", "qlora"], "method: 'qlora' needs a model"),
        (["estimate", "--params", "7", "--lora-rank", "16"], "lora-rank applies to --method lora, qlora only"),
        # the lesson's formula reads the parameter count, precision, optimizer and activations only
        (["estimate", "--params", "7", "--batch", "8"], "batch has no effect with --params alone"),
        (["estimate", "--params", "7", "--checkpointing"], "checkpointing has no effect with --params alone"),
        (["estimate", "--params", "7", "--gpus", "4", "--shard", "zero3"], "gpus has no effect with --params alone"),
        # the simple mode (bytes per parameter given) reads not even the optimizer
        (
            ["estimate", "--params", "7", "--bytes-per-param", "16", "--optimizer", "lion"],
            "optimizer has no effect with --params alone",
        ),
        (["estimate", "--model", "llama-7b", "--lora-alpha", "32"], "lora-alpha applies to --method lora, qlora"),
        (["estimate", "--model", "llama-7b", "--method", "lora", "--quant", "fp4"], "quant applies to --method qlora"),
        (["estimate", "--model", "llama-7b", "--trainable-layers", "2"], "applies to --method freeze only"),
        (
            ["estimate", "--model", "llama-7b", "--method", "freeze", "--trainable-layers", "0"],
            "at least one trainable",
        ),
        (["estimate", "--model", "llama-7b", "--ep", "4"], "ep: expert parallelism (4) needs a mixture-of-experts"),
        # TRL's preference options with another objective, and what the preference trainers refuse (issue 33)
        (["estimate", "--model", "llama-7b", "--prompt-length", "64"], "prompt-length is an option of TRL's"),
        (
            ["estimate", "--model", "llama-7b", "--objective", "orpo", "--precompute-ref-log-probs"],
            "ORPO has no reference model",
        ),
        (
            ["estimate", "--model", "llama-7b", "--objective", "dpo", "--ref-model", "adapter-off"],
            "adapter-off is the PEFT base",
        ),
        (
            ["estimate", "--model", "mixtral-8x7b", "--ep", "4"],
            "must divide the 8 experts and the data-parallel size 1",
        ),
        (["estimate", "--model", "llama-7b", "--method", "lora", "--lora-targets", ""], "lora-targets needs at least"),
        (["infer", "--model", "llama-7b", "--prefill-chunk", "0"], "prefill-chunk must be between 1"),
        (["fit", "--model", "llama-7b", "--gpu", "h100-80gb", "--lora-rank", "32"], "lora-rank applies to"),
        (
            ["trace", "--model", "llama-7b", "--gpus", "8", "--shard", "zero3"],
            "shard: DeepSpeed's 'zero3'",  # (not installed: refused; installed: its fp16 refused)
        ),
    ],
)
def test_option_that_would_not_act_is_refused(capsys, argv, needle):
    assert main(argv + ["--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert needle in err, err


def test_lora_flags_act_with_lora(capsys):
    assert main(["estimate", "--model", "llama-7b", "--method", "lora", "--lora-rank", "16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["lora_rank"] == 16


def test_sequence_beyond_the_model_is_a_note(capsys):
    """llama-7b's max_position_embeddings is 2048: 4096 is computed, and flagged."""
    assert main(["estimate", "--model", "llama-7b", "--seq", "4096", "--json"]) == 0
    assert "seq_beyond_max_positions" in json.loads(capsys.readouterr().out)["notes"]
    assert main(["estimate", "--model", "llama-7b", "--seq", "2048", "--json"]) == 0
    assert "seq_beyond_max_positions" not in json.loads(capsys.readouterr().out)["notes"]
    assert main(["infer", "--model", "llama-7b", "--context", "8192", "--lang", "es"]) == 0
    assert "max_position_embeddings" in capsys.readouterr().out


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ({"hidden_size": 16, "num_attention_heads": 32}, "gives a head size of 0"),
        ({"num_attention_heads": 32, "num_key_value_heads": 5}, "bad value for 'num_key_value_heads'"),
    ],
)
def test_heads_that_do_not_divide(tmp_path, capsys, cfg, needle):
    base = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**base, **cfg}))
    assert main(["estimate", "--model", str(p), "--lang", "en"]) == 2
    assert needle in capsys.readouterr().err


def test_the_api_refuses_the_same():
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    with TestClient(create_app()) as c:
        r = c.post("/api/estimate", json={"model": "llama-7b", "activations_gb": 3})
        assert r.status_code == 422 and r.json()["error"]["code"] == "needs_params"
        r = c.post("/api/estimate", json={"model": "llama-7b", "method": "full", "lora_rank": 16})
        assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("not_for_method", "lora_rank")
        # the page's form holds every field: it sends only those the method uses, so it still answers
        r = c.get("/?model=llama-7b&method=full&lora_rank=16&quant=nf4&trainable_layers=1")
        assert r.status_code == 200 and "applies to --method" not in r.text


def test_a_default_sent_with_another_method_changes_nothing(capsys):
    """A whole form (the page, a script) carries every default: those pass; only a changed value that
    would not act is refused."""
    assert main(["estimate", "--model", "llama-7b", "--lora-rank", "8", "--quant", "nf4", "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "argv,field",
    [
        (["--galore-rank", "64"], "galore-rank"),
        (["--galore-targets", "attn"], "galore-targets"),
        # a recipe's optimizer (axolotl: AdamW) is not GaLore either
        (["--recipe", "axolotl", "--galore-rank", "32"], "galore-rank"),
        (["--optimizer", "adamw_8bit", "--galore-targets", "all-linear"], "galore-targets"),
    ],
)
def test_galore_knobs_without_a_galore_optimizer_are_refused(capsys, argv, field):
    """The HF Trainer reads optim_target_modules / optim_args' rank for its GaLore optims only
    (transformers trainer_optimizer.py:121, 370): given with another optimizer they would change nothing."""
    assert main(["estimate", "--model", "llama-7b", "--lang", "en", *argv]) == 2
    err = capsys.readouterr().err
    assert f"{field} is read by the GaLore optimizers only" in err and "Traceback" not in err
    assert main(["estimate", "--model", "llama-7b", "--lang", "es", *argv]) == 2
    assert "solo lo leen los optimizadores GaLore" in capsys.readouterr().err


def test_galore_knobs_act_with_galore_and_pass_at_their_default(capsys):
    argv = ["estimate", "--model", "llama-7b", "--json", "--optimizer", "galore_adamw"]
    assert main([*argv, "--galore-rank", "64"]) == 0
    low = json.loads(capsys.readouterr().out)["components"]["optimizer"]
    assert main([*argv, "--galore-targets", "attn"]) == 0
    attn_only = json.loads(capsys.readouterr().out)["components"]["optimizer"]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)["components"]["optimizer"]
    # rank 64 keeps less projected state than rank 128; the MLP outside the targets keeps full AdamW state
    assert low < default < attn_only
    # the defaults sent as a whole form does (rank 128, "attn,mlp" as a comma string) change nothing: passed
    assert main(["estimate", "--model", "llama-7b", "--galore-rank", "128", "--galore-targets", "attn,mlp"]) == 0
    capsys.readouterr()


def test_the_api_refuses_galore_knobs_without_galore():
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    with TestClient(create_app()) as c:
        r = c.post("/api/estimate", json={"model": "llama-7b", "galore_rank": 64})
        assert r.status_code == 422
        assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("galore_only", "galore_rank")
        r = c.post("/api/estimate", json={"model": "llama-7b", "optimizer": "adamw", "galore_targets": ["attn"]})
        assert (r.status_code, r.json()["error"]["code"]) == (422, "galore_only")
        r = c.post("/api/estimate", json={"model": "llama-7b", "optimizer": "galore_adamw", "galore_rank": 64})
        assert r.status_code == 200
        # the page's form holds every field: it sends GaLore's only with a GaLore optimizer, so it still answers
        r = c.get("/?model=llama-7b&optimizer=adamw&galore_rank=16")
        assert r.status_code == 200 and "GaLore optimizers only" not in r.text


def test_training_arguments_galore_keys_with_another_optim_have_no_effect():
    from cabe import configs

    data = {"optim": "adamw_torch", "optim_target_modules": ["attn"], "optim_args": "rank=64"}
    fields, used, ignored = configs.module("training_args").to_request(data)
    assert used == ["optim"] and "galore_rank" not in fields and "galore_targets" not in fields
    assert ignored == [("optim_target_modules", "no_effect"), ("optim_args", "no_effect")]
