"""The HTML page: the seed calculator (M = N·B, V = M + A) beside the full planner.

Everything is rendered on the server from the query string, so the page works with a plain
form GET when JavaScript is off and a copied address reproduces the calculation. The script
(static/app.js) only re-renders the same panels in place (via /api/estimate and /fragment).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import urlencode

from cabe import api, i18n, models, training
from cabe import gpus as gpu_catalog
from cabe.errors import CabeError
from cabe.report import GB, GiB
from cabe.web import charts

# ------------------------------------------------------------------------------ form fields

SEED_DEFAULTS = {"n": "7", "b": "16", "bc": "", "a": "0"}
PLAN_DEFAULTS = {
    "model": "llama-3.1-8b",
    "method": "lora",
    "precision": "bf16",
    "optimizer": "adamw",
    "batch": "1",
    "seq": "2048",
    "grad_accum": "1",
    "checkpointing": "",
    "attention": "sdpa",
    "lora_rank": "8",
    "lora_alpha": "16",
    "lora_targets": "",
    "quant": "nf4",
    "double_quant": "1",
    "gpu": "rtx-4090",
}
INT_FIELDS = ("batch", "seq", "grad_accum", "lora_rank")
SEED_PRESETS = ("16", "12", "8")
SEQ_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCH_SWEEP = (1, 2, 4, 8, 16, 32, 64)
#: Keys the page understands in its query string (anything else is ignored).
QUERY_KEYS = tuple(SEED_DEFAULTS) + tuple(PLAN_DEFAULTS) + ("lang", "units")


def _t(key: str, lang: str, **params: Any) -> str:
    return i18n.t(key, lang, **params)


def _e(key: str, lang: str, **params: Any) -> str:
    return escape(i18n.t(key, lang, **params))


def _has(key: str, lang: str) -> bool:
    return key in i18n.catalog(lang) or key in i18n.catalog(i18n.DEFAULT_LANG)


def _num_text(text: str) -> str:
    """Accept both decimal marks: '7,5' and '7.5'."""
    s = text.strip().replace(" ", "")
    if s.count(",") == 1 and "." not in s:
        s = s.replace(",", ".")
    return s


def _value(q: Mapping[str, str], key: str, defaults: Mapping[str, str]) -> str:
    v = q.get(key)
    return defaults[key] if v is None else str(v)


def state(q: Mapping[str, str]) -> dict[str, str]:
    """The full form state: the query string over the defaults (a missing checkbox = off once the
    form was submitted, which the hidden ``_`` marker tells)."""
    out = {k: _value(q, k, SEED_DEFAULTS) for k in SEED_DEFAULTS}
    submitted = "model" in q or "method" in q
    for k in PLAN_DEFAULTS:
        if k == "checkpointing" and submitted:
            out[k] = q.get(k, "")
        else:
            out[k] = _value(q, k, PLAN_DEFAULTS)
    units = q.get("units", "GB")
    out["units"] = units if units in ("GB", "GiB") else "GB"
    return out


def seed_request(s: Mapping[str, str]) -> dict[str, Any] | None:
    n, a = _num_text(s["n"]), _num_text(s["a"])
    b = s["b"] if s["b"] in SEED_PRESETS else _num_text(s["bc"])
    if not n or not b:
        return None
    return {"params": n, "bytes_per_param": b, "activations_gb": a or "0"}


def plan_request(s: Mapping[str, str], config: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for k in ("model", "method", "precision", "optimizer", "attention", "quant", "gpu"):
        if s.get(k):
            body[k] = s[k].strip()
    for k in INT_FIELDS:
        v = s.get(k, "").strip()
        if v:
            body[k] = int(v) if v.lstrip("-").isdigit() and len(v) < 30 else v
    alpha = _num_text(s.get("lora_alpha", ""))
    if alpha:
        body["lora_alpha"] = alpha
    if s.get("lora_targets", "").strip():
        body["lora_targets"] = s["lora_targets"]
    body["checkpointing"] = s.get("checkpointing") in ("1", "on", "true")
    body["double_quant"] = s.get("double_quant") in ("1", "on", "true")
    if config is not None:
        body.pop("model", None)
        body["config"] = config
    return body


# ------------------------------------------------------------------------------ formatting


class Units:
    def __init__(self, name: str, lang: str) -> None:
        self.name = name if name in ("GB", "GiB") else "GB"
        self.div = GB if self.name == "GB" else GiB
        self.lang = lang

    def num(self, x: float) -> str:
        return i18n.fmt_number(float(x), self.lang, 1 if abs(x) >= 100 else 2)

    def of(self, nbytes: float) -> str:
        return self.num(nbytes / self.div)

    def label(self, nbytes: float) -> str:
        return f"{self.of(nbytes)} {self.name}"


def component_label(key: str, lang: str) -> str:
    text = key.replace("_", " ")
    for k in ("component." + key, "web.component." + key):
        if _has(k, lang):
            text = _t(k, lang)
            break
    return text[:1].upper() + text[1:]


def step_label(key: str, params: Mapping[str, Any], lang: str) -> str:
    k = "step." + key
    if _has(k, lang):
        try:
            return _t(k, lang, **params)
        except Exception:  # a catalog entry that does not fit its params: show the key
            return key
    return key


def _error_html(err: CabeError, lang: str) -> str:
    d = err.to_dict(lang)
    field = f' data-field="{escape(str(d["field"]))}"' if d.get("field") else ""
    return f'<p class="error" role="alert"{field}>{escape(d["message"])}</p>'


# ------------------------------------------------------------------------------ seed panel


def render_seed_results(s: Mapping[str, str], lang: str) -> str:
    req = seed_request(s)
    if req is None:
        return f'<p class="empty">{_e("web.seed.empty", lang)}</p>'
    try:
        out = api.estimate_json(req, fits=False)
    except CabeError as err:
        return _error_html(err, lang)
    steps = {st["key"]: st for st in out["steps"]}
    m = steps.get("simple.model_states")
    v = steps.get("simple.total")
    gib = i18n.fmt_number(out["total_gib"], lang, 2)
    rows = []
    if m:
        rows.append(
            f'<div class="kv"><span>{_e("web.seed.model_states", lang)}</span>'
            f'<output id="seed-m" class="formula">{escape(i18n.fill(m["formula"], m["params"], lang))}</output></div>'
        )
    if v:
        rows.append(
            f'<div class="kv"><span>{_e("web.seed.total", lang)}</span>'
            f'<output id="seed-v" class="formula">{escape(i18n.fill(v["formula"], v["params"], lang))}</output></div>'
        )
    gb = i18n.fmt_number(out["total_gb"], lang, 2)
    return (
        f'<p class="big"><output id="seed-total" data-gb="{out["total_gb"]}">{gb} GB</output>'
        f' <span class="muted">(<output id="seed-total-gib">{gib} GiB</output>)</span></p>' + "".join(rows)
    )


def _details_html(lang: str) -> str:
    p = lambda k: f"<p>{_e(k, lang)}</p>"  # noqa: E731
    f = lambda text: f'<p class="math">{escape(text)}</p>'  # noqa: E731
    faq = "".join(
        f"<details><summary>{_e(f'web.faq.q{i}', lang)}</summary>{p(f'web.faq.a{i}a')}{p(f'web.faq.a{i}b')}</details>"
        for i in (1, 2, 3)
    )
    return (
        f'<section class="details" aria-labelledby="details-h"><h2 id="details-h">{_e("web.details.title", lang)}</h2>'
        f"<h3>{_e('web.details.h1', lang)}</h3>{p('web.details.p1')}"
        f"<h3>{_e('web.details.h2', lang)}</h3>{p('web.details.p2')}{f('M = N · B  GB')}{p('web.details.p3')}"
        f"<h3>{_e('web.details.h3', lang)}</h3>{p('web.details.p4')}{f('V = M + A')}{p('web.details.p5')}"
        f"<h3>{_e('web.details.h4', lang)}</h3>{p('web.details.p6')}"
        f"{f('M = 7 × 16 = 112 GB')}{f('V = 112 + 0 = 112 GB')}{p('web.details.p7')}"
        f"<h3>{_e('web.details.h5', lang)}</h3>{p('web.details.p8')}"
        f"</section>"
        f'<section class="faq" aria-labelledby="faq-h"><h2 id="faq-h">{_e("web.faq.title", lang)}</h2>{faq}</section>'
        f'<section class="disclaimer" aria-labelledby="disc-h"><h2 id="disc-h">{_e("web.disclaimer.title", lang)}</h2>'
        f"{p('web.disclaimer.text')}</section>"
    )


def _seed_form(s: Mapping[str, str], lang: str) -> str:
    opts = "".join(
        f'<option value="{b}"{" selected" if s["b"] == b else ""}>{_e("web.seed.bpp" + b, lang)}</option>'
        for b in SEED_PRESETS
    )
    custom_sel = " selected" if s["b"] not in SEED_PRESETS else ""
    opts += f'<option value="custom"{custom_sel}>{_e("web.seed.bpp_custom", lang)}</option>'
    return f"""
<fieldset><legend>{_e("web.seed.group_model", lang)}</legend>
  <label for="n">{_e("web.seed.params", lang)} <span class="unit">({_e("web.seed.params_unit", lang)})</span></label>
  <input id="n" name="n" type="text" inputmode="decimal" autocomplete="off" value="{escape(s["n"])}">
  <label for="b">{_e("web.seed.bpp", lang)}</label>
  <select id="b" name="b">{opts}</select>
  <label for="bc">{_e("web.seed.bpp_custom_value", lang)}</label>
  <input id="bc" name="bc" type="text" inputmode="decimal" autocomplete="off" value="{escape(s["bc"])}"
    aria-describedby="bc-hint"><small id="bc-hint" class="hint">{_e("web.seed.bpp_custom_hint", lang)}</small>
</fieldset>
<fieldset><legend>{_e("web.seed.group_activations", lang)}</legend>
  <label for="a">{_e("web.seed.activations", lang)} <span class="unit">(GB)</span></label>
  <input id="a" name="a" type="text" inputmode="decimal" autocomplete="off" value="{escape(s["a"])}">
</fieldset>"""


# ------------------------------------------------------------------------------ planner


def _select(name: str, label: str, choices: list[tuple[str, str]], current: str, describedby: str = "") -> str:
    opts = "".join(
        f'<option value="{escape(v)}"{" selected" if v == current else ""}>{escape(t)}</option>' for v, t in choices
    )
    extra = f' aria-describedby="{describedby}"' if describedby else ""
    return f'<label for="{name}">{escape(label)}</label><select id="{name}" name="{name}"{extra}>{opts}</select>'


def _input(name: str, label: str, value: str, *, kind: str = "text", mode: str = "numeric", extra: str = "") -> str:
    return (
        f'<label for="{name}">{escape(label)}</label><input id="{name}" name="{name}" type="{kind}" '
        f'inputmode="{mode}" autocomplete="off" value="{escape(value)}"{extra}>'
    )


def _choice_labels(prefix: str, values: tuple[str, ...], lang: str) -> list[tuple[str, str]]:
    return [(v, _t(f"{prefix}.{v}", lang) if _has(f"{prefix}.{v}", lang) else v) for v in values]


def _plan_form(s: Mapping[str, str], lang: str) -> str:
    model_opts = "".join(
        f'<option value="{escape(n)}">{escape(str(models.preset(n).meta.get("display", n)))}</option>'
        for n in models.preset_names()
    )
    gpu_opts = [
        (g.name, f"{g.display} · {i18n.fmt_number(g.memory_gb_nominal or g.memory_bytes / GB, lang, 0)} GB")
        for g in gpu_catalog.all_gpus()
    ]
    yes_no = [("1", _t("web.yes", lang)), ("0", _t("web.no", lang))]
    ck = " checked" if s.get("checkpointing") in ("1", "on", "true") else ""
    return f"""
<fieldset><legend>{_e("web.plan.group_model", lang)}</legend>
  <label for="model">{_e("web.plan.model", lang)}</label>
  <input id="model" name="model" type="search" list="model-list" autocomplete="off" value="{escape(s["model"])}"
    aria-describedby="model-hint"><datalist id="model-list">{model_opts}</datalist>
  <small id="model-hint" class="hint">{_e("web.plan.model_hint", lang)}</small>
  <label for="config-file">{_e("web.plan.upload", lang)}</label>
  <input id="config-file" type="file" accept=".json,application/json" aria-describedby="upload-hint">
  <small id="upload-hint" class="hint" data-loaded="{_e("web.plan.upload_loaded", lang)}"
    data-bad="{_e("web.plan.upload_bad", lang)}">{_e("web.plan.upload_hint", lang)}</small>
</fieldset>
<fieldset><legend>{_e("web.plan.group_training", lang)}</legend>
  {_select("method", _t("web.plan.method", lang), _choice_labels("web.method", training.METHODS, lang), s["method"])}
  {_select("precision", _t("web.plan.precision", lang), _choice_labels("web.precision", training.PRECISIONS, lang), s["precision"])}
  {_select("optimizer", _t("web.plan.optimizer", lang), _choice_labels("web.optimizer", training.OPTIMIZERS, lang), s["optimizer"])}
  {_input("batch", _t("web.plan.batch", lang), s["batch"])}
  {_input("seq", _t("web.plan.seq", lang), s["seq"])}
  {_input("grad_accum", _t("web.plan.grad_accum", lang), s["grad_accum"])}
  <div class="check"><input id="checkpointing" name="checkpointing" type="checkbox" value="1"{ck}>
  <label for="checkpointing">{_e("web.plan.checkpointing", lang)}</label></div>
  {_select("attention", _t("web.plan.attention", lang), _choice_labels("web.attention", training.ATTENTIONS, lang), s["attention"])}
</fieldset>
<fieldset><legend>{_e("web.plan.group_lora", lang)}</legend>
  {_input("lora_rank", _t("web.plan.lora_rank", lang), s["lora_rank"])}
  {_input("lora_alpha", _t("web.plan.lora_alpha", lang), s["lora_alpha"], mode="decimal")}
  {_input("lora_targets", _t("web.plan.lora_targets", lang), s["lora_targets"], mode="text", extra=' aria-describedby="targets-hint"')}
  <small id="targets-hint" class="hint">{_e("web.plan.lora_targets_hint", lang)}</small>
  {_select("quant", _t("web.plan.quant", lang), [(q, q.upper()) for q in training.QUANTS], s["quant"])}
  {_select("double_quant", _t("web.plan.double_quant", lang), yes_no, s["double_quant"])}
</fieldset>
<fieldset><legend>{_e("web.plan.group_gpu", lang)}</legend>
  {_select("gpu", _t("web.plan.gpu", lang), gpu_opts, s["gpu"])}
</fieldset>"""


def _sweep(body: Mapping[str, Any], key: str, values: tuple[int, ...]) -> list[tuple[float, float]]:
    pts: list[tuple[float, float]] = []
    base = {k: v for k, v in body.items() if k != "gpu"}
    for v in values:
        try:
            rep = api.build({**base, key: v})
        except CabeError:
            continue
        pts.append((float(v), float(rep.reserved_bytes)))
    return pts


def _clip(pts: list[tuple[float, float]], cap: float) -> list[tuple[float, float]]:
    """Keep the curve readable near the card's limit: stop after the first point above ``cap``."""
    out: list[tuple[float, float]] = []
    for p in pts:
        out.append(p)
        if p[1] > cap and len(out) >= 3:
            break
    return out


def _short(x: int, lang: str) -> str:
    """Axis labels: 16384 -> '16k'."""
    if x >= 1024 and x % 1024 == 0:
        return f"{x // 1024}k"
    return i18n.fmt_number(x, lang)


def _sweep_values(current: Any, grid: tuple[int, ...]) -> tuple[int, ...]:
    vals = set(grid)
    if isinstance(current, int) and 0 < current <= max(grid) * 4:
        vals.add(current)
    return tuple(sorted(vals))


def render_plan_results(s: Mapping[str, str], lang: str, config: Any = None) -> str:
    u = Units(s.get("units", "GB"), lang)
    body = plan_request(s, config)
    try:
        out = api.estimate_json(body)
    except CabeError as err:
        return _error_html(err, lang)
    fit = out.get("gpu")
    total = out["reserved_bytes"]
    parts: list[str] = []
    model = out.get("model") or {}
    name = model.get("display") or model.get("name") or ""
    parts.append(
        f'<p class="big"><output id="plan-total" data-bytes="{out["total_bytes"]}">{escape(u.label(out["total_bytes"]))}</output>'
        f' <span class="muted">{_e("web.res.peak_phase", lang, phase=_t("web.phase." + out["peak_phase"], lang))}</span></p>'
    )
    parts.append(
        f'<p class="muted">{_e("web.res.summary", lang, model=name, params=out["parameters"], trainable=out["trainable_parameters"])}</p>'
    )
    card = None
    if fit:
        card = gpu_catalog.gpu(fit["gpu"])
        key = "web.res.fits" if fit["fits"] else "web.res.not_fits"
        margin = abs(fit["margin_bytes"])
        mkey = "web.res.margin" if fit["fits"] else "web.res.short"
        parts.append(
            f'<p id="verdict" class="verdict {"ok" if fit["fits"] else "no"}" data-fits="{str(fit["fits"]).lower()}" '
            f'role="status"><strong>{_e(key, lang, gpu=fit["display"])}</strong> — '
            f"{_e(mkey, lang, amount=u.of(margin), unit=u.name)}</p>"
            f'<p class="muted">{_e("web.res.needed", lang, need=u.of(fit["needed_bytes"]), have=u.of(fit["memory_bytes"]), unit=u.name)}</p>'
        )
        if fit.get("warning"):
            parts.append(f'<p class="warn">{_e("web.warning." + fit["warning"], lang)}</p>')
    # stacked bar: the components, the allocator slack, the CUDA context of the chosen card
    comps = [(component_label(k, lang), v) for k, v in out["components"].items() if v > 0]
    if out["allocator_slack_bytes"]:
        comps.append((_t("web.component.allocator_slack", lang), out["allocator_slack_bytes"]))
    ctx = fit["needed_bytes"] - total if fit else out["cuda_context_bytes"]
    if ctx:
        comps.append((_t("web.component.cuda_context", lang), ctx))
    markers: list[tuple[str, float, bool]] = []
    if card is not None:
        markers.append((card.display, card.memory_bytes / u.div, True))
        last = card.memory_bytes
        for g in gpu_catalog.all_gpus():  # the next cards up, each clearly bigger than the last
            if g.memory_bytes > last * 1.08 and len(markers) < 4:
                last = g.memory_bytes
                markers.append((g.display, g.memory_bytes / u.div, False))
    title = _t("web.chart.bar_title", lang, gpu=card.display if card else "")
    parts.append(f"<h3>{_e('web.res.chart', lang)}</h3>")
    parts.append(
        charts.stacked_bar([(lbl, v / u.div) for lbl, v in comps], markers, title=title, unit=u.name, fmt=u.num)
    )
    # legend + components table
    rows = "".join(
        f'<tr><th scope="row"><span class="swatch c{i % len(charts.PALETTE)}" aria-hidden="true"></span>'
        f'{escape(lbl)}</th><td class="num">{escape(u.of(v))}</td>'
        f'<td class="num">{i18n.fmt_number(100 * v / max(sum(x for _, x in comps), 1), lang, 1)} %</td></tr>'
        for i, (lbl, v) in enumerate(comps)
    )
    parts.append(
        f'<table class="components"><caption>{_e("web.res.components", lang)}</caption>'
        f'<thead><tr><th scope="col">{_e("web.res.col_component", lang)}</th>'
        f'<th scope="col">{escape(u.name)}</th><th scope="col">%</th></tr></thead><tbody>{rows}</tbody></table>'
    )
    # steps
    srows = []
    for st in out["steps"]:
        params = {k: v for k, v in st["params"].items() if isinstance(v, (int, float, str))}
        formula = i18n.fill(st["formula"], params, lang)
        val = u.label(st["bytes"]) if st.get("bytes") else ""
        srows.append(
            f'<tr><th scope="row">{escape(step_label(st["key"], params, lang))}</th>'
            f'<td class="formula">{escape(formula)}</td><td class="num">{escape(val)}</td></tr>'
        )
    parts.append(
        f'<table class="steps"><caption>{_e("web.res.steps", lang)}</caption><thead><tr>'
        f'<th scope="col">{_e("web.res.col_step", lang)}</th><th scope="col">{_e("web.res.col_formula", lang)}</th>'
        f'<th scope="col">{escape(u.name)}</th></tr></thead><tbody>{"".join(srows)}</tbody></table>'
    )
    notes = list(out.get("notes", []))
    if notes:
        items = "".join(f"<li>{escape(_t('note.' + n, lang) if _has('note.' + n, lang) else n)}</li>" for n in notes)
        parts.append(f'<ul class="notes">{items}</ul>')
    # fits on
    fits = out.get("fits_on", [])
    if fits:
        items = "".join(
            f'<li data-gpu="{escape(n)}">{escape(gpu_catalog.gpu(n).display)} '
            f'<span class="muted">({escape(u.label(gpu_catalog.gpu(n).memory_bytes))})</span></li>'
            for n in fits
        )
        parts.append(f'<h3>{_e("web.res.fits_on", lang)}</h3><ul id="fits-on" class="fits-on">{items}</ul>')
    else:
        parts.append(f'<h3>{_e("web.res.fits_on", lang)}</h3><p id="fits-on">{_e("web.res.fits_on_none", lang)}</p>')
    # curves
    if out["mode"] == "architecture":
        limit = fit["usable_bytes"] / u.div if fit else None
        limit_label = _t("web.chart.limit", lang, gpu=card.display if card else "")
        cap = max(2.5 * fit["usable_bytes"] if fit else 0, 1.6 * total)
        seq_pts = _clip(_sweep(body, "seq", _sweep_values(body.get("seq"), SEQ_SWEEP)), cap)
        bat_pts = _clip(_sweep(body, "batch", _sweep_values(body.get("batch"), BATCH_SWEEP)), cap)
        fmt_x = lambda x: _short(int(x), lang)  # noqa: E731
        c1 = charts.line_chart(
            [(x, y / u.div) for x, y in seq_pts],
            limit,
            title=_t("web.chart.vs_seq", lang),
            x_label=_t("web.chart.seq", lang),
            y_label=u.name,
            limit_label=limit_label,
            fmt=u.num,
            fmt_x=fmt_x,
            chart_id="seq",
        )
        c2 = charts.line_chart(
            [(x, y / u.div) for x, y in bat_pts],
            limit,
            title=_t("web.chart.vs_batch", lang),
            x_label=_t("web.chart.batch", lang),
            y_label=u.name,
            limit_label=limit_label,
            fmt=u.num,
            fmt_x=fmt_x,
            chart_id="batch",
        )
        parts.append(
            f'<h3>{_e("web.res.curves", lang)}</h3><p class="muted">{_e("web.res.curves_hint", lang)}</p>'
            f'<div class="curves">{c1}{c2}</div>'
        )
    return "".join(parts)


# ------------------------------------------------------------------------------ the page


def _link(s: Mapping[str, str], **changes: str) -> str:
    q = {k: v for k, v in s.items() if k in QUERY_KEYS}
    q.update(changes)
    return "?" + urlencode(q)


def render_fragments(q: Mapping[str, str], lang: str, config: Any = None) -> dict[str, str]:
    s = state(q)
    return {"seed": render_seed_results(s, lang), "plan": render_plan_results(s, lang, config)}


def render_page(q: Mapping[str, str], lang: str) -> str:
    s = state(q)
    other = "en" if lang == "es" else "es"
    units_opts = "".join(
        f'<option value="{u}"{" selected" if s["units"] == u else ""}>{u}</option>' for u in ("GB", "GiB")
    )
    return f"""<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e("web.title", lang)} — {_e("web.seed.title", lang)}</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/style.css">
<script src="/static/app.js" defer></script>
</head>
<body>
<a class="skip" href="#calc">{_e("web.skip", lang)}</a>
<header>
  <h1>{_e("web.title", lang)}</h1>
  <p class="tagline">{_e("web.tagline", lang)}</p>
  <nav aria-label="{_e("web.lang_nav", lang)}"><a id="lang-switch" hreflang="{other}" lang="{other}"
    href="{escape(_link(s, lang=other))}">{_e("web.switch_lang", other)}</a></nav>
</header>
<main>
<form id="calc" method="get" action="/" novalidate>
<input type="hidden" name="lang" value="{lang}">
<div class="grid">
<section class="card seed" aria-labelledby="seed-h">
  <h2 id="seed-h">{_e("web.seed.title", lang)}</h2>
  <p>{_e("web.seed.intro", lang)}</p>
  <h3>{_e("web.seed.inputs", lang)}</h3>
  {_seed_form(s, lang)}
  <h3 id="seed-results-h">{_e("web.seed.results", lang)}</h3>
  <div id="seed-results" aria-live="polite" aria-labelledby="seed-results-h"
    data-empty="{_e("web.seed.empty", lang)}" data-label-m="{_e("web.seed.model_states", lang)}"
    data-label-v="{_e("web.seed.total", lang)}">{render_seed_results(s, lang)}</div>
  <p><button type="submit" class="secondary">{_e("web.submit", lang)}</button></p>
</section>
<section class="card plan" aria-labelledby="plan-h">
  <h2 id="plan-h">{_e("web.plan.title", lang)}</h2>
  <p>{_e("web.plan.intro", lang)}</p>
  <div class="plan-grid">
  <div class="plan-inputs">
  {_plan_form(s, lang)}
  <label for="units">{_e("web.units", lang)}</label>
  <select id="units" name="units">{units_opts}</select>
  <p><button type="submit">{_e("web.submit", lang)}</button></p>
  </div>
  <div class="plan-results">
  <h3 id="plan-results-h">{_e("web.res.title", lang)}</h3>
  <div id="plan-results" aria-live="polite" aria-labelledby="plan-results-h">{render_plan_results(s, lang)}</div>
  </div>
  </div>
</section>
</div>
</form>
{_details_html(lang)}
</main>
<footer><p>{_e("web.footer", lang)} <a href="/openapi.json">OpenAPI</a></p></footer>
</body>
</html>
"""
