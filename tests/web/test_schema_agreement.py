"""One declaration of the request (cabe.schema): the OpenAPI document, the schema and the keys the
HTTP API accepts are the same, endpoint by endpoint, and so are the types, choices and ranges."""

from __future__ import annotations

from typing import Any

import pytest

from cabe import schema
from cabe.web.app import ENDPOINTS
from cabe.web.openapi import REQUESTS

#: endpoint path -> the OpenAPI request schema it names
_REQUEST_OF = {f"/api/{name}": next(k for k, v in REQUESTS.items() if v[0] == cmd) for name, cmd in ENDPOINTS.items()}
_KEYWORDS = ("type", "enum", "minimum", "exclusiveMinimum", "maximum", "maxLength", "items", "minItems", "default")


@pytest.fixture(scope="module")
def doc(client) -> dict[str, Any]:
    return client.get("/openapi.json").json()


def _request_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == f"#/components/schemas/{_REQUEST_OF[path]}"
    return doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]


def _sample(f: schema.Field) -> Any:
    """A value of the field's type (valid or not: only the key is on trial), one that answers fast."""
    allowed = f.allowed()
    if f.type is tuple:
        return [allowed[0] if allowed else "q_proj"]
    if allowed:
        return allowed[0]
    return {int: 1, float: 1.0, bool: True, dict: {}, str: "no-such-name"}[f.type]


def test_every_endpoint_has_a_generated_request() -> None:
    assert set(_REQUEST_OF) == {"/api/estimate", "/api/fit", "/api/infer", "/api/lora"}
    assert {cmd for cmd, _, _ in REQUESTS.values()} == set(schema.API_COMMANDS)


@pytest.mark.parametrize("path", sorted(_REQUEST_OF))
def test_openapi_properties_are_the_schema_fields(doc, path) -> None:
    command = ENDPOINTS[path.rsplit("/", 1)[-1]]
    req = _request_schema(doc, path)
    fields = [f.name for f in schema.fields_for(command)]
    assert list(req["properties"]) == fields + list(schema.aliases(command))
    assert tuple(req["properties"]) == schema.accepted(command)
    assert req["additionalProperties"] is False
    assert req.get("required", []) == [f.name for f in schema.fields_for(command) if command in f.required_for]
    for alias in schema.aliases(command):
        assert req["properties"][alias]["deprecated"] is True


@pytest.mark.parametrize("path", sorted(_REQUEST_OF))
def test_openapi_types_and_ranges_are_the_schema(doc, path) -> None:
    command = ENDPOINTS[path.rsplit("/", 1)[-1]]
    props = _request_schema(doc, path)["properties"]
    for key, prop in props.items():
        f = schema.field(schema.aliases(command).get(key, key), command)
        want = f.json_schema()
        for kw in _KEYWORDS:
            assert prop.get(kw) == want.get(kw), (path, key, kw)
        if f.type is int:
            assert prop["type"] == "integer"
        if f.minimum is not None:
            assert prop["exclusiveMinimum" if f.exclusive_minimum else "minimum"] == f.minimum, (path, key)
        if f.maximum is not None:
            assert prop["maximum"] == f.maximum, (path, key)
        allowed = f.allowed()
        if allowed is not None:
            assert (prop["items"]["enum"] if f.type is tuple else prop["enum"]) == list(allowed), (path, key)
        assert prop["description"]


@pytest.mark.parametrize("path", sorted(_REQUEST_OF))
def test_every_documented_key_is_accepted(client, doc, path) -> None:
    command = ENDPOINTS[path.rsplit("/", 1)[-1]]
    # /api/fit asks for the card before it looks at the other keys
    base = {"gpu": "rtx-4090"} if command == "api.fit" else {}
    for key in _request_schema(doc, path)["properties"]:
        f = schema.field(schema.aliases(command).get(key, key), command)
        r = client.post(path, json={**base, key: _sample(f)})
        if r.status_code != 200:
            assert r.status_code == 422, (path, key, r.text[:300])
            assert r.json()["error"]["code"] != "unknown_field", (path, key, r.text[:300])


@pytest.mark.parametrize("path", sorted(_REQUEST_OF))
def test_every_undocumented_key_is_refused(client, doc, path) -> None:
    command = ENDPOINTS[path.rsplit("/", 1)[-1]]
    documented = set(_request_schema(doc, path)["properties"])
    others = {f.name for f in schema.FIELDS} | {a for f in schema.FIELDS for a in f.aliases} | {"nope", "paramz"}
    base = {"gpu": "rtx-4090"} if command == "api.fit" else {}
    for key in sorted(others - documented):
        r = client.post(path, json={**base, "model": "gpt2", key: 1})
        assert r.status_code == 422, (path, key)
        err = r.json()["error"]
        assert (err["code"], err["field"]) == ("unknown_field", key), (path, key)
        assert err["params"]["allowed"] == ", ".join(schema.names(command))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"rank": 16, "targets": ["q_proj", "v_proj"]}, {"lora_rank": 16, "lora_targets": ["q_proj", "v_proj"]}),
        ({"rank": 4, "targets": "q_proj,v_proj"}, {"lora_rank": 4, "lora_targets": "q_proj,v_proj"}),
        ({"rank": 8}, {"lora_rank": 8}),
        ({}, {}),
    ],
)
def test_lora_names_are_the_estimate_names(client, old, new) -> None:
    a = client.post("/api/lora", json={"model": "llama-3.1-8b", **old})
    b = client.post("/api/lora", json={"model": "llama-3.1-8b", **new})
    assert a.status_code == b.status_code == 200
    assert a.json() == b.json()
    assert set(a.json()) == {
        "model",
        "rank",
        "targets",
        "num_layers",
        "per_target",
        "total_parameters",
        "model_parameters",
    }


def test_lora_errors_name_the_key_sent(client) -> None:
    old = client.post("/api/lora", json={"model": "gpt2", "rank": 0}).json()["error"]
    new = client.post("/api/lora", json={"model": "gpt2", "lora_rank": 0}).json()["error"]
    assert (old["code"], old["field"]) == ("out_of_range", "rank")
    assert (new["code"], new["field"]) == ("out_of_range", "lora_rank")
    assert new["params"]["maximum"] == schema.MAX_RANK
    bad = client.post("/api/lora", json={"model": "gpt2", "targets": 3}).json()["error"]
    assert (bad["code"], bad["field"]) == ("not_string", "targets")
    both = client.post("/api/lora", json={"model": "gpt2", "rank": 4, "lora_rank": 4, "lang": "es"})
    assert both.status_code == 422
    assert both.json()["error"]["code"] == "alias_conflict" and "lora_rank" in both.json()["error"]["message"]


def test_templates_are_package_data() -> None:
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    from importlib import resources
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["cabe"]
    templates = [p.name for p in (resources.files("cabe") / "web" / "templates").iterdir() if p.name.endswith(".html")]
    assert templates
    for name in templates:
        assert any(fnmatch.fnmatch(f"web/templates/{name}", pat) for pat in patterns), name


def _form_controls(html: str) -> dict[str, Any]:
    """name -> the options of a select, or the input's type (from the page's HTML)."""
    from html.parser import HTMLParser

    out: dict[str, Any] = {}

    class Controls(HTMLParser):
        select: str | None = None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "select":
                self.select = a["name"]
                out[self.select] = []
            elif tag == "option" and self.select:
                out[self.select].append(a["value"])
            elif tag == "input" and a.get("name"):
                out[a["name"]] = a.get("type")

        def handle_endtag(self, tag):
            if tag == "select":
                self.select = None

    Controls().feed(html)
    return out


def test_page_form_is_the_schema(client) -> None:
    from cabe.web import page

    html = client.get("/?lang=en").text
    controls = _form_controls(html)
    for name in page.PLAN_FIELDS:
        f = schema.field(name, "api.estimate")
        assert name in controls, name
        if f.type is bool:
            assert controls[name] == ("checkbox" if not f.default else ["1", "0"]), name
        elif f.allowed() is not None and name != "gpu":
            # a field with no default (recipe, loss) starts with the empty choice: not given
            assert controls[name] == [""] * (f.default is None) + list(f.allowed()), name
    assert controls["units"] == list(schema.field("units", "api.estimate").choices or ())
    # the first visit: the page's example over the schema's defaults
    s = page.state({})
    defaults = schema.resolve_defaults({})
    assert (s["dtype"], s["autocast"]) == (defaults["dtype"], defaults["autocast"])
    assert page.state({"method": "full", "dtype": "fp32"})["dtype"] == "fp32"


def page_fields() -> tuple[str, ...]:
    from cabe.web import page

    return page.PLAN_FIELDS


def test_page_scripts_are_external_or_data(client) -> None:
    """The CSP (script-src 'self') runs no inline script: the page has none, only a JSON data block."""
    import json
    import re

    r = client.get("/?lang=en")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    tags = re.findall(r"<script([^>]*)>(.*?)</script>", r.text, flags=re.S)
    assert tags
    for attrs, body in tags:
        assert ('src="/static/' in attrs and not body.strip()) or 'type="application/json"' in attrs, attrs
    data = json.loads(next(body for attrs, body in tags if 'id="form-defaults"' in attrs))
    # the defaults that depend on another field, as the server decides them (none at present)
    dependent = [f.name for f in schema.fields_for("api.estimate") if f.depends_on]
    assert sorted(data) == sorted(n for n in dependent if n in page_fields())


def test_script_keeps_no_copy_of_the_defaults() -> None:
    from importlib import resources

    js = (resources.files("cabe") / "web" / "static" / "app.js").read_text("utf-8")
    for name in ("dtype", "autocast", "method"):
        for value in schema.field(name).choices or ():
            assert f'"{value}"' not in js, value
