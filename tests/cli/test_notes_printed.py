"""Every report note in the catalog reaches the text output too (the JSON carries them all): a note that says
what is modelled rather than traced, or how images become tokens, must not be JSON-only."""

import json
from pathlib import Path

from cabe.report.text import REPORT_NOTES

CATALOG = Path(__file__).resolve().parents[2] / "src/cabe/i18n/en/core.json"
#: note texts printed through another path: the lesson's reason (render._lesson), the recipe's unmodelled topics
#: (render._loss_line, ui.recipe_unmodelled)
ELSEWHERE = {"lesson_drops_master", "recipe_unmodelled"}


def test_every_note_of_the_catalog_is_printed_in_text():
    notes = {k.removeprefix("note.") for k in json.loads(CATALOG.read_text()) if k.startswith("note.")}
    assert notes - set(REPORT_NOTES) - ELSEWHERE == set()


def test_a_qwen3_vl_estimate_with_images_says_how_images_become_tokens(capsys):
    from cabe.cli import main

    assert main(["estimate", "--model", "qwen3-vl-2b-instruct", "--method", "lora", "--images", "2"]) == 0
    assert "smart_resize" in capsys.readouterr().out
