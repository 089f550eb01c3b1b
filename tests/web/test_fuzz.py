"""Schemathesis fuzzing from the OpenAPI document: no input gives a 5xx."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from cabe.web.app import create_app  # noqa: E402

schema = schemathesis.openapi.from_asgi("/openapi.json", create_app())


@schema.parametrize()
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call()
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    if response.status_code >= 400:
        err = response.json()["error"]
        assert err["code"] and err["message"]


# Negative data: any JSON value in any request field answers 200 or 422, never 5xx.
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cabe import schema as schema_module  # noqa: E402
from cabe.api import REQUEST_FIELDS  # noqa: E402

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_fields = st.sampled_from(REQUEST_FIELDS + ("lang", "units"))


@pytest.fixture(scope="module")
def fuzz_client():
    from starlette.testclient import TestClient

    with TestClient(create_app()) as c:
        yield c


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.dictionaries(_fields, _json_values, max_size=6))
def test_any_field_values_never_5xx(fuzz_client, body):
    body.pop("model", None) if isinstance(body.get("model"), str) and "/" in body["model"] else None  # no Hub fetch
    r = fuzz_client.post("/api/estimate", json=body)
    assert r.status_code in (200, 422), (body, r.text[:300])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.dictionaries(st.sampled_from(schema_module.accepted("api.lora")), _json_values, max_size=4))
def test_lora_never_5xx(fuzz_client, body):
    if isinstance(body.get("model"), str) and "/" in body["model"]:
        body.pop("model")
    body.setdefault("model", "gpt2") if "config" not in body else None
    r = fuzz_client.post("/api/lora", json=body)
    assert r.status_code in (200, 422), (body, r.text[:300])
