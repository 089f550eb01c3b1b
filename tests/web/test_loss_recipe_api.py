"""``loss``, ``loss_chunks`` and ``recipe`` on the HTTP API (snake_case) and in OpenAPI. (The page's form has
them too, with the savers: web/page.py FIELDSETS, tests/web/test_schema_agreement.py.)"""


def test_api_takes_loss_and_recipe(client):
    r = client.post("/api/estimate", json={"model": "qwen2.5-0.5b", "recipe": "torchtune", "loss_chunks": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["setup"]["recipe"] == "torchtune" and body["setup"]["loss"] == "chunked"
    assert body["setup"]["loss_chunks"] == 4 and body["loss"]["assumed"] == []


def test_api_refuses_an_unknown_loss(client):
    r = client.post("/api/estimate", json={"model": "qwen2.5-0.5b", "loss": "fused"})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "loss"


def test_openapi_has_the_fields(client):
    text = str(client.get("/openapi.json").json()["components"]["schemas"])
    assert "loss_chunks" in text and "cce" in text and "llama-factory" in text
