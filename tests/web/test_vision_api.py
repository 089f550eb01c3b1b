"""Images on the HTTP API and the page (issue 13): the fields come from cabe.schema, act on the estimate and on
serving, and bad input is a typed 4xx."""

from __future__ import annotations

import re

VL = "qwen2.5-vl-7b-instruct"


def test_images_change_the_estimate(client):
    base = {"model": VL, "method": "lora", "seq": 2048, "batch": 2}
    text = client.post("/api/estimate", json=base).json()
    images = client.post("/api/estimate", json={**base, "images": 4, "image_size": "448x448"}).json()
    # LoRA on q_proj, v_proj: the tower is frozen and outside the gradient's path; its forward and the fp32
    # pixels (2 · 4 · 1,024 patches · 1,176 values · 4 B = 38.5 MB) come on top of the text-only step
    assert images["total_bytes"] > text["total_bytes"]
    assert images["setup"]["images"] == 4 and images["setup"]["image_size"] == "448x448"
    assert "vision_images" in images["notes"] and "vision_text_only" in text["notes"]


def test_image_errors_are_typed(client):
    r = client.post("/api/estimate", json={"model": VL, "images": 1, "image_size": "448 by 448"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "bad_image_size"
    r = client.post("/api/estimate", json={"model": VL, "images": 3, "seq": 512})  # 3 x 256 tokens > 512
    assert r.status_code == 422 and r.json()["error"]["code"] == "images_exceed_seq"
    r = client.post("/api/estimate", json={"model": "llama-3.2-1b", "images": 1})
    assert r.status_code == 422 and r.json()["error"]["code"] == "images_need_vision"
    r = client.post("/api/infer", json={"model": VL, "images": -1})
    assert r.status_code == 422


def test_infer_counts_the_tower_at_prefill(client):
    r = client.post("/api/infer", json={"model": VL, "images": 2, "image_size": "448x448", "context": 4096, "batch": 8})
    assert r.status_code == 200
    out = r.json()
    step = next(s for s in out["steps"] if s["key"] == "infer.vision")
    # 8 sequences x 2 images x 1,024 patches; per patch (modelled): fp32 pixels and their bf16 cast (1,176 x 6 B),
    # fp32 cos and sin (2 x 4 x 80), and the larger of the attention moment (2 x 4 x 1,280 + 4 x 6 x 1,280) and
    # the MLP's (2 x (2 x 1,280 + 3 x 3,420))
    per_patch = 1176 * 6 + 2 * 4 * 80 + max(2 * 4 * 1280 + 4 * 6 * 1280, 2 * (2 * 1280 + 3 * 3420))
    assert step["bytes"] == 16 * 1024 * per_patch
    assert step["params"] == {"images": 16, "patches": 1024, "tokens": 256}
    # image tokens are part of the context: the KV cache is the text-only request's
    text = client.post("/api/infer", json={"model": VL, "context": 4096, "batch": 8}).json()
    assert out["components"]["kv_cache"] == text["components"]["kv_cache"]


def test_page_has_the_image_fields(client):
    html = client.get(f"/?lang=en&model={VL}&method=full&images=2&image_size=640x480&seq=2048").text
    assert re.search(r'<input[^>]*name="images"', html)
    assert re.search(r'<input[^>]*name="image_size"', html)
    doc = client.get("/openapi.json").json()
    props = next(iter(doc["components"]["schemas"].values()))  # any request model that takes images
    assert any("images" in s.get("properties", {}) for s in doc["components"]["schemas"].values()), props
