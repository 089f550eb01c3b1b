"""The form holds every knob the CLI has (issue 32 item 1): each field of ``api.estimate``, ``api.fit`` and
``api.infer`` is on the page with the schema's default, the rare ones under "More options", the ones that do not
apply hidden, and the address holds the whole state (a shared link reopens it)."""

from __future__ import annotations

import re

import pytest

from cabe import api, i18n, schema
from cabe.web import form, modes, page


@pytest.mark.parametrize("command", ["api.estimate", "api.fit", "api.infer"])
def test_every_schema_field_of_the_command_is_on_the_form(command):
    """Fails when a field is added to the schema and not to the form (cabe.web.form.FIELDSETS / cabe.web.modes)."""
    html = page.render_page({}, "en")
    missing = []
    for f in schema.fields_for(command):
        if f.name == "explain":  # not a knob: the page always asks for each knob's effect (page._plan_view)
            assert 'id="knobs"' in html
            continue
        key = form.form_key(f.name, command)
        if key == "config":
            present = 'id="config-file" type="file"' in html
        else:
            present = f'name="{key}"' in html
        if not present:
            missing.append(f.name)
    assert not missing


def test_the_new_fields_start_at_the_schemas_defaults():
    s = form.state({})
    for name in ("precision", "optimizer_impl", "compute_dtype", "trainable_layers", "prompt_tokens", "galore_rank",
                 "galore_targets", "dora", "lora_dropout", "kbit_prep", "modules_to_save", "trainable_fp32",
                 "adapter_dtype", "optimizer_in_backward", "objective"):  # fmt: skip
        f = schema.field(name)
        assert s[name] == form.form_text(f, f.default), name


def _fieldset_of(html: str, name: str) -> str:
    """The opening tag of the fieldset that holds the control ``name``, and whether it sits under More options."""
    i = html.index(f'name="{name}"')
    start = html.rindex("<fieldset", 0, i)
    return html[start : html.index(">", start) + 1]


def test_rare_fields_are_under_more_options():
    html = page.render_page({"method": "qlora"}, "en")
    for name in ("dora", "lora_dropout", "modules_to_save", "kbit_prep", "precision", "cpu_ram_efficient_loading"):
        i = html.index(f'name="{name}"')
        opened, closed = html.rfind('<details class="more">', 0, i), html.rfind("</details>", 0, i)
        assert opened > closed, name
    for name in ("method", "objective", "lora_rank", "gpus", "shard", "context"):
        i = html.index(f'name="{name}"')
        assert html.rfind('<details class="more">', 0, i) <= html.rfind("</fieldset>", 0, i), name
    assert html.count('<details class="more">') >= 4 and i18n.t("web.plan.more", "en") in html


def _hidden(html: str, name: str) -> bool:
    """Is the control hidden: in a hidden fieldset or in a hidden wrapper?"""
    i = html.index(f'id="{name}"')
    fs = html.rindex("<fieldset", 0, i)
    if " hidden>" in html[fs : html.index(">", fs) + 1]:
        return True
    div = html.rfind("<div data-", fs, i)
    return div >= 0 and html.rfind("</div>", div, i) < 0 and " hidden>" in html[div : html.index(">", div) + 1]


def test_fields_that_do_not_apply_are_hidden():
    full = page.render_page({"method": "full", "model": "llama-3.1-8b"}, "en")
    assert _hidden(full, "lora_rank") and _hidden(full, "dora")  # the LoRA group: LoRA and QLoRA only
    assert _hidden(full, "trainable_layers") and _hidden(full, "prompt_tokens") and _hidden(full, "galore_rank")
    assert not _hidden(full, "objective") and not _hidden(full, "precision")
    freeze = page.render_page({"method": "freeze", "model": "llama-3.1-8b"}, "en")
    assert not _hidden(freeze, "trainable_layers") and not _hidden(freeze, "trainable_fp32")
    lora = page.render_page({"method": "lora", "model": "llama-3.1-8b"}, "en")
    assert not _hidden(lora, "dora") and not _hidden(lora, "adapter_dtype") and _hidden(lora, "compute_dtype")
    galore = page.render_page({"method": "full", "optimizer": "galore-adamw", "model": "llama-3.1-8b"}, "en")
    assert not _hidden(galore, "galore_rank") and not _hidden(galore, "galore_targets")
    # the script decides the same from the same attributes
    assert 'data-methods="lora qlora"' in lora and 'data-lowrank="1"' in lora


SHARED = {
    "view": "train",
    "model": "llama-3.1-8b",
    "method": "lora",
    "seq": "1024",
    "gpu": "rtx-4090",
    "dora": "1",
    "lora_dropout": "0.05",
    "modules_to_save": "lm_head",
    "adapter_dtype": "model",
    "lora_rank": "16",
    "objective": "sft",
    "precision": "bf16-mixed",
    "optimizer": "adamw",
    "optimizer_impl": "fused",
    "optimizer_in_backward": "",
}


def test_a_shared_address_with_the_new_fields_reopens_the_same_answer():
    """The page's link (its query string) carries the new fields; opening it shows them on the form and computes
    what /api/estimate computes for the same request."""
    html = page.render_page(SHARED, "en")
    assert re.search(r'id="dora" name="dora" type="checkbox" value="1" checked', html)
    assert (
        'id="lora_dropout" name="lora_dropout" type="text" inputmode="decimal" autocomplete="off" value="0.05"' in html
    )
    assert '<option value="model" selected>' in html and '<option value="bf16-mixed" selected>' in html
    # the precision sets dtype and autocast: the form shows the pair it implies
    s = form.state(SHARED)
    assert (s["dtype"], s["autocast"]) == schema.PRECISIONS["bf16-mixed"]
    link = page._link(s, lang="en")
    from urllib.parse import parse_qsl

    reopened = dict(parse_qsl(link[1:], keep_blank_values=True))
    assert form.state(reopened) == s
    want = api.estimate_json({**{k: v for k, v in SHARED.items() if k not in ("view", "optimizer_in_backward")},
                              "dora": True, "lora_dropout": 0.05, "seq": 1024, "lora_rank": 16})  # fmt: skip
    got = re.search(r'id="plan-total" data-bytes="(\d+)"', page.render_fragments(reopened, "en")["plan"])
    assert got and int(got.group(1)) == want["total_bytes"]
    # DoRA and the dropout change the answer: they are read, not dropped
    plain = api.estimate_json({"model": "llama-3.1-8b", "method": "lora", "seq": 1024, "lora_rank": 16,
                               "gpu": "rtx-4090", "precision": "bf16-mixed"})  # fmt: skip
    assert want["total_bytes"] != plain["total_bytes"]


def test_a_precision_that_contradicts_the_chosen_dtype_is_said_not_dropped():
    q = {"model": "llama-3.1-8b", "method": "lora", "precision": "bf16-mixed", "dtype": "fp32"}
    s = form.state(q)  # the page still opens
    html = page.render_fragments(q, "en")["plan"]
    assert 'class="error"' in html and 'data-field="dtype"' in html and s["precision"] == "bf16-mixed"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_a_heading_per_question(lang):
    seen = set()
    for v in modes.VIEWS:
        html = page.render_page({"view": v}, lang)
        title = i18n.t(f"web.head.{v}.title", lang)
        assert f"<title>{title} — " in html
        assert re.search(rf'<span data-views="{v}">{re.escape(title)}</span>', html)
        seen.add(title)
    assert len(seen) == len(modes.VIEWS)


def test_several_gpus_show_the_host_ram_per_node_from_the_json():
    q = {"view": "gpus", "model": "llama-3.1-70b", "method": "lora", "gpus": "16", "shard": "fsdp",
         "offload": "both", "gpu": "h100-sxm", "seq": "2048"}  # fmt: skip
    body = form.plan_request(form.state(q))
    out = api.estimate_json(body)
    dist = out["distributed"]
    html = page.render_fragments(q, "en")["plan"]
    line = re.search(r'<p class="host" id="host-ram">([^<]*)</p>', html)
    assert line, html[:800]
    u = page.Units("GB", "en")
    for key in ("host_ram_bytes_per_node", "host_ram_load_peak_bytes_per_node", "host_page_cache_load_bytes_per_node"):
        assert f"{u.of(dist[key])} GB" in line.group(1), key
    assert dist["host_ram_bytes_per_node"] > 0  # the offloaded states of 8 GPUs
    assert html.index('id="host-ram"') < html.index("</div>")  # in the answer block, beside the per-GPU total
    assert '<span class="per-gpu">per GPU</span>' in html


def test_a_field_that_acts_only_beside_another_value_is_hidden_and_not_sent():
    """The schema's companions (cabe.schema.inapplicable), asked, not listed: the FSDP knobs act with FSDP only,
    ``cp_impl`` with context parallelism, ``loss_parallel`` with tensor parallelism, ``loss_chunks`` with the chunked
    loss; hidden while they would not act, and not sent (the API would refuse a changed one)."""
    zero3 = {"view": "gpus", "model": "llama-3.1-8b", "gpus": "8", "shard": "zero3", "gpu": "h100-sxm"}
    hidden = form.not_applying(form.state(zero3))
    assert {"cpu_ram_efficient_loading", "reshard_after_forward", "fsdp_wrap", "cp_impl", "loss_parallel"} <= set(
        hidden
    )
    fsdp = form.not_applying(form.state({**zero3, "shard": "fsdp", "tp": "2", "cp": "2"}))
    assert not {"cpu_ram_efficient_loading", "reshard_after_forward", "fsdp_wrap", "cp_impl", "loss_parallel"} & set(
        fsdp
    )
    assert "loss_chunks" in hidden and "loss_chunks" not in form.not_applying(form.state({"recipe": "torchtune"}))
    html = page.render_page(zero3, "en")
    assert _hidden(html, "cp_impl") and _hidden(html, "fsdp_wrap") and not _hidden(html, "offload")
    # a changed value of a field that does not act is not sent: the page answers, the API would refuse it
    q = {**zero3, "cp_impl": "ring"}
    assert "cp_impl" not in form.plan_request(form.state(q))
    assert 'class="error"' not in page.render_fragments(q, "en")["plan"]
    assert page.render_fragments(q, "en")["not_applying"] == form.not_applying(form.state(q))


@pytest.mark.parametrize("text", ["²", "٣", "3"])
def test_a_number_field_takes_only_ascii_digits(client, text):
    """ "²".isdigit() is True but int("²") raises: such text goes to the core, which names the error (a 200 page
    with the typed sentence, never a 500; found by the comparison's fuzz)."""
    from urllib.parse import urlencode

    assert form.request_value(schema.field("batch"), text) == (3 if text == "3" else text)
    r = client.post("/fragment", json={"query": urlencode({"model": "gpt2", "batch": text})})
    assert r.status_code == 200
