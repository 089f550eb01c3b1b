"""The step's timeline as a chart (cabe.web.timeline, issue 32 item 3): one column per moment of the estimate's
``moments``, its components stacked, the peak marked, the phases labelled, text that stays readable on a phone."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from cabe import api
from cabe.web import page, timeline

SVG = "{http://www.w3.org/2000/svg}"
LORA = {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090"}


def _svg(out, lang="en", units="GB"):
    view = timeline.view(out, page.Units(units, lang), lang, page.component_label)
    assert view is not None
    return view, ET.fromstring(str(view["svg"]))


def _columns(root):
    return [g for g in root.iter(SVG + "g") if "moment" in g.get("class", "").split()]


def _texts(root):
    return list(root.iter(SVG + "text"))


@pytest.mark.parametrize(
    "request_",
    [
        LORA,
        {**LORA, "method": "full", "batch": 2},
        {**LORA, "method": "qlora", "checkpointing": True},
        {"model": "llama-3.1-8b", "method": "full", "gpus": 8, "shard": "zero3", "gpu": "h100-sxm"},
    ],
    ids=["lora", "full", "qlora-checkpointing", "zero3-8-gpus"],
)
def test_each_moment_is_a_column_with_the_json_numbers_and_the_peak_is_marked(request_):
    out = api.estimate_json(request_)
    moments = out["moments"]
    _, root = _svg(out)
    cols = [(g.get("data-phase"), g.get("data-where"), int(g.get("data-bytes"))) for g in _columns(root)]
    # one column per moment of the JSON (a moment listed twice, once), with its phase, place and total
    assert sorted(cols) == sorted({(m["phase"], m["where"], m["total_bytes"]) for m in moments})
    # in the order of the step: forward, backward, optimizer; the backward from the head down to the bottom layer
    phases = [p for p, _, _ in cols]
    assert phases == sorted(phases, key=["forward", "backward", "optimizer"].index)
    assert cols[0][1] in ("start", "vision_tower") or phases.count("forward") == 1
    backward = [w for p, w, _ in cols if p == "backward"]
    assert backward[0] == "head"
    layers = [w.partition(".")[0] for w in backward if "layer" in w]
    assert layers[0] == "top_layer" and layers[-1] == "bottom_layer"
    depth = [int(w.split("_")[1]) for w in layers if w.startswith("layer_")]
    assert depth == sorted(depth)
    # the peak: the moment the estimate names, whose total is the estimate's
    peaks = [c for c, g in zip(cols, _columns(root)) if "peak" in g.get("class").split()]
    assert peaks == [(out["peak_phase"], out["peak_at"], out["total_bytes"])]
    label = next(t.text for t in _texts(root) if t.get("class") == "peak-label")
    assert label == f"peak · {page.Units('GB', 'en').of(out['total_bytes'])} GB"
    assert root.find(f"{SVG}rect[@class='peak-outline']") is not None


def test_the_components_of_each_moment_sum_to_its_total_and_the_columns_are_to_scale():
    out = api.estimate_json({**LORA, "method": "full", "batch": 2})
    for m in out["moments"]:
        assert sum(m["components"].values()) == m["total_bytes"]
    peak = max(out["moments"], key=lambda m: m["total_bytes"])
    assert {k: v for k, v in peak["components"].items() if v} == {k: v for k, v in out["components"].items() if v}
    _, root = _svg(out)
    by_place = {(m["phase"], m["where"]): m for m in out["moments"]}
    shown = [by_place[g.get("data-phase"), g.get("data-where")] for g in _columns(root)]
    heights = [sum(float(r.get("height")) for r in g.iter(SVG + "rect")) for g in _columns(root)]
    for h, m in zip(heights, shown):
        # drawn height / bytes: one scale for every column (each stacked rect rounded to 0.1, at least 0.3)
        assert h / m["total_bytes"] == pytest.approx(heights[0] / shown[0]["total_bytes"], rel=0.01)
    # the stacked colours are the components' own (charts.COMPONENT_COLOURS)
    first = _columns(root)[0]
    fills = [r.get("fill") for r in first.iter(SVG + "rect")]
    keys = timeline.order([k for k, v in shown[0]["components"].items() if v > 0])
    from cabe.web.charts import PALETTE, colour_index

    assert fills == [PALETTE[colour_index(k)] for k in keys]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_phases_are_labelled_under_their_columns(lang):
    out = api.estimate_json(LORA)
    _, root = _svg(out, lang)
    labels = [t.text for t in _texts(root) if t.get("class") == "phase-label"]
    words = {"en": ["forward", "backward", "optimizer"], "es": ["hacia adelante", "hacia atrás", "optimizador"]}
    assert labels == words[lang]
    bands = [r.get("data-phase") for r in root.iter(SVG + "rect") if r.get("data-phase")]
    assert bands == ["forward", "backward", "optimizer"]


@pytest.mark.parametrize("lang", ["en", "es"])
def test_no_text_is_small_or_outside_the_chart(lang):
    """13 px text (style.css) in a viewBox 360 wide: at least 12 px in a phone's column of 340 px; every text's
    extent (0.6 em a character, 14 px for the peak's) inside the viewBox."""
    out = api.estimate_json({"model": "llama-3.1-8b", "method": "full", "gpus": 8, "shard": "fsdp", "gpu": "h100-sxm"})
    _, root = _svg(out, lang)
    width = float(root.get("viewBox").split()[2])
    assert width <= 360 and 13 * 340 / width >= 12
    for t in _texts(root):
        assert t.get("font-size") is None and "font" not in (t.get("style") or "")  # the size is the stylesheet's
        px = 14 if t.get("class") == "peak-label" else 13
        w, x = 0.6 * px * len(t.text), float(t.get("x"))
        left = {"start": x, "middle": x - w / 2, "end": x - w}[t.get("text-anchor", "start")]
        assert left >= 0 and left + w <= width, (t.text, left, w)


def test_the_style_sheet_keeps_chart_text_at_13_px_or_more():
    from importlib import resources

    css = (resources.files("cabe") / "web" / "static" / "style.css").read_text()
    assert "svg.chart { width:100%; height:auto; display:block; font-size:13px; }" in css
    assert "svg .peak-label { fill:var(--no); font-weight:700; font-size:14px; }" in css


def test_places_in_words():
    assert timeline.where_label("layer_30_from_top.attention", "en") == "layer 30 from the top, attention"
    assert timeline.where_label("top_layer", "es") == "capa superior"
    assert timeline.where_label("bottom_layer.recompute", "es") == "capa inferior, recomputación"
    assert timeline.where_label("a_new_place.odd", "en") == "a new place, odd"  # a place no catalog names yet


def test_several_gpus_say_per_gpu_and_the_seed_calculator_has_no_timeline():
    out = api.estimate_json({"model": "llama-3.1-8b", "method": "full", "gpus": 8, "shard": "fsdp", "gpu": "h100-sxm"})
    view, root = _svg(out)
    assert view["per_gpu"] and "one GPU" in root.find(SVG + "title").text
    assert (
        timeline.view(
            api.estimate_json({"params": 7, "bytes_per_param": 16}), page.Units("GB", "en"), "en", page.component_label
        )
        is None
    )


def test_the_page_shows_the_timeline_with_its_table(client):
    html = client.get("/?lang=es&model=llama-3.1-8b&method=lora&seq=2048&gpu=rtx-4090").text
    out = api.estimate_json(LORA)
    assert 'class="chart timeline"' in html and "El paso, momento a momento" in html
    for m in out["moments"]:
        assert f'data-bytes="{m["total_bytes"]}"' in html
    assert f'<tr data-bytes="{out["total_bytes"]}" class="peak">' in html
