"""Issue 32 item 5: each question of the page driven by keyboard in a real browser (Debian's Chromium), its number
checked against the CLI's ``--json`` for the same settings, the language switched with the keyboard (the answer and
the question stay), the address shared into a fresh phone-sized page, and screenshots (desktop and phone, en and es)
saved to artifacts/screenshots/ for a person to look at."""

from __future__ import annotations

import pytest
from tests.web.test_browser import browser, settle, shot  # noqa: F401  (the module's browser fixture)
from tests.web.test_modes import cli_json

pytestmark = pytest.mark.browser

#: the page's first example (cabe.web.form.EXAMPLE) as CLI flags
BASE = ("--model", "llama-3.1-8b", "--method", "lora", "--seq", "2048", "--gpu", "rtx-4090")
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}


def _tab_to(pg, test: str, limit: int = 120, key: str = "Tab") -> None:
    """Press Tab (or ``key``) until the focused element passes ``test`` (a JS expression over ``e``, the active
    element)."""
    for _ in range(limit):
        pg.keyboard.press(key)
        if pg.evaluate(f"(() => {{ const e = document.activeElement; return !!e && ({test}); }})()"):
            return
    raise AssertionError(f"Tab never reached {test}")


def _type_into(pg, field_id: str, text: str) -> None:
    _tab_to(pg, f"e.id === {field_id!r}")
    pg.keyboard.press("Control+A")
    pg.keyboard.type(text)


def _choose_view(pg, view: str) -> None:
    """The question switch is a radio group: Tab into it, then arrow keys to the question."""
    _tab_to(pg, "e.name === 'view'")
    for _ in range(4):
        if pg.evaluate("document.activeElement.value") == view:
            break
        pg.keyboard.press("ArrowRight")
    assert pg.locator(f"input[name=view][value={view}]").is_checked()
    settle(pg)


def _bytes(pg) -> str | None:
    return pg.locator("#plan-total").get_attribute("data-bytes")


#: each question: what the keyboard sets (field id, text), the CLI command and flags that mean the same, and the
#: JSON key of the number the page shows
CASES = {
    "train": ((("batch", "2"),), ("estimate", *BASE, "--batch", "2"), ("total_bytes",)),
    "gpus": ((("gpus", "4"),), ("estimate", *BASE, "--gpus", "4", "--shard", "fsdp"), ("total_bytes",)),
    "serve": (
        (("context", "8192"),),
        ("infer", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--context", "8192"),
        ("total_bytes",),
    ),
    "fit": ((("batch", "4"),), ("fit", *BASE, "--batch", "4"), ("now", "needed_bytes")),
}


@pytest.mark.parametrize("view", list(CASES))
def test_each_question_by_keyboard_equals_the_cli_switches_language_and_shares(browser, server, view):  # noqa: F811
    typed, cli_args, path = CASES[view]
    ctx = browser.new_context(viewport=DESKTOP, locale="en-US")
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server + "/?lang=en")
    settle(pg)
    if view != "train":
        _choose_view(pg, view)
    for field_id, text in typed:
        _type_into(pg, field_id, text)
    if view == "gpus":  # the select takes type-ahead: "fsdp" picks full sharding
        _tab_to(pg, "e.id === 'shard'")
        pg.keyboard.type("fsdp")
        assert pg.input_value("#shard") == "fsdp"
    pg.keyboard.press("Enter")  # submits (handled in place by the script)
    settle(pg)
    want = cli_json(*cli_args)
    for k in path:
        want = want[k]
    assert _bytes(pg) == str(want), (view, _bytes(pg), want)
    assert f"view={view}" in pg.url or view == "train"
    shot(pg, f"keyboard-{view}-desktop-en", full=False)

    # the language, switched from the keyboard: back up the page to its second stop (after the skip link)
    _tab_to(pg, "e.id === 'lang-switch'", limit=300, key="Shift+Tab")
    pg.keyboard.press("Enter")
    pg.wait_for_load_state("networkidle")
    settle(pg)
    assert pg.locator("html").get_attribute("lang") == "es"
    assert pg.locator(f"input[name=view][value={view}]").is_checked()
    assert _bytes(pg) == str(want)
    shot(pg, f"keyboard-{view}-desktop-es", full=False)

    # the address, shared onto a phone: the same question, settings and answer, nothing wider than the screen
    phone = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True, locale="es-ES")
    other = phone.new_page()
    other.goto(pg.url)
    settle(other)
    assert other.locator(f"input[name=view][value={view}]").is_checked()
    for field_id, text in typed:
        assert other.input_value(f"#{field_id}") == text
    assert _bytes(other) == str(want)
    assert other.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(other, f"shared-{view}-phone-es", full=False)
    other.goto(pg.url.replace("lang=es", "lang=en"))
    settle(other)
    assert _bytes(other) == str(want)
    shot(other, f"shared-{view}-phone-en", full=False)
    phone.close()
    ctx.close()
    assert not errors, errors
