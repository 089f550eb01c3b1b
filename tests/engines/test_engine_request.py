"""``cabe infer --engine`` and ``POST /api/infer`` with ``engine``: the answer per engine, refusals, both languages."""

from __future__ import annotations

import json

import pytest

from cabe.cli import main
from cabe.errors import InvalidValueError
from cabe.inference import infer_json


@pytest.mark.parametrize("engine", ["hf", "vllm", "sglang", "llamacpp"])
def test_every_engine_answers_tokens_and_sequences(engine):
    out = infer_json({"model": "llama-3.1-8b", "gpu": "h100", "context": 8192, "engine": engine})
    e = out["engine"]
    assert e["engine"] == engine and e["max_concurrent_sequences"] >= 1 and e["max_context"] >= 8192


def test_hf_is_the_solver():
    out = infer_json({"model": "llama-3.1-8b", "gpu": "l4", "context": 4096})
    assert out["engine"] == {
        "engine": "hf",
        "max_context": out["max_context"],
        "max_concurrent_sequences": out["max_batch"],
    }


def test_knobs_reach_the_engine():
    a = infer_json({"model": "llama-3.1-8b", "gpu": "h100", "engine": "vllm", "max_num_batched_tokens": 2048})
    b = infer_json({"model": "llama-3.1-8b", "gpu": "h100", "engine": "vllm"})
    assert a["engine"]["activation_profile_bytes"] < b["engine"]["activation_profile_bytes"]
    q = infer_json(
        {"model": "llama-3.1-8b", "gpu": "l4", "engine": "llamacpp", "weights": "gguf-q4_k_m", "cache_type_k": "q8_0"}
    )
    assert q["engine"]["cache_type_k"] == "q8_0"
    s = infer_json({"model": "llama-3.1-8b", "gpu": "h100", "engine": "sglang", "mem_fraction_static": 0.7})
    assert s["engine"]["mem_fraction_static"] == 0.7 and not s["engine"]["mem_fraction_static_auto"]


@pytest.mark.parametrize(
    "body,code",
    [
        ({"engine": "tgi", "gpu": "h100"}, "bad_choice"),
        ({"engine": "vllm", "gpu": "h100", "mem_fraction_static": 0.8}, "not_for_engine"),
        ({"engine": "sglang", "gpu": "h100", "n_ubatch": 256}, "not_for_engine"),
        ({"max_num_seqs": 8, "gpu": "h100"}, "not_for_engine"),  # engine hf by default
        ({"engine": "vllm"}, "engine_needs_gpu"),
    ],
)
def test_refusals(body, code):
    with pytest.raises(InvalidValueError) as e:
        infer_json({"model": "llama-3.1-8b", **body})
    assert e.value.code == code


def test_cli_text_both_languages_and_json(capsys):
    args = ["infer", "--model", "gemma-3-27b", "--gpu", "h100", "--context", "8192", "--engine", "vllm"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "KV cache groups: 7 of 10 layers" in text and "Maximum concurrency for 8,192 tokens per request" in text
    assert main([*args, "--lang", "es"]) == 0
    assert "Grupos de la caché KV: 7 de 10 capas" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"]["num_groups"] == 7
    assert (
        main(
            [
                "infer",
                "--model",
                "llama-3.1-8b",
                "--gpu",
                "rtx-4090",
                "--engine",
                "llamacpp",
                "-ctk",
                "q8_0",
                "-ngl",
                "20",
            ]
        )
        == 0
    )
    assert "K q8_0" in capsys.readouterr().out
    assert main(["infer", "--model", "llama-3.1-8b", "--engine", "sglang", "--n-batch", "64", "--gpu", "h100"]) == 2
