"""/api/fit and /api/infer: thin over cabe.solver and cabe.inference, same JSON."""

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from cabe.web.app import create_app


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


def test_fit_returns_the_solver_plan(client):
    from cabe.solver import plan_json

    body = {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090"}
    r = client.post("/api/fit", json=body)
    assert r.status_code == 200
    got, want = r.json(), plan_json(body)
    got.pop("elapsed_ms"), want.pop("elapsed_ms")  # wall time of the solve itself
    assert got == want


def test_infer_returns_kv_cache(client):
    r = client.post("/api/infer", json={"model": "llama-3.1-8b", "context": 8192, "gpu": "rtx-4090"})
    assert r.status_code == 200
    assert "fit" in r.json()


def test_fit_bad_input_is_422_in_spanish(client):
    r = client.post("/api/fit", json={"model": "llama-3.1-8b", "gpu": "rtx-9999", "lang": "es"})
    assert r.status_code == 422
    assert "desconocida" in r.json()["error"]["message"]


def test_openapi_lists_fit_and_infer(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/api/fit" in paths and "/api/infer" in paths


def test_fit_prices_the_setup_that_fits(client):
    # issue 32: the same time, GPU-hours and cost as `cabe fit --tokens --price-per-gpu-hour` (the schema's fields)
    from cabe.solver import plan_json

    body = {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090", "tokens": 1e9}
    r = client.post("/api/fit", json={**body, "price_per_gpu_hour": 2})
    assert r.status_code == 200
    got, want = r.json()["time"], plan_json({**body, "price_per_gpu_hour": 2})["time"]
    assert got == want and got["cost"] == 2 * got["gpu_hours"]
    r = client.post("/api/fit", json={**body, "price_per_gpu_hour": -2, "lang": "es"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "price_per_gpu_hour"
