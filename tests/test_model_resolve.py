"""A bundled preset's Hub id resolves to the preset without any network, on every interface.

The network is cut twice: ``HF_HUB_OFFLINE=1`` and a :func:`cabe.hub.fetch_bytes` that fails the test,
and huggingface_hub's cache is never consulted (``_cached_path`` fails the test too), so a pass means
the id was mapped to the preset before anything looked outside the package.
"""

from __future__ import annotations

import json

import pytest

import cabe
from cabe import api, hub, models
from cabe.cli import main

#: meta-llama/Llama-3.2-1B, the preset llama-3.2-1b: 1,235,814,400 parameters (its _cabe block, the
#: transformers meta-device count, tied embeddings).
HUB_ID = "meta-llama/Llama-3.2-1B"
PARAMS = 1_235_814_400


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError(f"the network was reached for {a!r}")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "fetch_bytes", refuse)
    monkeypatch.setattr(models, "_cached_path", refuse)


@pytest.mark.parametrize(
    "text,name",
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("META-LLAMA/llama-3.1-8b", "llama-3.1-8b"),  # the Hub's ids are case-insensitive
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),  # same architecture, other weights
        ("google/gemma-3-1b-it", "gemma-3-1b"),  # the -it sibling of the -pt preset
        ("google/gemma-3-4b-it", "gemma-3-4b-it"),  # multimodal as published: its own preset, vision counted
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("llama-3.1-8b", "llama-3.1-8b"),
    ],
)
def test_preset_for_id(text, name):
    assert models.preset_for_id(text) == name
    src = models.resolve(text)
    assert src.kind == "preset" and src.name == name


def test_other_ids_are_not_presets():
    assert models.preset_for_id("someone/llama-3.1-8b-but-pruned") is None
    assert models.preset_for_id("meta-llama/Llama-3.1-8") is None


def test_python_api():
    assert cabe.estimate(HUB_ID).parameters == PARAMS


def test_api_without_files():
    # the HTTP API's path (allow_files=False), with no Hub configured for the request
    assert api.build({"model": HUB_ID}).parameters == PARAMS


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--model", HUB_ID],
        ["fit", "--model", HUB_ID, "--gpu", "h100"],
        ["infer", "--model", HUB_ID],
        ["lora", "--model", HUB_ID],
    ],
    ids=lambda a: a[0],
)
def test_cli_commands(argv, capsys):
    # the answer for the Hub id is the answer for the preset's name, byte for byte
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert main([*[a if a != HUB_ID else "llama-3.2-1b" for a in argv], "--json"]) == 0
    by_name = json.loads(capsys.readouterr().out)
    out.pop("elapsed_ms", None), by_name.pop("elapsed_ms", None)  # fit times itself
    assert out == by_name
    assert out.get("parameters", out.get("base_parameters", PARAMS)) == PARAMS


def test_cli_trace_inputs():
    # what `cabe trace` hands the fake-CUDA step: the preset's config (no torch needed to check it)
    from cabe.cli import parser as cli_parser
    from cabe.cli import trace

    args = cli_parser.build_parser().parse_args(["trace", "--model", HUB_ID])
    config, _ = trace.inputs(args, "trace")
    assert config == dict(models.preset("llama-3.2-1b").config)


def test_cli_from_config(tmp_path, capsys):
    peft = tmp_path / "adapter_config.json"
    peft.write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": HUB_ID, "r": 8}))
    assert main(["from-config", str(peft), "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["parameters"] == PARAMS


def test_http_api_without_allow_hub():
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cabe.web.app import create_app

    with TestClient(create_app()) as c:  # no --allow-hub: other Hub ids are refused, preset ids are not
        for path in ("/api/estimate", "/api/fit", "/api/infer", "/api/lora"):
            body = {"model": HUB_ID, **({"gpu": "h100"} if path == "/api/fit" else {})}
            r = c.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
        assert c.post("/api/estimate", json={"model": HUB_ID}).json()["parameters"] == PARAMS
        assert c.post("/api/estimate", json={"model": "org/not-a-preset"}).status_code == 422
