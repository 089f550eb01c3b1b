"""The page's "make it fit" question: the solver's answer (cabe.solver.plan_json, as /api/fit and
``cabe fit --json``) in the CLI's words (the ``plan.*`` catalog entries of cabe.cli.fit), each change a
link that fills the form with what it sets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cabe import schema
from cabe.i18n import fmt_number, t
from cabe.web import modes


def _change_label(r: Mapping[str, Any], lang: str) -> str:
    return t("plan.change." + r["change"], lang, **{k: v for k, v in r["set"].items() if isinstance(v, int)})


def _form_value(name: str, v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else ("0" if schema.field(name).default else "")
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def _apply(r: Mapping[str, Any], link: Callable[..., str]) -> str:
    """The address of the setup with the change made: several GPUs when it sets a parallel field."""
    sets = {k: _form_value(k, v) for k, v in r["set"].items()}
    view = "gpus" if any(k in modes.PARALLEL + modes.SHARDING for k in sets) else "train"
    return link(**sets, view=view)


def fit_view(
    out: Mapping[str, Any], b: Callable[[float], str], num: Callable[[float], str], lang: str, link: Callable[..., str]
) -> dict[str, Any]:
    """What fit_results.html shows: the verdict now, the largest batch / longest sequence / fewest GPUs,
    the single changes by memory saved and the cheapest combination that fits."""
    g, now = out["gpu"], out["now"]
    now_line = t(
        "plan.now",
        lang,
        gpu=g["display"],
        need=b(now["needed_bytes"]),
        have=b(g["memory_bytes"]),
        verdict=t("ui.fits" if now["fits"] else "ui.does_not_fit", lang),
    )
    # the answer block's verdict, as the other questions show it (short enough for a phone's bottom bar)
    fit = {**now, "display": g["display"], "memory_bytes": g["memory_bytes"]}
    lines = [now_line]
    for key in ("batch", "seq"):
        a = out.get(key)
        if a:
            lines.append(
                t(f"plan.{key}_none", lang)
                if a["value"] is None
                else t(f"plan.{key}", lang, value=a["value"], need=b(a["at_value"]["needed_bytes"]))
            )
    a = out.get("gpus")
    if a:
        if a["value"] is None:
            lines.append(t("plan.gpus_none", lang, limit=a["limit"]))
        else:
            shard = a["shard"] + (f" --param-dtype {a['param_dtype']}" if a.get("param_dtype") else "")
            need = b(a["at_value"]["needed_bytes"])
            lines.append(t("plan.gpus", lang, value=a["value"], shard=shard, need=need))

    def x(f: float) -> str:
        return "×" + fmt_number(f, lang, 2)

    c = out.get("changes") or {}
    changes = [
        {
            "label": _change_label(r, lang),
            "need": num(r["needed_bytes"]),
            "saved": num(r["saved_bytes"]),
            "time": x(r["slowdown"]),
            "gpu_hours": x(r["gpu_hours_factor"]),
            "fits": r["fits"],
            "href": _apply(r, link),
        }
        for r in c.get("by_memory", ())
    ]
    p = c.get("plan") or {}
    steps = [(_change_label(s, lang), b(s["needed_bytes"])) for s in p.get("steps", ())] if p.get("fits") else []
    header = (
        t(
            "plan.plan_header",
            lang,
            slowdown=fmt_number(p["slowdown"], lang, 2),
            gpu_hours=fmt_number(p["gpu_hours_factor"], lang, 2),
        )
        if steps
        else (t("plan.plan_none", lang) if c and not c.get("fits_now") else "")
    )
    return {"fit": fit, "lines": lines, "changes": changes, "plan_header": header, "plan_steps": steps}
