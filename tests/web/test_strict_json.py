"""Strict JSON on the HTTP API (issue 12): NaN, Infinity, 1e999 and 400-digit integers answer 422
naming the field — the error answer itself is always valid JSON — and nothing answers 5xx."""

from __future__ import annotations

import json

import pytest


def _post(client, path: str, raw: str):
    return client.post(path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    "raw,code,field",
    [
        ('{"params": NaN, "bytes_per_param": 2}', "not_finite", "params"),
        ('{"params": 7, "bytes_per_param": Infinity}', "not_finite", "bytes_per_param"),
        ('{"params": 7, "activations_gb": -Infinity}', "not_finite", "activations_gb"),
        ('{"params": 1e999}', "not_finite", "params"),
        ('{"model": "llama-7b", "batch": ' + "9" * 5000 + "}", "number_too_long", "batch"),
        ('{"model": "llama-7b", "lora_targets": [1, NaN]}', "not_finite", "lora_targets"),
        ("[" * 5000 + "]" * 5000, "too_deep", "body"),
        ('{"config": {"a": ' + "[" * 100 + "]" * 100 + "}}", "too_deep", "body"),
    ],
)
def test_non_strict_numbers_are_422_naming_the_field(client, raw, code, field):
    for path in ("/api/estimate", "/api/fit", "/api/infer", "/api/lora", "/api/from-config"):
        r = _post(client, path, raw)
        assert r.status_code == 422, (path, r.text[:300])
        err = json.loads(r.text, parse_constant=lambda c: pytest.fail("non-finite in the error"))["error"]
        assert (err["code"], err["field"]) == (code, field), (path, err)
        assert err["message"]


def test_huge_integer_in_a_range_error_is_written(client):
    """A 200-digit batch is a valid JSON integer: out_of_range, and its value shown as 10^199."""
    r = _post(client, "/api/estimate", '{"model": "llama-7b", "batch": ' + "9" * 200 + "}")
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "out_of_range" and "10^199" in err["message"]


def test_fragment_with_a_huge_config_is_not_5xx(client):
    cfg = {
        "model_type": "llama",
        "hidden_size": 10**12,
        "num_hidden_layers": 2,
        "num_attention_heads": 32,
        "intermediate_size": 11008,
        "vocab_size": 32000,
    }
    r = client.post("/fragment", json={"query": "method=full", "config": cfg})
    assert r.status_code == 200
    assert "1,000,000,000,000,000 parameters" in r.text  # the sentence in the error panel


def test_an_unexpected_error_is_one_json_500_logged_once(app, monkeypatch, caplog):
    """A bug (not bad input) still answers JSON, and the log has one line without the body."""
    from starlette.testclient import TestClient

    from cabe import api

    def boom(body, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(api, "estimate_json", boom)
    with TestClient(app, raise_server_exceptions=False) as c, caplog.at_level("ERROR", logger="cabe.web"):
        r = c.post("/api/estimate", json={"model": "llama-7b", "gpu": "s3cr3t"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "cabe.web"]
    assert len(lines) == 1 and "RuntimeError: a bug" in lines[0] and "s3cr3t" not in lines[0]
    assert all(rec.exc_info is None for rec in caplog.records)
