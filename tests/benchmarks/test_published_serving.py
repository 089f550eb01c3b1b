"""benchmarks/published/serving.csv and serving_compare.py: every row parses, names its source and URL, and is computed.

The figures are reported by serving_compare.py (serving.md), not pinned here: the engines' modules may move them.
What is pinned is the CSV's shape, that every row reaches cabe (``infer_json`` for vLLM / SGLang / transformers, with
``tp`` where the run used it), and the allocator arithmetic the notes rest on."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "published"
COLUMNS = [
    "id",
    "source",
    "engine",
    "engine_version",
    "model",
    "cabe_model",
    "gpu",
    "cabe_gpu",
    "tp",
    "settings",
    "metric",
    "unit",
    "measured",
    "status",
    "notes",
    "url",
]


def _compare() -> ModuleType:
    spec = importlib.util.spec_from_file_location("published_serving_compare", HERE / "serving_compare.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


compare = _compare()
ROWS = list(csv.DictReader((HERE / "serving.csv").open()))
compare.ROWS[:] = ROWS


def test_csv_columns_and_ids():
    assert list(ROWS[0]) == COLUMNS
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))
    assert len(ROWS) >= 35


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r["id"])
def test_every_row_has_a_source_and_a_setup(row):
    assert row["source"].strip() and row["url"].startswith("https://")
    assert row["engine"] in ("vllm", "sglang", "llamacpp", "hf")
    assert row["unit"] in compare.UNIT and row["status"] in ("compared", "shown")
    assert float(row["measured"]) > 0 and int(row["tp"]) >= 1
    kw = compare.settings(row["settings"])
    assert set(kw) <= set(compare.REQUEST_KEYS) | {"n_ctx"}, kw  # every setting is a request field of cabe infer
    if row["cabe_model"].startswith("config:"):
        cfg = json.loads((HERE / "configs" / row["cabe_model"].removeprefix("config:")).read_text())
        assert cfg["_source"].startswith("https://")


@pytest.mark.parametrize("row", [r for r in ROWS if r["status"] == "compared"], ids=lambda r: r["id"])
def test_every_compared_row_is_computed(row):
    figure, given, _peer, how = compare.cabe_figure(row)
    assert figure is not None or given is not None
    if row["engine"] != "llamacpp":
        assert how.startswith("infer_json(")
        if int(row["tp"]) > 1:
            assert '"tp": ' + row["tp"] in how


def test_tp_rows_take_the_gpu_share():
    """The TP rows no longer wait: the non-torch memory of a TP 2 rank holds its NCCL / custom all-reduce buffers."""
    rows = {r["id"]: r for r in ROWS}
    tp1, _, _, _ = compare.cabe_figure(rows["vllm-llama3-8b-tp1-non-torch"])
    tp2, _, _, _ = compare.cabe_figure(rows["vllm-llama3-8b-tp2-non-torch"])
    assert tp1 is not None and tp2 is not None and tp2 > tp1
    assert not any(r["status"].startswith("waiting") for r in ROWS)


def test_allocator_given_the_logged_pool():
    """vLLM's blocks from a logged pool: Qwen3-1.7B (28 layers, 8 KV heads of 128, fp16) in pages of 16 tokens is
    16 × 28 × 2 × 8 × 128 × 2 B = 1,835,008 B a block; 18.78 GiB // that = 10,988 blocks = 175,808 tokens (issue
    #33263 logged 175,856: 18.78 is rounded to 10 MiB)."""
    row = next(r for r in ROWS if r["id"] == "vllm-qwen3-1.7b-24gb-tokens")
    _figure, given, _peer, _how = compare.cabe_figure(row)
    assert given == int(18.78 * (1 << 30) // 1_835_008) * 16 == 175_808


def test_mla_bytes_per_sequence():
    """DeepSeek-V2-Lite's latent cache: 27 layers × (512 + 64) × 2 B × 32,768 tokens = 0.949 GiB (issue #15871: 0.95)."""
    row = next(r for r in ROWS if r["id"] == "vllm-dsv2-lite-mla-per-seq")
    figure, _given, _peer, _how = compare.cabe_figure(row)
    assert figure == pytest.approx(27 * 576 * 2 * 32768 / (1 << 30))


def test_compare_writes_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "OUT", tmp_path / "serving.md")
    compare.ROWS.clear()
    try:
        assert compare.main() == 0
    finally:
        compare.ROWS[:] = ROWS
    text = (tmp_path / "serving.md").read_text()
    for row in ROWS:
        assert f"| {row['id']} |" in text
    assert "## Why the misses" in text and "## The requests" in text
