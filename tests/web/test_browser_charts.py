"""The timeline and the comparison in a real browser (issue 32 item 3): Debian's Chromium driven by Playwright.

A LoRA vs QLoRA vs full comparison of llama-3.1-8b built by keyboard, its totals checked against
``cabe estimate ... --json``, the shared address reopened, the language switched; chart text measured at its
real size on a phone and a desktop. Screenshots go to $CABE_SHOTS (default artifacts/screenshots/).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from tests.web.test_browser import ARGS, CHART_TEXT, CHROMIUM, SHOTS, settle
from tests.web.test_modes import cli_json

from cabe.web.timeline import chronological

pytestmark = pytest.mark.browser

OUT = Path(os.environ.get("CABE_SHOTS") or SHOTS)
START = "/?lang=en&model=llama-3.1-8b&method=lora&seq=2048&gpu=rtx-4090"
METHODS = ("lora", "qlora", "full")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def shot(pg, name: str, full: bool = False) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(OUT / f"{name}.png"), full_page=full)


def _context(browser, width, height, lang="en", **kw):
    ctx = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 600, locale=lang, **kw)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return ctx, pg, errors


def _tab_to_compare(pg) -> None:
    """From the units (the form's last field), Tab past "Compute" to the compare action."""
    pg.focus("#units")
    for _ in range(4):
        pg.keyboard.press("Tab")
        if pg.evaluate("document.activeElement.id") == "compare-pin":
            return
    raise AssertionError(pg.evaluate("document.activeElement.outerHTML"))


def _show(pg, selector: str) -> None:
    """Scroll ``selector`` to the middle of the screen: clear of the answer that stays in view (sticky on a
    desktop, at the bottom of a phone)."""
    pg.locator(selector).evaluate("e => e.scrollIntoView({block: 'center'})")


def _totals(pg) -> list[int]:
    return [int(x) for x in pg.locator("#compare td[data-bytes]").evaluate_all("els => els.map(e => e.dataset.bytes)")]


def _readable(pg, width: int) -> None:
    sizes = pg.evaluate(CHART_TEXT)
    small = [(text, round(px, 1)) for text, px, _ in sizes if px < 12]
    assert not small, small
    outside = [text for text, _, inside in sizes if not inside]
    assert not outside, outside
    assert pg.evaluate("document.documentElement.scrollWidth") <= width  # nothing wider than the screen


def test_compare_lora_qlora_full_by_keyboard_share_and_switch_language(browser, server):
    cli = [
        cli_json("estimate", "--model", "llama-3.1-8b", "--method", m, "--seq", "2048", "--gpu", "rtx-4090")
        for m in METHODS
    ]
    ctx, pg, errors = _context(browser, 1280, 900)
    pg.goto(server + START)
    assert pg.locator("#compare").count() == 0
    _tab_to_compare(pg)
    with pg.expect_navigation():
        pg.keyboard.press("Enter")  # keeps LoRA in the address
    assert "cmp1=" in pg.url and "pin=" not in pg.url
    pg.select_option("#method", "qlora")
    settle(pg)
    assert _totals(pg) == [c["total_bytes"] for c in cli[:2]]
    _tab_to_compare(pg)
    with pg.expect_navigation():
        pg.keyboard.press("Enter")  # keeps QLoRA too
    assert "cmp2=" in pg.url
    pg.select_option("#method", "full")
    settle(pg)
    # the three totals are the CLI's for the same settings, the form's last; the differences from A
    assert _totals(pg) == [c["total_bytes"] for c in cli]
    assert pg.locator("#compare tr.form-setup th").inner_text().startswith("C · Full fine-tuning")
    assert pg.locator("#compare svg g.setup").count() == 3
    assert pg.locator("#plan-total").get_attribute("data-bytes") == str(cli[2]["total_bytes"])
    _readable(pg, 1280)
    _show(pg, "#compare svg")
    shot(pg, "compare-desktop-1280-en")
    url = pg.url

    # the shared address reopens the same comparison
    other = ctx.new_page()
    other.goto(url)
    assert _totals(other) == [c["total_bytes"] for c in cli]
    assert other.input_value("#method") == "full"
    other.close()

    # in Spanish: the same numbers, the words of the other catalog, the comparison kept
    with pg.expect_navigation():
        pg.click("#lang-switch")
    assert pg.locator("html").get_attribute("lang") == "es"
    assert pg.locator("#compare-h").inner_text() == "Configuraciones lado a lado"
    assert _totals(pg) == [c["total_bytes"] for c in cli]
    assert pg.locator("#compare tr.form-setup th").inner_text().startswith("C · Fine-tuning completo")
    _readable(pg, 1280)
    _show(pg, "#compare svg")
    shot(pg, "compare-desktop-1280-es")
    es_url = pg.url
    ctx.close()
    assert not errors, errors

    # on a phone: nothing wider than the screen, no chart text under 12 px, in both languages
    for lang, address in (("en", url), ("es", es_url)):
        ctx, pg, errors = _context(browser, 390, 844, lang, has_touch=True)
        pg.goto(address)
        assert _totals(pg) == [c["total_bytes"] for c in cli]
        _readable(pg, 390)
        _show(pg, "#compare svg")
        shot(pg, f"compare-phone-390-{lang}")
        _show(pg, "#compare table")
        shot(pg, f"compare-table-phone-390-{lang}")
        # remove B: A and the form are left
        with pg.expect_navigation():
            pg.locator("#compare tr[data-setup=B] a", has_text="Quitar" if lang == "es" else "Remove").click()
        assert _totals(pg) == [cli[0]["total_bytes"], cli[2]["total_bytes"]]
        ctx.close()
        assert not errors, errors


@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize("width,height", [(390, 844), (1280, 900)])
def test_the_timeline_is_readable_and_its_peak_is_the_total(browser, server, lang, width, height):
    ctx, pg, errors = _context(browser, width, height, lang)
    pg.goto(server + f"/?lang={lang}&model=llama-3.1-8b&method=full&seq=2048&gpu=h100-sxm&view=gpus&gpus=8&shard=fsdp")
    cli = cli_json("estimate", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "h100-sxm",
                   "--gpus", "8", "--shard", "fsdp")  # fmt: skip
    columns = pg.locator("#timeline g.moment").evaluate_all("els => els.map(e => [e.dataset.phase, +e.dataset.bytes])")
    assert columns == [[m["phase"], m["total_bytes"]] for m in chronological(cli["moments"])]
    assert pg.locator("#timeline g.moment.peak").get_attribute("data-bytes") == str(cli["total_bytes"])
    assert pg.locator("#plan-total").get_attribute("data-bytes") == str(cli["total_bytes"])
    _readable(pg, width)
    _show(pg, "#timeline")
    shot(pg, f"timeline-{width}-{lang}")
    ctx.close()
    assert not errors, errors


def test_compare_without_javascript(browser, server):
    ctx = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.goto(server + START)
    with pg.expect_navigation():
        pg.click("#compare-pin")
    assert "cmp1=" in pg.url
    pg.select_option("#method", "qlora")
    with pg.expect_navigation():
        pg.click(".plan-inputs button[type=submit]:not([name])")
    assert pg.locator("#compare tr[data-setup]").count() == 2
    ctx.close()
