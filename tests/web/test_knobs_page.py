"""The page's words agree with its numbers (issue 32 item 4): each memory knob's effect under the result, from the
same counterfactual estimates as ``cabe estimate --explain`` (cabe.knob_effects); the article's figures computed
(cabe.web.prose), in both languages; ``explain`` on ``POST /api/estimate``."""

from __future__ import annotations

import re

import pytest

from cabe import api, i18n
from cabe.report.knobs import knob_line
from cabe.web import page

FREEZE_70B = {
    "model": "llama-3.1-70b",
    "method": "freeze",
    "dtype": "bf16",
    "autocast": "none",
    "optimizer": "paged-adamw-8bit",
    "batch": "8",
    "seq": "1024",
    "checkpointing": "on",
    "gpu": "h100-80gb",
}


def _knob_items(html: str) -> dict[str, str]:
    return dict(re.findall(r'<li class="knob [a-z]+" data-field="([a-z_]+)" data-effect="([a-z]+)"', html))


@pytest.mark.parametrize(("lang", "costs"), [("en", "costs 7.48 GB"), ("es", "cuesta 7,48 GB")])
def test_page_says_checkpointing_costs_on_a_freeze_run(lang, costs):
    html = page.render_plan_results(page.state(FREEZE_70B), lang)
    assert _knob_items(html)["checkpointing"] == "costs"
    item = html[html.index('data-field="checkpointing"') :].split("</li>")[0]
    assert costs in item and "enable_input_require_grads" in item
    body = page.plan_request(page.state(FREEZE_70B))
    knobs = api.estimate_json({**body, "explain": True})["knobs"]
    k = next(k for k in knobs if k["field"] == "checkpointing")
    assert knob_line(k, lang).replace("'", "&#39;") in item  # the page's sentence is the CLI's


def test_page_says_lora_checkpointing_saves():
    q = {"model": "llama-3.1-8b", "method": "lora", "seq": "2048", "checkpointing": "on", "gpu": "rtx-4090"}
    assert _knob_items(page.render_plan_results(page.state(q), "en"))["checkpointing"] == "saves"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_article_figures_are_computed(lang):
    html = page.render_page({}, lang)
    article = html[html.index('class="details"') : html.index('class="faq"')]
    assert "M = 7 × 16 = 112 GB" in article and "132 GB" in article  # estimate_simple(7, 16) and (7, 16, 20)
    lora = api.build({**page.EXAMPLE, "method": "lora"})
    full = api.build({**page.EXAMPLE, "method": "full"})
    for r in (lora, full):
        assert f"{i18n.fmt_number(round(r.total_bytes / 1e9, 1), lang)} GB" in article
    verdict = i18n.t("ui.fits" if lora.gpu["fits"] else "ui.does_not_fit", lang)
    assert f"{verdict} " in article and lora.gpu["display"] in article
    assert "24 GB card" not in article and "tarjeta de 24 GB" not in article  # the old claim, not computed


def test_api_explain_field(client):
    body = {"model": "llama-3.1-8b", "method": "lora", "checkpointing": True}
    out = client.post("/api/estimate", json={**body, "explain": True}).json()
    assert [k["field"] for k in out["knobs"]][:1] == ["method"]
    assert "knobs" not in client.post("/api/estimate", json=body).json()
    r = client.post("/api/estimate", json={**body, "explain": "yes"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "not_bool"


def test_openapi_documents_the_knobs_and_the_explain_field():
    from cabe.web.openapi import openapi_document

    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    item = schemas["Report"]["properties"]["knobs"]["items"]["properties"]
    out = api.estimate_json({"model": "llama-3.1-8b", "method": "lora", "explain": True})
    assert all(set(k) == set(item) for k in out["knobs"]) and out["knobs"]
    assert any("explain" in s.get("properties", {}) for s in schemas.values())
