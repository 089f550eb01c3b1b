"""POST /api/estimate with a config no family module reads (olmo3): the traced answer, from the long-lived
trace worker (torch stays out of the server); a 4xx when it cannot be answered."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cabe import via_trace

pytestmark = pytest.mark.trace

# a tiny olmo3 config.json, shared by the unknown-architecture tests of the CLI, the API and cabe.via_trace
OLMO3 = json.loads((Path(__file__).resolve().parents[1] / "configs/files/olmo3_tiny_config.json").read_text())
#: tests/test_via_trace.py: 2 · 512·128 (embeddings, untied head) + 128 (final norm) + 2 · 164,352 (layers)
OLMO3_PARAMETERS = 459_904
SMALL = {"batch": 1, "seq": 64}


def _trace_extra():
    for name in ("torch", "transformers", "peft"):
        pytest.importorskip(name)


def test_full_is_the_traced_answer(client):
    _trace_extra()
    r = client.post("/api/estimate", json={"config": OLMO3, **SMALL, "gpu": "rtx-4090"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["notes"][0] == via_trace.NOTE and out["answered_by"] == "trace"
    assert out["parameters"] == out["trainable_parameters"] == OLMO3_PARAMETERS
    assert out["model"]["model_type"] == "olmo3" and out["gpu"]["fits"] is True
    # the same answer as the command line's (in-process) trace: the worker runs the same step
    from cabe.api import estimate_json

    here = estimate_json({"config": OLMO3, **SMALL}, trace="process")
    assert out["total_bytes"] == here["total_bytes"]  # (the components' split may move by an allocation)


def test_lora_all_linear(client):
    _trace_extra()
    r = client.post("/api/estimate", json={"config": OLMO3, **SMALL, "method": "lora", "lora_rank": 8})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["notes"] == [via_trace.NOTE, "trace_lora_all_linear"]
    # every linear layer of 2 layers, r 8: q, k, v, o 8·(128+128); gate, up, down 8·(128+256)
    assert out["trainable_parameters"] == 2 * (4 * 8 * 256 + 3 * 8 * 384)


def test_what_cannot_be_answered_is_a_4xx(client, monkeypatch):
    r = client.post("/api/estimate", json={"config": OLMO3, "gpus": 2, "shard": "fsdp"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_architecture_one_gpu"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        via_trace.importlib.util, "find_spec", lambda name, *a, **k: None if name == "torch" else real(name, *a, **k)
    )
    r = client.post("/api/estimate", json={"config": OLMO3, "lang": "es"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "unknown_architecture_needs_trace" and "pip install 'cabe[trace]'" in err["message"]


def test_a_traced_answer_runs_off_the_event_loop():
    from cabe.web.app import _needs_thread

    assert _needs_thread({"config": OLMO3}) is True  # a trace: seconds, in the worker
    assert _needs_thread({"config": {**OLMO3, "model_type": "llama"}}) is False  # analytic: microseconds
    assert _needs_thread({"model": "llama-3.1-8b"}) is False
