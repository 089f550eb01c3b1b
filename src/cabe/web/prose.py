"""The figures of the page's article (templates/details.html), computed rather than written: the seed's worked
example (M = N·B, V = M + A: :func:`cabe.analytic.estimate_simple`), its presets' bytes per parameter
(``BYTES_PER_PARAM_PRESETS``, the seed card's choices), what the planner counts for the same optimizers
(:func:`cabe.analytic.estimate_lesson`'s correct breakdown, the fp32 master copy kept) and, for LoRA, the page's own
example request estimated in full and with LoRA on its card. A sentence of the article can then not disagree with
the numbers the page computes."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from cabe import api, i18n
from cabe.analytic import estimate_lesson, estimate_simple
from cabe.analytic.lesson import BYTES_PER_PARAM_PRESETS
from cabe.training import TrainingSetup
from cabe.units import GB

#: the seed's worked example: 7 billion parameters, mixed-precision Adam, then 20 GB of activations
EXAMPLE_PARAMS = 7.0
EXAMPLE_ACTIVATIONS = 20.0
#: the card the example's model states are measured against (one conventional accelerator)
BIG_CARD_GB = 80


def _gb(nbytes: float, lang: str) -> str:
    return i18n.fmt_number(round(nbytes / GB, 1), lang)


def details(example: Mapping[str, Any], lang: str) -> dict[str, str]:
    """The placeholders of ``web.details.*``: strings in ``lang``, from the computations."""
    return dict(_details(tuple(sorted(example.items())), lang))


@cache
def _details(example: tuple[tuple[str, Any], ...], lang: str) -> tuple[tuple[str, str], ...]:
    num = lambda x: i18n.fmt_number(x, lang)  # noqa: E731
    b = BYTES_PER_PARAM_PRESETS["adam-mixed"]
    bare = estimate_simple(EXAMPLE_PARAMS, b, 0.0)
    with_act = estimate_simple(EXAMPLE_PARAMS, b, EXAMPLE_ACTIVATIONS)
    counted = {  # the lesson mode's correct figure (its breakdown with the fp32 master copy kept)
        name: (estimate_lesson(EXAMPLE_PARAMS, TrainingSetup(optimizer=name, precision="bf16-amp")).lesson or {})
        for name in ("adamw", "adamw-8bit", "sgd-momentum")
    }
    req = dict(example)
    lora = api.build({**req, "method": "lora"})
    full = api.build({**req, "method": "full"})
    fit = lora.gpu or {}
    out = {
        "n": num(EXAMPLE_PARAMS),
        "b": num(b),
        "m": _gb(bare.total_bytes, lang),
        "a0": num(0),
        "v0": _gb(bare.total_bytes, lang),
        "a": num(EXAMPLE_ACTIVATIONS),
        "v": _gb(with_act.total_bytes, lang),
        "card": num(BIG_CARD_GB),
        "adam8": num(BYTES_PER_PARAM_PRESETS["adam-8bit"]),
        "sgdm": num(BYTES_PER_PARAM_PRESETS["sgd-momentum"]),
        "adam_counted": num(counted["adamw"]["bytes_per_param"]),
        "adam8_counted": num(counted["adamw-8bit"]["bytes_per_param"]),
        "sgdm_counted": num(counted["sgd-momentum"]["bytes_per_param"]),
        "model": (lora.model or {}).get("display") or str(req.get("model", "")),
        "seq": num(lora.setup["seq"]),
        "batch": num(lora.setup["batch"]),
        "full": _gb(full.total_bytes, lang),
        "lora": _gb(lora.total_bytes, lang),
        "gpu": fit.get("display", ""),
        "verdict": i18n.t("ui.fits" if fit.get("fits") else "ui.does_not_fit", lang),
    }
    return tuple(out.items())
