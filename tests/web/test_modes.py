"""The page's questions (issue 32 item 1): several GPUs and serving, from the schema's fields, with the
numbers of the CLI's ``--json`` for the same settings, the fields that do not apply hidden, and the whole
state in the address."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cabe import i18n, schema
from cabe.web import modes, page

SRC = str(Path(__file__).resolve().parents[2] / "src")


def cli_json(*args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-m", "cabe", *args, "--json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def total_of(html: str) -> int:
    m = re.search(r'id="plan-total" data-bytes="(\d+)"', html)
    assert m, html[:500]
    return int(m.group(1))


GPUS_QUERY = {"view": "gpus", "model": "llama-3.1-8b", "method": "full", "seq": "2048", "gpu": "h100-sxm",
              "gpus": "8", "shard": "zero3"}  # fmt: skip
SERVE_QUERY = {"view": "serve", "model": "llama-3.1-8b", "gpu": "rtx-4090", "engine": "vllm", "context": "8192",
               "i_batch": "4"}  # fmt: skip


def test_several_gpus_equals_the_cli():
    cli = cli_json("estimate", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "h100-sxm",
                   "--gpus", "8", "--shard", "zero3")  # fmt: skip
    html = page.render_fragments(GPUS_QUERY, "en")["plan"]
    assert total_of(html) == cli["total_bytes"]
    # the same fields on one card do not count: the train view reads none of them
    one = cli_json("estimate", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "h100-sxm")
    assert total_of(page.render_fragments({**GPUS_QUERY, "view": "train"}, "en")["plan"]) == one["total_bytes"]
    assert one["total_bytes"] > cli["total_bytes"]  # ZeRO-3 over 8 GPUs holds an eighth of the states per GPU


def test_serve_equals_the_cli():
    cli = cli_json("infer", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--engine", "vllm", "--context", "8192",
                   "--batch", "4")  # fmt: skip
    html = page.render_fragments(SERVE_QUERY, "en")["plan"]
    assert total_of(html) == cli["total_bytes"]
    fits = str(cli["fit"]["fits"]).lower()
    assert f'data-fits="{fits}"' in html
    concurrency = i18n.fmt_number(cli["engine"]["max_concurrent_sequences"], "en", 0)
    assert f"{concurrency}×" in html  # the engine's concurrency, in the CLI's words
    assert "tokens/s" in html  # the speed bounds


@pytest.mark.parametrize("lang", ["en", "es"])
def test_every_field_of_every_view_has_a_label(lang):
    missing = [
        w["label"]
        for _legend, keys, _views in modes.FIELDSETS
        for w in (page.widget(k, lang) for k in keys)
        if i18n.t(w["label"], lang) == w["label"]
    ]
    missing += [k for v in modes.VIEWS for k in (f"web.view.{v}",) if i18n.t(k, lang) == k]
    assert not missing


def test_the_fields_are_the_schemas_with_its_defaults():
    s = page.state({"view": "serve"})
    for key in modes.SERVE_KEYS + modes.PARALLEL + modes.SHARDING:
        f = modes.field_of(key)[0]
        assert s[key] == page.form_text(f, f.default), key
    # every serving field of /api/infer is on the form (the prefixed ones under i_)
    names = {f.name for f in schema.fields_for("api.infer") if f.group in ("serving", "gpus")}
    assert names == {k.removeprefix("i_") for k in modes.SERVE_KEYS + modes.PARALLEL}
    assert modes.field_of("i_batch")[0] is schema.field("batch", "api.infer")
    assert modes.field_of("batch")[0] is schema.field("batch")


def test_fields_that_do_not_apply_are_hidden_and_the_address_reopens_it():
    html = page.render_page(SERVE_QUERY, "en")
    fieldsets = re.findall(r'<fieldset data-views="([^"]*)"( hidden)?>', html)
    assert fieldsets and all(("serve" in views.split()) != bool(hidden) for views, hidden in fieldsets)
    # the engine's knobs: vLLM's shown, llama.cpp's hidden
    assert re.search(r'<div data-engine="vllm">\s*<label for="max_num_seqs"', html)
    assert re.search(r'<div data-engine="llamacpp" hidden>\s*<label for="n_batch"', html)
    assert 'name="view" value="serve" checked' in html
    assert 'id="context" name="context" type="text" inputmode="numeric" autocomplete="off" value="8192"' in html
    # a knob of another engine left in the address is not sent (the API would refuse it)
    again = page.render_fragments({**SERVE_QUERY, "n_batch": "4096"}, "en")["plan"]
    assert total_of(again) == total_of(page.render_fragments(SERVE_QUERY, "en")["plan"])


def test_an_unknown_view_is_the_first():
    assert page.state({"view": "nope"})["view"] == modes.DEFAULT_VIEW


def test_serve_on_a_tensor_parallel_replica_shows_one_gpu():
    """tp 2: the headline and the verdict are the fullest GPU's (``parallel.per_gpu_bytes`` and its fit), as the
    CLI prints them, not the whole model on one card."""
    cli = cli_json("infer", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "vllm", "--gpus", "2",
                   "--tp", "2")  # fmt: skip
    q = {"view": "serve", "model": "llama-3.1-8b", "gpu": "h100-sxm", "engine": "vllm", "gpus": "2", "tp": "2"}
    html = page.render_fragments(q, "en")["plan"]
    per_gpu = cli["parallel"]["per_gpu_bytes"]
    assert total_of(html) == per_gpu < cli["total_bytes"]
    need = cli["parallel"]["fit"]["needed_bytes"]
    assert f"{i18n.fmt_number(round(need / 1e9, 2), 'en', 2)} GB of" in html  # web.res.needed with the GPU's need
    assert 'id="serve-per-gpu"' in html and "─" not in html


def test_make_it_fit_equals_the_cli_and_each_change_fills_the_form():
    cli = cli_json("fit", "--model", "llama-3.1-8b", "--method", "full", "--seq", "2048", "--gpu", "rtx-4090")
    q = {"view": "fit", "model": "llama-3.1-8b", "method": "full", "seq": "2048", "gpu": "rtx-4090"}
    html = page.render_fragments(q, "en")["plan"]
    assert total_of(html) == cli["now"]["needed_bytes"]
    assert f'data-fits="{str(cli["now"]["fits"]).lower()}"' in html
    rows = re.findall(r'<tr class="(ok|no)" data-fits="(true|false)"><th scope="row"><a href="\?([^"]+)">', html)
    assert len(rows) == len(cli["changes"]["by_memory"]) > 0
    for (_cls, fits, _href), r in zip(rows, cli["changes"]["by_memory"], strict=True):
        assert fits == str(r["fits"]).lower()
    # the link of the first change that sets the GPU count opens the several-GPU view with it set,
    # and that page's estimate fits, as the solver said
    change = next(r for r in cli["changes"]["by_memory"] if "gpus" in r["set"])
    href = rows[cli["changes"]["by_memory"].index(change)][2].replace("&amp;", "&")
    opened = dict(x.split("=", 1) for x in href.split("&"))
    from urllib.parse import unquote_plus

    opened = {k: unquote_plus(v) for k, v in opened.items()}
    assert opened["view"] == "gpus" and opened["gpus"] == str(change["set"]["gpus"]) and opened["lang"] == "en"
    after = page.render_fragments(opened, "en")["plan"]
    assert 'data-fits="true"' in after
    assert total_of(after) == change["total_bytes"]


def test_a_list_of_choices_is_a_comma_list_not_a_select():
    """``solve`` takes several of its choices: a select sent only its first (``solve=batch``)."""
    w = page.widget("solve", "en")
    assert w["kind"] == "input"
    assert page.state({"view": "fit"})["solve"] == ",".join(schema.field("solve", "api.fit").default)
