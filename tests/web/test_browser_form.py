"""The form's every knob in a real browser (issue 32 item 1): the rare fields under More options, the fields that do
not apply hidden as the method and optimizer change, a heading per question, your own config files dropped onto the
page filling the form (and a shared address reopening it), the host RAM of several GPUs, and make it fit's changes
on a phone. Screenshots (phone 390x844 and desktop 1280x900, en and es) go to artifacts/screenshots/."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.web.test_browser import browser, page, settle, shot  # noqa: F401  (the fixtures)

from cabe.api import estimate_json

pytestmark = pytest.mark.browser

FILES = Path(__file__).resolve().parents[1] / "configs" / "files"


def visible(pg, sel: str) -> bool:
    return pg.locator(sel).first.is_visible()


def test_more_options_and_the_fields_that_apply(page):  # noqa: F811
    page.goto(page.base + "/?lang=en&model=llama-3.1-8b&method=lora&seq=1024&gpu=rtx-4090")
    assert visible(page, "#lora_rank") and not visible(page, "#dora")  # collapsed under More options
    page.locator("#lora_rank").locator("xpath=ancestor::fieldset").locator("details.more > summary").click()
    assert visible(page, "#dora") and visible(page, "#adapter_dtype") and not visible(page, "#compute_dtype")
    page.check("#dora")
    page.fill("#lora_dropout", "0.05")
    settle(page)
    assert "dora=1" in page.url and "lora_dropout=0.05" in page.url
    core = estimate_json({"model": "llama-3.1-8b", "method": "lora", "seq": 1024, "gpu": "rtx-4090", "dora": True,
                          "lora_dropout": 0.05})  # fmt: skip
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])
    # full fine-tuning: the LoRA group goes; freeze: its own fields come; a GaLore optimizer: GaLore's
    page.select_option("#method", "full")
    assert not visible(page, "#lora_rank") and not visible(page, "#trainable_layers")
    page.select_option("#method", "freeze")
    assert visible(page, "#trainable_layers")
    assert not visible(page, "#galore_rank")
    page.select_option("#optimizer", "galore-adamw")
    assert visible(page, "#galore_rank") and visible(page, "#galore_targets")
    settle(page)
    assert page.locator("#plan-results .error").count() == 0
    shot(page, "form-freeze-galore-en")


def test_precision_sets_dtype_and_autocast(page):  # noqa: F811
    page.goto(page.base + "/?lang=en&model=llama-3.1-8b&method=lora&seq=1024&gpu=rtx-4090")
    page.locator("#precision").locator("xpath=ancestor::details").locator("summary").click()
    page.select_option("#precision", "bf16-mixed")
    assert page.input_value("#dtype") == "bf16" and page.input_value("#autocast") == "bf16"
    settle(page)
    core = estimate_json({"model": "llama-3.1-8b", "method": "lora", "seq": 1024, "gpu": "rtx-4090",
                          "precision": "bf16-mixed"})  # fmt: skip
    assert page.locator("#plan-total").get_attribute("data-bytes") == str(core["total_bytes"])


def test_a_heading_per_question(page):  # noqa: F811
    page.goto(page.base + "/?lang=es")
    for view, words in (("serve", "Servir un modelo"), ("gpus", "Entrenar en varias GPU"), ("fit", "Hacer que quepa")):
        page.check(f"input[name=view][value={view}]")
        assert page.inner_text("#plan-h") == words
        assert page.title().startswith(words)
        assert "entrenar" not in page.inner_text("header .tagline").lower() or view != "serve"


def test_dropped_configs_fill_the_form_and_the_address_reopens_it(page):  # noqa: F811
    page.goto(page.base + "/?lang=en&model=llama-3.1-8b&method=full&seq=1024&gpu=h100-sxm")
    page.set_input_files("#config-file", [str(FILES / "adapter_config.json"), str(FILES / "ds_zero2.json")])
    settle(page)
    assert page.input_value("#method") == "lora" and page.input_value("#lora_rank") == "16"
    assert page.input_value("#shard") == "zero2" and page.locator("input[name=view][value=gpus]").is_checked()
    sets = page.inner_text("#config-sets")
    assert "adapter_config.json" in sets and "lora_rank = 16" in sets and "shard = zero2" in sets
    assert "Read adapter_config.json, ds_zero2.json" in page.inner_text("#upload-hint")
    total = page.locator("#plan-total").get_attribute("data-bytes")
    assert page.locator("#host-ram").count() == 1  # several GPUs: the host RAM per node beside the per-GPU figure
    shot(page, "form-from-config-en", full=False)
    # the address holds it all: opened again, the same answer
    other = page.context.new_page()
    other.goto(page.url)
    other.wait_for_load_state("networkidle")
    assert other.input_value("#lora_rank") == "16" and other.input_value("#shard") == "zero2"
    assert other.locator("#plan-total").get_attribute("data-bytes") == total
    other.close()


def test_drag_and_drop_reads_a_yaml(page):  # noqa: F811
    page.goto(page.base + "/?lang=en&model=llama-3.1-8b&method=full&gpu=rtx-4090")
    text = (FILES / "axolotl_llama3_qlora.yml").read_text()
    dt = page.evaluate_handle(
        """(text) => { const dt = new DataTransfer();
           dt.items.add(new File([text], "axolotl.yml", {type: "application/x-yaml"})); return dt; }""",
        text,
    )
    page.dispatch_event("#drop", "drop", {"dataTransfer": dt})
    settle(page)
    assert page.input_value("#method") == "qlora" and page.input_value("#seq") == "4096"
    assert "axolotl.yml" in page.inner_text("#config-sets")


@pytest.mark.parametrize("lang", ["en", "es"])
def test_screens_phone_and_desktop(browser, server, lang):  # noqa: F811
    q = "model=llama-3.1-70b&method=lora&gpus=16&shard=fsdp&offload=both&gpu=h100-sxm&seq=2048"
    for w, h, kind in ((390, 844, "phone"), (1280, 900, "desktop")):
        ctx = browser.new_context(viewport={"width": w, "height": h}, locale=lang)
        pg = ctx.new_page()
        for view in ("train", "gpus", "serve", "fit"):
            pg.goto(f"{server}/?lang={lang}&view={view}&{q}")
            pg.wait_for_load_state("networkidle")
            assert pg.evaluate("document.documentElement.scrollWidth") <= w, (view, kind)
            shot(pg, f"form-{view}-{kind}-{lang}", full=False)
        if kind == "phone":  # make it fit's changes: every cell inside the screen
            pg.goto(f"{server}/?lang={lang}&view=fit&model=llama-3.1-8b&method=full&seq=2048&gpu=rtx-4090")
            pg.wait_for_load_state("networkidle")
            rights = pg.evaluate(
                "() => Array.from(document.querySelectorAll('#fit-changes th, #fit-changes td'))"
                ".map(c => c.getBoundingClientRect().right)"
            )
            assert rights and max(rights) <= w
            pg.locator("#fit-changes").scroll_into_view_if_needed()
            shot(pg, f"form-fit-changes-phone-{lang}", full=False)
        ctx.close()


def test_a_bad_file_says_the_typed_sentence(browser, server, tmp_path):  # noqa: F811
    """Not a model's config.json and not a config cabe reads: /api/from-config's 422 (the console logs the status,
    so this page has its own context), its sentence naming the file, as an alert; no script error."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en")
    pg = ctx.new_page()
    script_errors: list[str] = []
    pg.on("pageerror", lambda e: script_errors.append(str(e)))
    pg.goto(server + "/?lang=en")
    pg.set_input_files("#config-file", str(bad))
    settle(pg)
    assert pg.inner_text("#upload-hint").startswith("bad.json is not valid JSON")
    assert pg.get_attribute("#upload-hint", "role") == "alert"
    assert not script_errors
    ctx.close()


def test_fsdp_knobs_show_with_fsdp_only(page):  # noqa: F811
    page.goto(page.base + "/?lang=en&view=gpus&model=llama-3.1-8b&gpus=8&shard=zero3&gpu=h100-sxm")
    page.locator("#shard").locator("xpath=ancestor::fieldset").locator("details.more > summary").click()
    assert not visible(page, "#fsdp_wrap") and not visible(page, "#cp_impl")
    page.select_option("#shard", "fsdp")
    settle(page)
    assert visible(page, "#fsdp_wrap") and visible(page, "#reshard_after_forward") and not visible(page, "#cp_impl")
    page.fill("#cp", "2")
    settle(page)
    assert visible(page, "#cp_impl")
