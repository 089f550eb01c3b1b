"""The words of :mod:`cabe.knob_effects`: each memory knob's effect on the peak, the components that changed and how
they grew, from the result's own figures (catalog ``knob.*``, ``i18n/<lang>/knobs.json``). ``cabe estimate --explain``
prints :func:`lines`; the page shows the same sentences (:mod:`cabe.web.knobs_view`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.i18n import fill, t
from cabe.knob_effects import NEGLIGIBLE
from cabe.units import fmt_bytes


def _value(v: Any, lang: str) -> str:
    if isinstance(v, bool):
        return t("knob.on" if v else "knob.off", lang)
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v) or t("knob.none", lang)
    return t("knob.none", lang) if v is None else str(v)


def _signed(nbytes: int, lang: str, units: str) -> str:
    return ("+" if nbytes > 0 else "−") + fmt_bytes(abs(nbytes), lang, units, both=False)


def knob_line(k: Mapping[str, Any], lang: str, units: str = "GB") -> str:
    """One knob's sentence: what it is set to, its effect in bytes, and the two peaks."""
    params = {
        "field": k["field"],
        "value": _value(k["value"], lang),
        "without": _value(k["without"], lang),
        "amount": fmt_bytes(abs(k["delta_bytes"]), lang, units, both=False),
        "with": fmt_bytes(k["with_bytes"], lang, units, both=False),
        "before": fmt_bytes(k["without_bytes"], lang, units, both=False),
    }
    key = "knob.effect." + k["effect"] + ("_saver" if k["effect"] == "costs" and k.get("saver", True) else "")
    return fill(t(key, lang), params, lang)


def components_line(k: Mapping[str, Any], lang: str, units: str = "GB") -> str:
    """Which components grew and fell (the largest changes first, at most four)."""
    parts = [
        f"{t('component.' + name, lang)} {_signed(d, lang, units)}"
        for name, d in list(k["components"].items())[:4]
        if abs(d) >= NEGLIGIBLE * max(k["with_bytes"], 1)
    ]
    return t("knob.components", lang, list="; ".join(parts)) if parts else ""


def reason_lines(k: Mapping[str, Any], lang: str, units: str = "GB") -> list[str]:
    """How the components grew, in the report's own figures (``knob.step.<key>``)."""
    out = []
    for r in k.get("reasons", []):
        p = dict(r["params"])
        params = {
            **p,
            "bytes": fmt_bytes(r["with_bytes"], lang, units, both=False),
            "before": fmt_bytes(r["without_bytes"], lang, units, both=False),
        }
        text = fill(t("knob.step." + r["key"], lang), params, lang)
        if r["key"] == "weight_copies" and p.get("experts"):
            text += " " + fill(
                t("knob.step.weight_copies.experts", lang),
                {"experts": fmt_bytes(int(p["experts"]), lang, units, both=False)},
                lang,
            )
        out.append(text)
    return out


def lines(knobs: list[Mapping[str, Any]], lang: str, units: str = "GB") -> list[str]:
    """The section ``--explain`` prints: a title, then each knob, its components and how they grew."""
    if not knobs:
        return []
    out = [t("knob.title", lang) + ":"]
    for k in knobs:
        out.append("· " + knob_line(k, lang, units))
        comp = components_line(k, lang, units)
        if comp:
            out.append("    " + comp)
        out += ["    " + r for r in reason_lines(k, lang, units)]
    return out
