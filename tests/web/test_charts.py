"""One colour per component (cabe.web.charts, issue 32 item 3): the palette, the table swatches of the style sheet
and the components that a step holds together, on one GPU and on several."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from cabe import api
from cabe.web.charts import COMPONENT_COLOURS, PALETTE, _wrap, colour_index


def test_the_swatches_are_the_palette_and_no_two_components_share_a_colour():
    css = (resources.files("cabe") / "web" / "static" / "style.css").read_text()
    swatches = {int(i): c for i, c in re.findall(r"\.c(\d+)\{background:(#[0-9a-f]{6})\}", css)}
    assert swatches == dict(enumerate(PALETTE))
    assert len(set(PALETTE)) == len(PALETTE)
    assert sorted(COMPONENT_COLOURS.values()) == list(range(len(COMPONENT_COLOURS)))


@pytest.mark.parametrize(
    "setup",
    [{"shard": s} for s in ("ddp", "zero1", "zero2", "zero3", "fsdp")]
    + [{"shard": "zero3", "pp": 2}, {"model": "qwen3-30b-a3b", "shard": "fsdp", "ep": 8}],
)
@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_components_of_a_sharded_step_have_colours_of_their_own(setup, method):
    request = {"model": "llama-3.1-8b", "method": method, "gpus": 8, "gpu": "h100-sxm", **setup}
    out = api.estimate_json(request)
    keys = {k for m in out["moments"] for k, v in m["components"].items() if v} | {"allocator_slack", "cuda_context"}
    assert keys <= set(COMPONENT_COLOURS), keys - set(COMPONENT_COLOURS)
    assert len({colour_index(k) for k in keys}) == len(keys)


def test_a_long_axis_label_goes_on_two_lines():
    assert _wrap("sequence length (tokens, log scale)", 40) == ["sequence length (tokens, log scale)"]
    assert _wrap("longitud de secuencia (tokens, escala log.)", 36) == [
        "longitud de secuencia",
        "(tokens, escala log.)",
    ]
