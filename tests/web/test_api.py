"""The JSON API: the seed's numbers, errors in both languages, limits, the OpenAPI document."""

from __future__ import annotations

import json

import pytest

from cabe.api import estimate_json


def test_seed_112(client):
    r = client.post("/api/estimate", json={"params": 7, "bytes_per_param": 16})
    assert r.status_code == 200
    assert r.json()["total_gb"] == 112.0
    assert r.json()["total_bytes"] == 112 * 10**9


def test_seed_132_with_activations(client):
    r = client.post("/api/estimate", json={"params": 7, "bytes_per_param": 16, "activations_gb": 20})
    assert r.status_code == 200
    out = r.json()
    assert out["total_gb"] == 132.0
    assert out["components"] == {"model_states": 112 * 10**9, "activations": 20 * 10**9}
    assert out == estimate_json({"params": 7, "bytes_per_param": 16, "activations_gb": 20})


def test_model_request_same_as_core(client):
    body = {"model": "llama-3.1-8b", "method": "lora", "batch": 4, "seq": 2048, "gpu": "rtx-4090"}
    r = client.post("/api/estimate", json={**body, "lang": "es", "units": "GiB"})
    assert r.status_code == 200
    assert r.json() == json.loads(json.dumps(estimate_json(body)))


@pytest.mark.parametrize("how", ["body", "header"])
def test_422_spanish(client, how):
    body = {"params": -1, "bytes_per_param": 16}
    headers = {}
    if how == "body":
        body["lang"] = "es"
    else:
        headers["Accept-Language"] = "es-ES,es;q=0.9,en;q=0.5"
    r = client.post("/api/estimate", json=body, headers=headers)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "params"
    assert err["code"]
    en = client.post("/api/estimate", json={"params": -1, "bytes_per_param": 16, "lang": "en"}).json()["error"]
    assert err["message"] and en["message"] and err["message"] != en["message"]


def test_422_english_default(client):
    r = client.post("/api/estimate", json={"model": "no-such-model"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["field"] == "model" and err["code"] == "unknown_model"
    assert "no-such-model" in err["message"]


def test_accept_language_prefers_higher_q(client):
    r = client.post("/api/estimate", json={"params": "x"}, headers={"Accept-Language": "en;q=0.3, es;q=0.8"})
    es = client.post("/api/estimate", json={"params": "x", "lang": "es"})
    assert r.json()["error"]["message"] == es.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"{", b"[1, 2]", b"\xff\xfe", b'"text"', b"null"])
def test_malformed_bodies_are_422(client, body):
    r = client.post("/api/estimate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["message"]


def test_unknown_field_is_422(client):
    r = client.post("/api/estimate", json={"params": 7, "bytes_per_param": 16, "paramz": 1})
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "unknown_field"


def test_413_for_big_bodies(client):
    big = {"params": 7, "bytes_per_param": 16, "config": {"pad": "x" * (300 * 1024)}}
    r = client.post("/api/estimate", content=json.dumps(big), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "body_too_large"


def test_413_without_content_length(client):
    def chunks():
        for _ in range(40):
            yield b" " * 8192

    r = client.post("/api/estimate", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_uploaded_config_is_parsed(client):
    from cabe.models import preset

    cfg = dict(preset("gpt2").config)
    r = client.post("/api/estimate", json={"config": cfg, "batch": 2, "seq": 256})
    assert r.status_code == 200
    assert r.json()["parameters"] == estimate_json({"model": "gpt2", "batch": 2, "seq": 256})["parameters"]
    bad = client.post("/api/estimate", json={"config": {"model_type": "nonsense"}, "lang": "es"})
    assert bad.status_code == 422 and bad.json()["error"]["message"]


def test_no_local_files(client):
    r = client.post("/api/estimate", json={"model": "/etc/passwd"})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "model"


def test_models_gpus_health(client):
    models = client.get("/api/models").json()["models"]
    names = {m["name"] for m in models}
    assert "llama-3.1-8b" in names
    m = next(m for m in models if m["name"] == "llama-3.1-8b")
    assert m["parameters"] == 8030261248 and m["hf_id"]
    gpus = client.get("/api/gpus").json()["gpus"]
    assert any(g["name"] == "rtx-4090" for g in gpus)
    mem = [g["memory_bytes"] for g in gpus]
    assert mem == sorted(mem)
    assert client.get("/api/health").json()["status"] == "ok"


def test_lora_endpoint(client):
    from cabe.method import lora_parameters
    from cabe.models import preset

    r = client.post("/api/lora", json={"model": "llama-3.1-8b", "rank": 16, "targets": ["q_proj", "v_proj"]})
    assert r.status_code == 200
    out = r.json()
    expect = lora_parameters(preset("llama-3.1-8b").spec, 16, ("q_proj", "v_proj"))
    assert [t["parameters"] for t in out["per_target"]] == [t.parameters for t in expect]
    assert out["total_parameters"] == sum(t.parameters for t in expect)
    # q_proj: 16 × (4096 + 4096) × 32 layers
    assert out["per_target"][0]["parameters"] == 16 * 8192 * 32
    bad = client.post("/api/lora", json={"model": "llama-3.1-8b", "rank": 0, "lang": "es"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "rank"
    bad = client.post("/api/lora", json={"model": "llama-3.1-8b", "targets": ["nope"]})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "lora_targets"


def test_openapi_document_valid(client):
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {"/api/estimate", "/api/lora", "/api/models", "/api/gpus", "/api/health"} <= set(doc["paths"])
    try:
        from openapi_spec_validator import validate
    except ImportError:
        validate = None
    if validate is not None:
        validate(doc)
    # every $ref resolves
    refs = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k == "$ref":
                    refs.append(v)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    for ref in refs:
        assert ref.split("/")[-1] in doc["components"]["schemas"]


def test_page_renders_seed_without_js(client):
    r = client.get("/?n=7&b=16&a=20&lang=en")
    assert r.status_code == 200
    assert 'id="seed-total"' in r.text and "132 GB" in r.text
    es = client.get("/?n=7,5&b=16&a=0&lang=es")
    assert "7,5 × 16 = 120 GB" in es.text  # Spanish number format
    assert "111,76 GiB" in es.text
    assert '<html lang="es">' in es.text


def test_page_language_from_header(client):
    r = client.get("/", headers={"Accept-Language": "es"})
    assert '<html lang="es">' in r.text
    assert "Calculadora de VRAM para entrenar un LLM" in r.text
    r = client.get("/", headers={"Accept-Language": "en-US"})
    assert "LLM Training VRAM Calculator" in r.text


def test_page_planner_verdict_matches_core(client):
    q = {"model": "llama-3.2-1b", "method": "lora", "batch": "1", "seq": "1024", "gpu": "rtx-4090", "lang": "en"}
    r = client.get("/", params=q)
    core = estimate_json({"model": "llama-3.2-1b", "method": "lora", "batch": 1, "seq": 1024, "gpu": "rtx-4090"})
    assert f'data-fits="{str(core["gpu"]["fits"]).lower()}"' in r.text
    assert "<svg" in r.text


def test_page_units_gib(client):
    r = client.get("/", params={"model": "gpt2", "units": "GiB", "lang": "en"})
    assert r.status_code == 200 and "GiB" in r.text


def test_page_bad_input_shows_sentence(client):
    r = client.get("/", params={"model": "gpt2", "batch": "abc", "lang": "es"})
    assert r.status_code == 200
    assert 'class="error"' in r.text and 'data-field="batch"' in r.text


def test_fragment(client):
    r = client.post("/fragment", json={"query": "model=gpt2&lang=es&n=7&b=16&a=20"})
    assert r.status_code == 200
    out = r.json()
    assert "132 GB" in out["seed"] and "122,94 GiB" in out["seed"]
    assert "verdict" in out["plan"]


def test_catalogs_same_keys_and_placeholders():
    from importlib import resources

    from cabe.i18n import placeholders

    cats = {
        lang: json.loads((resources.files("cabe") / "i18n" / lang / "web.json").read_text("utf-8"))
        for lang in ("en", "es")
    }
    assert cats["en"].keys() == cats["es"].keys()
    for k in cats["en"]:
        assert placeholders(cats["en"][k]) == placeholders(cats["es"][k]), k
