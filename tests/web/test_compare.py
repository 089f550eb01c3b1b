"""Two or three setups side by side (cabe.web.compare, issue 32 item 3): the address keeps them, the page draws them
on one axis with the components' colours and tabulates their totals, and POST /api/compare answers each as
/api/estimate does."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import pytest

from cabe import api
from cabe.web import compare, page

SVG = "{http://www.w3.org/2000/svg}"
BASE = {"model": "llama-3.1-8b", "seq": 2048, "gpu": "rtx-4090"}
METHODS = ("lora", "qlora", "full")


def _kept(**fields) -> str:
    return compare.minimal(page.state({**BASE, **fields}), page.state)


# ------------------------------------------------------------------------------ the address


@pytest.mark.parametrize(
    "fields",
    [
        {"method": "lora"},
        {"method": "qlora", "checkpointing": "1", "batch": "4", "lora_rank": "64"},
        {"method": "full", "view": "gpus", "gpus": "8", "shard": "fsdp", "gpu": "h100-sxm", "dtype": "fp32"},
        {"method": "full", "units": "GiB", "n": "70"},  # neither the units nor the seed calculator's fields are kept
    ],
)
def test_a_kept_setup_is_short_and_reopens_as_the_same_state(fields):
    s = page.state({**BASE, **fields})
    kept = compare.minimal(s, page.state)
    again = page.state(dict(parse_qsl(kept)))
    setup = (*page.FORM_FIELDS, "view")
    assert {k: again[k] for k in setup} == {k: s[k] for k in setup}
    assert len(kept) < 200 and "units" not in kept and "n=" not in kept
    assert kept.startswith(urlencode({"model": "llama-3.1-8b", "method": fields["method"]}))


def test_compare_keeps_the_form_then_a_second_and_replaces_the_last_when_full():
    q = {**BASE, "method": "lora", "lang": "es"}
    first = dict(parse_qsl(urlsplit(compare.pin({**q, "pin": "1"}, page.state, page.QUERY_KEYS)).query))
    assert first["cmp1"] == "model=llama-3.1-8b&method=lora" and "cmp2" not in first and "pin" not in first
    assert first["lang"] == "es" and first["method"] == "lora"  # the form as it was
    second = dict(parse_qsl(urlsplit(compare.pin({**first, "method": "qlora"}, page.state, page.QUERY_KEYS)).query))
    assert (second["cmp1"], second["cmp2"]) == (first["cmp1"], "model=llama-3.1-8b&method=qlora")
    third = dict(parse_qsl(urlsplit(compare.pin({**second, "method": "full"}, page.state, page.QUERY_KEYS)).query))
    assert (third["cmp1"], third["cmp2"]) == (first["cmp1"], "model=llama-3.1-8b&method=full")  # A stays


def test_slots_drop_empty_and_oversized_ones():
    assert compare.slots({"cmp1": "", "cmp2": "method=full"}) == {"cmp1": "method=full"}
    assert compare.slots({"cmp1": "x" * 5000}) == {}


def test_the_compare_button_redirects_to_the_address_that_keeps_the_setup(client):
    r = client.get("/?" + urlencode({**BASE, "method": "lora", "lang": "en", "pin": "1"}), follow_redirects=False)
    assert r.status_code == 303
    target = parse_qs(urlsplit(r.headers["location"]).query)
    assert target["cmp1"] == ["model=llama-3.1-8b&method=lora"] and "pin" not in target
    html = client.get(r.headers["location"]).text
    assert '<input type="hidden" name="cmp1" value="model=llama-3.1-8b&amp;method=lora">' in html
    assert 'id="compare"' in html  # the kept setup and the form's, side by side
    # the language switch keeps the comparison
    switch = re.search(r'id="lang-switch"[^>]*href="([^"]+)"', html, re.S).group(1).replace("&amp;", "&")
    assert parse_qs(urlsplit(switch).query)["cmp1"] == target["cmp1"]


# ------------------------------------------------------------------------------ the page's comparison


def _page(client, lang="en"):
    q = {**BASE, "method": "full", "lang": lang, "cmp1": _kept(method="lora"), "cmp2": _kept(method="qlora")}
    return client.get("/?" + urlencode(q)).text


def _section(html):
    return html[html.index('<section id="compare"') : html.index("</section>", html.index('<section id="compare"'))]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_page_compares_lora_qlora_and_full_with_the_core_numbers(client, lang):
    html = _section(_page(client, lang))
    cores = [api.estimate_json({**BASE, "method": m}) for m in METHODS]
    totals = [int(x) for x in re.findall(r'<td class="num" data-bytes="(\d+)">', html)]
    assert totals == [c["total_bytes"] for c in cores]
    # the differences from A, in the page's units and words
    u = page.Units("GB", lang)
    diffs = re.findall(r'</td><td class="num">([^<]+)</td>', html)
    expect = ["—"] + [
        ("+" if d > 0 else "−") + u.of(abs(d)) for d in (c["total_bytes"] - cores[0]["total_bytes"] for c in cores[1:])
    ]
    assert diffs == expect
    # one bar per setup, on one axis: each as long as what its setup needs on the card (the page's own bar)
    svg = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])
    bars = [g for g in svg.iter(SVG + "g") if g.get("class") == "setup"]
    needed = [sum(v for _, _, v in page._components(c, c["gpu"], lang)) for c in cores]
    assert [int(g.get("data-bytes")) for g in bars] == [int(n) for n in needed]
    widths = [[float(r.get("width")) for r in g.iter(SVG + "rect")] for g in bars]
    scale = max(sum(w) for w in widths) / max(needed)
    for w, n in zip(widths, needed):  # (a segment is at least 0.5 wide)
        assert sum(w) == pytest.approx(n * scale, abs=0.1 + 0.5 * len(w))
    # the setups are named by what tells them apart (the method), the form's last
    names = {"en": ["LoRA", "QLoRA (4-bit frozen base + LoRA)", "Full fine-tuning"]}
    if lang in names:
        assert next(t.text for t in svg.iter(SVG + "text") if t.get("class") == "setup-label") == "A · LoRA"
        assert re.findall(r"<strong>[ABC]</strong> · ([^<]+?) *<span", html) == names[lang]
    assert 'class="form-setup"' in html and html.count('data-setup="') == 3


def test_remove_and_edit_links_keep_the_others(client):
    html = _section(_page(client)).replace("&amp;", "&")
    links = re.findall(r'<a href="\?([^"]+)">', html)
    rows = [dict(parse_qsl(x)) for x in links]
    # A: edit (the form becomes A, the form's setup kept last), remove; B: edit, remove; C (the form): remove; clear
    edit_a, remove_a, edit_b, remove_b, remove_c = rows[:5]
    assert (
        edit_a["method"] == "lora"
        and edit_a["cmp1"] == _kept(method="qlora")
        and edit_a["cmp2"] == _kept(method="full")
    )
    assert remove_a["method"] == "full" and remove_a["cmp1"] == _kept(method="qlora") and "cmp2" not in remove_a
    assert (
        edit_b["method"] == "qlora"
        and edit_b["cmp1"] == _kept(method="lora")
        and edit_b["cmp2"] == _kept(method="full")
    )
    assert remove_b["cmp1"] == _kept(method="lora") and "cmp2" not in remove_b
    assert remove_c["method"] == "qlora" and remove_c["cmp1"] == _kept(method="lora") and "cmp2" not in remove_c
    clear = dict(parse_qsl(re.search(r'id="compare-clear" href="\?([^"]+)"', html).group(1)))
    assert clear["method"] == "full" and "cmp1" not in clear and "cmp2" not in clear


def test_a_kept_setup_in_error_says_so_in_its_row(client):
    q = {**BASE, "method": "lora", "lang": "en", "cmp1": "model=llama-3.1-8b&method=lora&batch=0"}
    html = _section(client.get("/?" + urlencode(q)).text)
    assert '<td colspan="3" class="error">batch must be between 1 and' in html


# ------------------------------------------------------------------------------ POST /api/compare


def test_the_endpoint_answers_each_setup_as_api_estimate(client):
    setups = [{**BASE, "method": m} for m in METHODS]
    r = client.post("/api/compare", json={"setups": setups})
    assert r.status_code == 200
    out = r.json()
    for one, got in zip(setups, out["setups"]):
        assert got == client.post("/api/estimate", json=one).json()
    totals = [s["total_bytes"] for s in out["setups"]]
    assert out["difference_bytes"] == [t - totals[0] for t in totals]


@pytest.mark.parametrize(
    "body,code,field",
    [
        ({"setups": [{"model": "gpt2"}] * 4}, "compare_count", "setups"),
        ({"setups": [{"model": "gpt2"}]}, "compare_count", "setups"),
        ({"setups": {"model": "gpt2"}}, "compare_not_list", "setups"),
        ({}, "compare_not_list", "setups"),
        ({"setups": [{"model": "gpt2"}] * 2, "colour": 1}, "unknown_field", "colour"),
        ([{"model": "gpt2"}], "body_not_object", None),
    ],
)
def test_bad_input_is_a_typed_422(client, body, code, field):
    r = client.post("/api/compare", json=body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["code"], err["field"]) == (code, field) and err["message"]


def test_a_bad_setup_is_named_in_the_askers_language(client):
    r = client.post("/api/compare", json={"setups": [{"model": "gpt2"}, {"model": "gpt2", "batch": 0}], "lang": "es"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert (err["code"], err["field"], err["setup"]) == ("out_of_range", "batch", 1)
    assert err["message"].startswith("Configuración B: batch debe estar entre 1 y")
    r = client.post("/api/compare", json={"setups": [{"model": "gpt2"}, 7]})
    assert r.json()["error"]["code"] == "compare_setup_not_object" and r.json()["error"]["setup"] == 1
    r = client.post("/api/compare", json={"setups": [{"model": "gpt2", "nope": 1}, {"model": "gpt2"}]})
    assert (r.json()["error"]["code"], r.json()["error"]["setup"]) == ("unknown_field", 0)


def test_the_openapi_document_describes_it(client):
    doc = client.get("/openapi.json").json()
    post = doc["paths"]["/api/compare"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    req = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    assert req["properties"]["setups"]["maxItems"] == compare.MAX_SETUPS == 3
    assert req["properties"]["setups"]["items"] == {"$ref": "#/components/schemas/EstimateRequest"}
    assert {"200", "422", "413"} <= set(post["responses"])
    example = req["examples"][0]
    assert client.post("/api/compare", json=example).status_code == 200


# ------------------------------------------------------------------------------ any address


@pytest.mark.parametrize(
    "kept",
    ["x", "%%%", "view=serve&method=full", "view=gpus&gpus=8&shard=zero3", "batch=99999999999999999999999", "a" * 3999],
)
@pytest.mark.parametrize("view", ["train", "gpus", "serve", "fit"])
def test_odd_kept_setups_never_break_the_page(client, kept, view):
    q = urlencode({"model": "gpt2", "view": view, "cmp1": kept, "cmp2": "view=gpus&method=full"})
    assert client.get("/?" + q).status_code == 200
    assert client.post("/fragment", json={"query": q}).status_code == 200
    assert client.get("/?" + q + "&pin=1", follow_redirects=False).status_code == 303


def test_any_kept_values_never_break_the_page(client):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    keys = st.sampled_from((*page.FORM_FIELDS, "view", "cmp1", "lang"))
    setups = st.dictionaries(keys, st.text(max_size=12), max_size=5).map(urlencode)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(first=setups, second=setups)
    def run(first, second):  # (a Hugging Face id: refused, the app has no Hub)
        r = client.post("/fragment", json={"query": urlencode({"model": "gpt2", "cmp1": first, "cmp2": second})})
        assert r.status_code == 200, (first, second, r.text[:300])

    run()
