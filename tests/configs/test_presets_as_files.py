"""Configs as they are on the Hub (issue 29, item 3): every preset is the Hub's ``config.json`` plus a ``_cabe`` block
(its source in ``_cabe``); without that block, as the file a user downloads, it loads through ``cabe estimate --model
<file>`` (the CLI's file path, the reader's non-finite numbers allowed) and counts the parameters the preset states
(transformers' meta-device count, tests/test_presets.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cabe.cli import main

PRESETS = sorted(Path(__file__).resolve().parents[2].joinpath("src/cabe/data/models").glob("*.json"))


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_as_a_downloaded_config_json(tmp_path, capsys, path):
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data.pop("_cabe")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data))
    rc = main(["estimate", "--model", str(config), "--json", "--lang", "en"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    report = json.loads(out)
    assert report["model"]["source"] == "file"
    assert report["parameters"] == meta["parameters"], (path.stem, report["parameters"], meta["parameters"])


TINY = sorted(Path(__file__).resolve().parent.joinpath("files").glob("*_tiny_config.json"))


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_every_model_config_in_the_tests_loads(capsys, path):
    """The small model configs the tests keep (each family's own layout, from transformers' tests) load as files."""
    rc = main(["estimate", "--model", str(path), "--json", "--lang", "en"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(out)["parameters"] > 0
