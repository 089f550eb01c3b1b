"""The page's "what each setting does to the peak": the sentences ``cabe estimate --explain`` prints
(:mod:`cabe.report.knobs`), one item per memory knob of the request, from its counterfactual estimate
(:mod:`cabe.knob_effects`, the result's ``knobs``). A knob that costs memory instead of saving it is marked so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe.report.knobs import components_line, knob_line, reason_lines


def rows(out: Mapping[str, Any], units: str, lang: str) -> list[dict[str, Any]]:
    """One row per knob of ``out["knobs"]`` (the result of a request with ``explain``): its field, effect, change in
    bytes, and its sentences."""
    return [
        {
            "field": k["field"],
            "effect": k["effect"],
            "delta_bytes": k["delta_bytes"],
            "line": knob_line(k, lang, units),
            "components": components_line(k, lang, units),
            "reasons": reason_lines(k, lang, units),
        }
        for k in out.get("knobs", [])
    ]
