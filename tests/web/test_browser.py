"""The page in a real browser: Debian's Chromium driven by Playwright (no browser download).

Skipped cleanly when Playwright or /usr/bin/chromium is missing. Screenshots of the main
views go to artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cabe.api import estimate_json

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CABE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.base = server  # type: ignore[attr-defined]
    yield pg
    ctx.close()
    assert not errors, errors


def shot(pg, name: str, full: bool = True) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)


def settle(pg) -> None:
    """Wait for the debounce and the answers."""
    pg.wait_for_timeout(350)
    pg.wait_for_load_state("networkidle")
    # A locator wait runs in Playwright's own world, so the page's CSP (no 'unsafe-eval') does not block it,
    # as it does the string predicate of wait_for_function.
    pg.locator("#plan-results[aria-busy]").wait_for(state="detached")


def test_seed_example_112_then_132(page):
    page.goto(page.base + "/?lang=en")
    page.fill("#n", "")
    settle(page)
    assert page.inner_text("#seed-results").strip() == "Enter a value to see the results."
    page.fill("#n", "7")
    page.select_option("#b", "16")
    page.fill("#a", "0")
    settle(page)
    assert page.inner_text("#seed-total") == "112 GB"
    assert "7 × 16 = 112 GB" in page.inner_text("#seed-m")
    shot(page, "seed-112-en", full=False)
    page.fill("#a", "20")
    settle(page)
    assert page.inner_text("#seed-total") == "132 GB"
    assert "112 + 20 = 132 GB" in page.inner_text("#seed-v")
    assert "a=20" in page.url  # the state is in the address


def test_seed_custom_bytes(page):
    page.goto(page.base + "/?lang=en")
    page.select_option("#b", "custom")
    page.fill("#bc", "10")
    page.fill("#n", "7")
    settle(page)
    assert page.inner_text("#seed-total") == "70 GB"


def test_planner_lora_24gb_matches_core(page):
    page.goto(page.base + "/?lang=en")
    page.fill("#model", "llama-3.1-8b")
    page.select_option("#method", "lora")
    page.fill("#batch", "1")
    page.fill("#seq", "1024")
    page.select_option("#gpu", "rtx-4090")
    settle(page)
    core = estimate_json(
        {
            "model": "llama-3.1-8b",
            "method": "lora",
            "batch": 1,
            "seq": 1024,
            "gpu": "rtx-4090",
            "checkpointing": False,
            "double_quant": True,
            "dtype": "auto",
            "autocast": "bf16",
            "optimizer": "adamw",
            "attention": "sdpa",
            "grad_accum": 1,
            "lora_rank": 8,
            "lora_alpha": "16",
            "quant": "nf4",
        }
    )
    verdict = page.locator("#verdict")
    assert verdict.get_attribute("data-fits") == str(core["gpu"]["fits"]).lower()
    text = verdict.inner_text()
    assert text.startswith("Fits on" if core["gpu"]["fits"] else "Does not fit on")
    shot(page, "planner-lora-4090-en")
    # a bigger run does not fit, and the page says so
    page.fill("#seq", "8192")
    page.fill("#batch", "8")
    settle(page)
    core = estimate_json({"model": "llama-3.1-8b", "method": "lora", "batch": 8, "seq": 8192, "gpu": "rtx-4090"})
    assert page.locator("#verdict").get_attribute("data-fits") == str(core["gpu"]["fits"]).lower()


def test_precision_is_the_two_axes_of_the_schema(page):
    from cabe.schema import resolve_defaults

    page.goto(page.base + "/?lang=en")
    defaults = resolve_defaults({})
    assert page.input_value("#dtype") == defaults["dtype"] == "auto"
    assert page.input_value("#autocast") == defaults["autocast"] == "bf16"
    page.select_option("#method", "full")
    settle(page)
    assert page.input_value("#dtype") == "auto"  # the method does not move the precision
    page.select_option("#dtype", "fp32")
    settle(page)
    assert "dtype=fp32" in page.url
    core = estimate_json({"model": "llama-3.1-8b", "method": "full", "seq": 2048, "gpu": "rtx-4090", "dtype": "fp32"})
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])


def test_switch_language_and_shared_url(page):
    page.goto(page.base + "/?lang=en")
    page.fill("#n", "7.5")
    page.fill("#a", "20")
    page.fill("#model", "qwen2.5-7b")
    page.select_option("#method", "qlora")
    page.select_option("#gpu", "rtx-3090")
    settle(page)
    en_total = page.inner_text("#seed-total")
    assert en_total == "140 GB"
    plan_en = page.inner_text("#plan-total")
    page.click("#lang-switch")
    page.wait_for_load_state("networkidle")
    assert page.locator("html").get_attribute("lang") == "es"
    assert "Calculadora de VRAM para entrenar un LLM" in page.inner_text("h2#seed-h")
    assert page.input_value("#n") == "7.5"
    assert page.inner_text("#seed-total") == "140 GB"
    shot(page, "planner-qlora-es")
    # a copied address gives the same result in a fresh page
    url = page.url
    other = page.context.new_page()
    other.goto(url)
    assert other.inner_text("#seed-total") == "140 GB"
    assert other.input_value("#model") == "qwen2.5-7b"
    assert other.input_value("#method") == "qlora"
    assert other.inner_text("#plan-total") == page.inner_text("#plan-total")
    # same number, written the Spanish way
    assert plan_en.replace(",", "").replace(".", ",") == page.inner_text("#plan-total").replace(".", "")
    other.close()


def test_spanish_decimal_comma(page):
    page.goto(page.base + "/?lang=es")
    page.fill("#n", "7,5")
    page.fill("#a", "0")
    settle(page)
    assert page.inner_text("#seed-total") == "120 GB"
    assert "7,5 × 16 = 120 GB" in page.inner_text("#seed-m")
    assert page.inner_text("#seed-total-gib") == "111,76 GiB"


def test_error_message_in_language(page):
    page.goto(page.base + "/?lang=es")
    page.fill("#batch", "0")
    settle(page)
    err = page.locator("#plan-results .error")
    assert err.get_attribute("data-field") == "batch"
    core_msg = page.request.post(
        page.base + "/api/estimate", data={"model": "llama-3.1-8b", "batch": 0, "lang": "es"}
    ).json()["error"]["message"]
    assert err.inner_text() == core_msg


def test_keyboard_only(page):
    page.goto(page.base + "/?lang=en")
    page.keyboard.press("Tab")  # skip link
    assert page.evaluate("document.activeElement.className") == "skip"
    page.keyboard.press("Tab")  # language switch
    page.keyboard.press("Tab")  # parameters
    assert page.evaluate("document.activeElement.id") == "n"
    page.keyboard.press("Control+A")
    page.keyboard.type("13")
    page.keyboard.press("Tab")  # bytes per parameter select
    assert page.evaluate("document.activeElement.id") == "b"
    page.keyboard.press("Tab")  # custom
    page.keyboard.press("Tab")  # activations
    assert page.evaluate("document.activeElement.id") == "a"
    page.keyboard.press("Control+A")
    page.keyboard.type("8")
    page.keyboard.press("Enter")  # submits the form (handled in place by the script)
    settle(page)
    assert page.inner_text("#seed-total") == "216 GB"  # 13 × 16 + 8
    shot(page, "keyboard-focus", full=False)


def test_works_without_javascript(browser, server):
    ctx = browser.new_context(java_script_enabled=False, viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.goto(server + "/?lang=en")
    pg.fill("#n", "7")
    pg.fill("#a", "20")
    pg.click("section.seed button[type=submit]")
    pg.wait_for_load_state("load")
    assert pg.inner_text("#seed-total") == "132 GB"
    assert "a=20" in pg.url
    shot(pg, "no-js-132")
    ctx.close()


def test_units_gib(page):
    page.goto(page.base + "/?lang=en&model=gpt2&units=GiB")
    assert page.inner_text("#plan-total").endswith("GiB")
    page.select_option("#units", "GB")
    settle(page)
    assert page.inner_text("#plan-total").endswith(" GB")
    assert "units=GB" in page.url


def test_upload_config_json(page, tmp_path):
    import json as _json

    from cabe.models import preset

    cfg = tmp_path / "config.json"
    cfg.write_text(_json.dumps(dict(preset("gpt2").config)))
    page.goto(page.base + "/?lang=en&model=llama-3.1-8b&method=full&batch=1&seq=256&gpu=rtx-4090")
    page.set_input_files("#config-file", str(cfg))
    settle(page)
    core = estimate_json(
        {
            "config": dict(preset("gpt2").config),
            "method": "full",
            "batch": 1,
            "seq": 256,
            "gpu": "rtx-4090",
        }
    )
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])
    assert "config.json" in page.inner_text("#upload-hint")
    # a file that is not a model's config.json: tests/web/test_browser_form.py (read by /api/from-config)


def test_recipe_loss_and_savers_on_the_form(page):
    """The recipe (with its empty "none" choice), the loss kernel and the savers: the page's figure is the
    core's for the same request, and the loss follows the recipe (torchtune: chunked)."""
    page.goto(page.base + "/?lang=en")
    page.fill("#model", "llama-3.2-1b")
    page.select_option("#method", "lora")
    page.fill("#batch", "2")
    page.fill("#seq", "1024")
    assert page.locator("#recipe").input_value() == ""  # none given: a plain transformers loop
    page.select_option("#recipe", "torchtune")
    assert page.locator("#loss").input_value() == "chunked"  # the recipe's default follows
    page.check("#checkpointing")
    page.locator("#checkpoint_every").locator("xpath=ancestor::details").locator("summary").click()  # More options
    page.fill("#checkpoint_every", "3")
    page.check("#offload_activations")
    page.select_option("#gpu", "rtx-4090")
    settle(page)
    core = estimate_json(
        {
            "model": "llama-3.2-1b",
            "method": "lora",
            "batch": 2,
            "seq": 1024,
            "recipe": "torchtune",
            "checkpointing": True,
            "checkpoint_every": 3,
            "offload_activations": True,
            "gpu": "rtx-4090",
        }
    )
    assert page.locator("#verdict").get_attribute("data-fits") == str(core["gpu"]["fits"]).lower()
    shot(page, "planner-recipe-savers-en")
    # offloading without checkpointing: the core's typed error, in words
    page.uncheck("#checkpointing")
    settle(page)
    assert "checkpointing" in page.locator("#plan-results").inner_text().lower()


def _box(pg, selector: str) -> dict:
    box = pg.locator(selector).bounding_box()
    assert box is not None, selector
    return box


@pytest.mark.parametrize("lang", ["en", "es"])
def test_answer_first_on_a_phone_beside_the_form_on_a_desktop(browser, server, lang):
    """Issue 32 item 2: on a phone the verdict and total are on the first screen and stay there as the form
    changes; on a desktop the result column is beside the form."""
    url = server + f"/?lang={lang}&model=llama-3.1-8b&method=qlora&seq=2048&gpu=rtx-4090"
    base = {"model": "llama-3.1-8b", "method": "qlora", "seq": 2048, "gpu": "rtx-4090", "checkpointing": False}
    core = estimate_json(base)
    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, locale=lang)
    pg = phone.new_page()
    pg.goto(url)
    for sel in ("#plan-total", "#verdict"):
        box = _box(pg, sel)
        assert box["y"] >= 0 and box["y"] + box["height"] <= 844, (sel, box)  # on the first screen, unscrolled
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, (sel, box)
    assert pg.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])
    shot(pg, f"answer-first-phone-{lang}", full=False)
    # fill a field far down the form: the answer is still on screen, with the new number
    pg.locator("#seq").scroll_into_view_if_needed()
    pg.fill("#seq", "8192")
    settle(pg)
    core = estimate_json({**base, "seq": 8192})
    assert pg.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])
    box = _box(pg, "#verdict")
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844, box
    # the field being edited is not hidden under the answer
    field = _box(pg, "#seq")
    assert field["y"] + field["height"] <= _box(pg, "#answer")["y"], (field, _box(pg, "#answer"))
    shot(pg, f"answer-first-phone-{lang}-scrolled", full=False)
    phone.close()

    desk = browser.new_context(viewport={"width": 1280, "height": 900}, locale=lang)
    pg = desk.new_page()
    pg.goto(url)
    inputs, results = _box(pg, ".plan-inputs"), _box(pg, ".plan-results")
    assert results["x"] >= inputs["x"] + inputs["width"]  # beside, not below
    assert results["y"] < inputs["y"] + inputs["height"]
    assert pg.locator(".answer-link").is_hidden()
    shot(pg, f"answer-beside-desktop-{lang}", full=False)
    desk.close()


def test_modes_several_gpus_and_serve_match_the_cli(page):
    """Issue 32 item 1: the question switch; each question's fields appear, the others hide, the number is
    the CLI's for the same settings, and the address reopens the same answer."""
    from tests.web.test_modes import cli_json

    page.goto(page.base + "/?lang=en")
    assert page.locator("#shard").is_hidden() and page.locator("#engine").is_hidden()
    page.check("input[name=view][value=gpus]")
    page.fill("#model", "llama-3.1-8b")
    page.select_option("#method", "full")
    page.select_option("#gpu", "h100-sxm")
    page.fill("#gpus", "8")
    page.select_option("#shard", "zero3")
    settle(page)
    assert page.locator("#shard").is_visible() and page.locator("#engine").is_hidden()
    cli = cli_json("estimate", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "h100-sxm",
                   "--gpus", "8", "--shard", "zero3")  # fmt: skip
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(cli["total_bytes"])
    assert "view=gpus" in page.url and "shard=zero3" in page.url
    shot(page, "mode-gpus-en", full=False)

    page.check("input[name=view][value=serve]")
    settle(page)
    assert page.locator("#method").is_hidden() and page.locator("#shard").is_hidden()
    assert page.locator("#kv_dtype").is_visible() and page.locator("#max_num_seqs").is_hidden()
    page.select_option("#gpu", "rtx-4090")
    page.fill("#gpus", "1")
    page.select_option("#engine", "vllm")
    page.fill("#context", "8192")
    settle(page)
    assert page.locator("#max_num_seqs").is_visible() and page.locator("#n_batch").is_hidden()
    cli = cli_json("infer", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--engine", "vllm", "--context", "8192")
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(cli["total_bytes"])
    assert page.locator("#verdict").get_attribute("data-fits") == str(cli["fit"]["fits"]).lower()
    assert page.locator("#serve-engine").is_visible() and page.locator("#serve-speed").is_visible()
    shot(page, "mode-serve-en")
    # the address holds the whole state: a fresh page shows the same question and answer
    other = page.context.new_page()
    other.goto(page.url)
    assert other.locator("input[name=view][value=serve]").is_checked()
    assert other.input_value("#engine") == "vllm" and other.input_value("#context") == "8192"
    assert other.locator("#plan-total").get_attribute("data-bytes") == str(cli["total_bytes"])
    other.close()


def test_make_it_fit_on_a_phone_and_a_change_fills_the_form(browser, server):
    from tests.web.test_modes import cli_json

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True, locale="en")
    pg = phone.new_page()
    pg.goto(server + "/?lang=en&model=llama-3.1-8b&method=full&seq=2048&gpu=rtx-4090")
    pg.check("input[name=view][value=fit]")
    settle(pg)
    cli = cli_json("fit", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "rtx-4090")
    assert pg.locator("#plan-total").get_attribute("data-bytes") == str(cli["now"]["needed_bytes"])
    box = _box(pg, "#verdict")
    assert box["y"] >= 0 and box["y"] + box["height"] <= 844
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the phone
    pg.locator("#fit-changes").scroll_into_view_if_needed()
    shot(pg, "mode-fit-phone-en", full=False)
    gpus = next(r for r in cli["changes"]["by_memory"] if "gpus" in r["set"])
    pg.locator("#fit-changes a", has_text=f"{gpus['set']['gpus']} GPUs").click()
    pg.wait_for_load_state("networkidle")
    assert pg.locator("input[name=view][value=gpus]").is_checked()
    assert pg.input_value("#gpus") == str(gpus["set"]["gpus"])
    assert pg.locator("#verdict").get_attribute("data-fits") == "true"
    phone.close()


CHART_TEXT = """() => Array.from(document.querySelectorAll('svg.chart text')).map(t => {
  const svg = t.ownerSVGElement, scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  const r = t.getBoundingClientRect(), box = svg.getBoundingClientRect();
  return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * scale,
          r.left >= box.left - 1 && r.right <= box.right + 1];
})"""
SWATCHES = """() => Array.from(document.querySelectorAll('table.components tbody th')).map(th =>
  [th.textContent.trim(), getComputedStyle(th.querySelector('.swatch')).backgroundColor])"""


@pytest.mark.parametrize("width,height", [(390, 844), (1280, 900)])
def test_chart_text_is_12px_or_more_and_colours_follow_the_component(browser, server, width, height):
    """Issue 32 item 3: no chart text under 12 px at real size, on a phone and a desktop; one colour per
    component: the same component has the same colour in a LoRA and a full fine-tuning result."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 600, locale="en")
    pg = ctx.new_page()
    colours: dict[str, set[str]] = {}
    for method in ("lora", "full"):
        pg.goto(server + f"/?lang=en&model=llama-3.1-8b&method={method}&seq=2048&gpu=rtx-4090")
        sizes = pg.evaluate(CHART_TEXT)
        assert len(sizes) > 10
        small = [(text, round(px, 1)) for text, px, _inside in sizes if px < 12]
        assert not small, small
        outside = [text for text, _px, inside in sizes if not inside]
        assert not outside, outside  # no label cut at the chart's edge
        for label, colour in pg.evaluate(SWATCHES):
            colours.setdefault(label, set()).add(colour)
    assert all(len(c) == 1 for c in colours.values()), colours
    by_colour = {}
    for label, c in colours.items():
        by_colour.setdefault(next(iter(c)), []).append(label)
    assert all(len(labels) == 1 for labels in by_colour.values()), by_colour  # and no two share one
    pg.locator("svg.chart").first.scroll_into_view_if_needed()
    shot(pg, f"charts-{width}", full=False)
    ctx.close()
