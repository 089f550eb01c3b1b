"""The Hub behind the HTTP server and the command line (issue 12), against a fake hub on 127.0.0.1
(benchmarks/fuzz/fakehub.py): off unless allowed; when on, sizes checked before the body, the body
capped, time bounded, concurrency limited, a bounded cache of the server's own, no local paths, a GET
never fetches; Host and Origin checked."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from cabe import hub as hub_module
from cabe.web.app import create_app

_spec = importlib.util.spec_from_file_location(
    "fakehub", Path(__file__).parents[2] / "benchmarks" / "fuzz" / "fakehub.py"
)
assert _spec and _spec.loader
fakehub = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakehub)


@pytest.fixture(scope="module")
def fake():
    hub = fakehub.FakeHub(slow_s=60.0).start()  # a broken bound would wait a minute
    yield hub
    hub.stop()


@pytest.fixture()
def endpoint(fake, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty user cache
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return fake


def _server(policy=None, **kw):
    server_hub = hub_module.ServerHub(policy or hub_module.Policy(timeout_s=1.0, total_s=2.0, retries=0), **kw)
    return server_hub, TestClient(create_app(hub=server_hub))


def _code(r):
    return r.json()["error"]["code"]


def test_hub_ids_are_off_by_default(endpoint, client):
    r = client.post("/api/estimate", json={"model": "org/ok-1"})
    assert r.status_code == 422 and _code(r) == "hub_disabled"
    assert "--allow-hub" in r.json()["error"]["message"]
    assert not [p for _, p in endpoint.requests if "ok-1" in p]


def test_allowed_hub_fetches_once_and_caches(endpoint):
    server_hub, c = _server()
    r = c.post("/api/estimate", json={"model": "org/ok-2"})
    assert r.status_code == 200, r.text
    # Llama 3.2 1B (1,235,814,400, tied) + an untied head: 128,256 x 2,048 = 262,668,288 more
    assert r.json()["parameters"] == 1_498_482_688
    for _ in range(3):
        assert c.post("/api/estimate", json={"model": "org/ok-2"}).status_code == 200
    assert server_hub.fetches == 1 and len(server_hub) == 1


@pytest.mark.parametrize(
    "repo,code",
    [
        ("org/gated-1", "hub_gated"),
        ("org/missing-1", "hub_not_found"),
        ("org/noconfig-1", "hub_no_config"),
        ("org/huge-1", "hub_too_large"),
        ("org/liar-1", "hub_too_large"),
        ("org/nan-1", "config_bad_value"),  # NaN where cabe reads a size (a config may hold non-finite numbers)
        ("org/../etc", "hub_bad_id"),
    ],
)
def test_hub_refusals_are_sentences_without_paths(endpoint, repo, code):
    server_hub, c = _server()
    t0 = time.perf_counter()
    r = c.post("/api/estimate", json={"model": repo})
    assert r.status_code == 422 and _code(r) == code, r.text
    assert "/tmp" not in r.text and str(Path.home()) not in r.text
    assert time.perf_counter() - t0 < 10  # generous on a loaded machine: unbounded would be minutes
    assert server_hub.cached_bytes() <= server_hub.max_bytes


def test_huge_config_is_refused_by_its_head(endpoint):
    _server()[1].post("/api/estimate", json={"model": "org/huge-2"})
    assert ("GET", "/org/huge-2/resolve/main/config.json") not in endpoint.requests


def test_slow_hub_times_out_within_bound(endpoint):
    _, c = _server()
    t0 = time.perf_counter()
    r = c.post("/api/estimate", json={"model": "org/slow-1"})
    assert r.status_code == 422 and _code(r) == "hub_timeout"
    assert time.perf_counter() - t0 < 10  # total_s=2 (+ one read timeout); unbounded: 60 s
    t0 = time.perf_counter()
    r = c.post("/api/estimate", json={"model": "org/trickle-1"})
    assert _code(r) == "hub_timeout" and time.perf_counter() - t0 < 10  # unbounded: 4,096 s


def test_concurrency_limit_answers_429(endpoint):
    server_hub, c = _server(concurrency=1)
    assert server_hub.slots.acquire(blocking=False)  # one fetch in flight
    try:
        r = c.post("/api/estimate", json={"model": "org/ok-3"})
        assert r.status_code == 429 and _code(r) == "hub_busy"
    finally:
        server_hub.slots.release()


def test_cache_is_bounded(endpoint):
    server_hub, c = _server(max_entries=3)
    for i in range(6):
        assert c.post("/api/estimate", json={"model": f"org/ok-c{i}"}).status_code == 200
    assert len(server_hub) == 3


def test_a_get_never_fetches(endpoint):
    server_hub, c = _server()
    r = c.get("/?model=org/ok-get")
    assert r.status_code == 200 and server_hub.fetches == 0
    assert not [p for _, p in endpoint.requests if "ok-get" in p]
    c.post("/fragment", json={"query": "model=org/ok-get"})  # the form's POST fetches
    assert server_hub.fetches == 1
    assert c.get("/?model=org/ok-get").status_code == 200 and server_hub.fetches == 1  # now from the cache


def test_host_and_origin_checks():
    c = TestClient(create_app(allowed_hosts=("127.0.0.1", "localhost")), base_url="http://127.0.0.1:8000")
    assert c.get("/api/health").status_code == 200
    assert (
        c.post("/api/estimate", json={"model": "gpt2"}, headers={"Origin": "http://127.0.0.1:8000"}).status_code == 200
    )
    r = c.post("/api/estimate", json={"model": "gpt2"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and _code(r) == "forbidden_origin"
    r = c.get("/api/health", headers={"Host": "evil.example:8000"})  # DNS rebinding
    assert r.status_code == 403
    assert c.get("/", headers={"Host": "localhost:8000"}).status_code == 200


def test_cli_hub_timeout_and_offline_sentences(endpoint, capsys, monkeypatch):
    from cabe.cli import main

    monkeypatch.setattr(hub_module, "CLI", hub_module.Policy(timeout_s=0.5, total_s=1.5, retries=1))
    t0 = time.perf_counter()
    assert main(["estimate", "--model", "org/slow-cli", "--lang", "en"]) == 2
    assert "timed out" in capsys.readouterr().err and time.perf_counter() - t0 < 10
    assert [m for m, p in endpoint.requests if "slow-cli" in p] == ["HEAD", "HEAD"]  # one retry
    assert main(["estimate", "--model", "org/gated-cli", "--lang", "en"]) == 2
    assert "is gated" in capsys.readouterr().err
    assert main(["estimate", "--model", "org/ok-cli", "--json"]) == 0
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    assert main(["estimate", "--model", "org/ok-cli2", "--lang", "en"]) == 2
    assert "offline?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "repo,needle",
    [
        ("org/gated-x", "is gated on Hugging Face"),
        ("org/missing-x", "does not exist on Hugging Face"),
        ("org/noconfig-x", "has no config.json"),
        ("org/huge-x", "larger than 1,048,576 bytes"),
    ],
)
def test_cli_hub_refusals(endpoint, capsys, repo, needle):
    from cabe.cli import main

    assert main(["estimate", "--model", repo, "--lang", "en"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
