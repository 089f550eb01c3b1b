"""The HTML page: the seed calculator (M = N·B, V = M + A) beside the full planner.

Everything is rendered on the server from the query string, so the page works with a plain
form GET when JavaScript is off and a copied address reproduces the calculation. The script
(static/app.js) only re-renders the same panels in place (via /fragment, the same templates).

The markup lives in Jinja2 templates (``templates/*.html``, autoescaped); this module prepares what
they show. The planner's fields, their widgets, choices and defaults come from :mod:`cabe.schema`
(the defaults that depend on another field through :func:`cabe.schema.resolve_defaults`, which is
also what the script reads, as data, when the method changes).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any
from urllib.parse import urlencode

from cabe import api, i18n, models, schema
from cabe import gpus as gpu_catalog
from cabe.errors import CabeError
from cabe.inference import infer_json
from cabe.solver import plan_json
from cabe.units import GB, GiB
from cabe.web import charts, fit_view, modes

# ------------------------------------------------------------------------------ form fields

#: the seed calculator's example (its fields are the page's own: n = params, b = bytes per parameter)
SEED_DEFAULTS = {"n": "7", "b": "16", "bc": "", "a": "0"}
SEED_PRESETS = ("16", "12", "8")
#: what a first visit shows; every other field of the planner starts at the schema's default
EXAMPLE = {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090"}
#: the planner's fieldsets of schema fields (legend key, field names); model and card have their own
FIELDSETS = (
    (
        "web.plan.group_training",
        ("method", "dtype", "autocast", "optimizer", "batch", "seq", "grad_accum", "checkpointing", "attention"),
    ),
    ("web.plan.group_lora", ("lora_rank", "lora_alpha", "lora_targets", "quant", "double_quant")),
    # the trainer's recipe and loss kernel, and the memory savers (issue 11)
    # (and the transformers line the run uses: cabe.transformers_line)
    (
        "web.plan.group_recipe",
        ("recipe", "loss", "loss_chunks", "checkpoint_every", "offload_activations", "packing", "transformers"),
    ),
    # images in each sequence, for a vision-language model (issue 13: cabe.vision)
    ("web.plan.group_images", ("images", "image_size")),
    # the objective, and TRL's GRPOTrainer knobs (issue 33: cabe.objectives.grpo)
    (
        "web.plan.group_grpo",
        (
            "objective",
            "num_generations",
            "max_completion_length",
            "prompt_length",
            "beta",
            "use_vllm",
            "vllm_mode",
            "vllm_gpu_memory_utilization",
            "vllm_enable_sleep_mode",
        ),
    ),
)
PLAN_FIELDS = ("model",) + tuple(n for _, names in FIELDSETS for n in names) + ("gpu",)
UNITS = schema.field("units", "api.estimate")
SEQ_SWEEP = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCH_SWEEP = (1, 2, 4, 8, 16, 32, 64)
#: Keys the page understands in its query string (anything else is ignored).
#: every schema field of the form: the planner's and those of the other questions (cabe.web.modes)
FORM_FIELDS = PLAN_FIELDS + modes.EXTRA_KEYS
QUERY_KEYS = tuple(SEED_DEFAULTS) + FORM_FIELDS + ("lang", "units", "view")
_ON = ("1", "on", "true")


def _field(name: str) -> schema.Field:
    """The schema field behind a form key (a serving field's key may carry ``i_``: cabe.web.modes)."""
    return modes.field_of(name)[0]


def _has(key: str, lang: str) -> bool:
    return key in i18n.catalog(lang) or key in i18n.catalog(i18n.DEFAULT_LANG)


def _num_text(text: str) -> str:
    """Accept both decimal marks: '7,5' and '7.5'."""
    s = text.strip().replace(" ", "")
    if s.count(",") == 1 and "." not in s:
        s = s.replace(",", ".")
    return s


def form_text(f: schema.Field, value: Any) -> str:
    """A schema value as the form shows it (a check box or yes/no: "1" / "" or "0"; 16.0: "16")."""
    if f.type is bool:
        return "1" if value else ("0" if f.default else "")
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def state(q: Mapping[str, str]) -> dict[str, str]:
    """The full form state: the query string over the page's example and the schema's defaults
    (:func:`cabe.schema.resolve_defaults`: the precision follows the method). A missing check box is
    off once the form was submitted."""
    out = {k: str(q.get(k, SEED_DEFAULTS[k])) for k in SEED_DEFAULTS}
    given = {k: str(q[k]) for k in FORM_FIELDS if k in q}
    if "model" in q or "method" in q:  # a submitted form: its unchecked boxes are off
        for k in FORM_FIELDS:
            f = _field(k)
            if f.type is bool and not f.default and k not in q:
                given[k] = ""
    training = {k: v for k, v in given.items() if k in PLAN_FIELDS or k in modes.SHARDING + modes.PARALLEL}
    resolved = {**EXAMPLE, **schema.resolve_defaults({**EXAMPLE, **training})}
    for k in FORM_FIELDS:
        default = resolved[k] if k in resolved else _field(k).default
        out[k] = given[k] if k in given else form_text(_field(k), default)
    out["view"] = modes.view_of(q)
    units = q.get("units", UNITS.default)
    out["units"] = units if units in (UNITS.choices or ()) else str(UNITS.default)
    return out


def dependent_defaults() -> dict[str, dict[str, Any]]:
    """For the script: each form field whose default depends on another, and that default for each
    value of the other (from :func:`cabe.schema.resolve_defaults`)."""
    out: dict[str, dict[str, Any]] = {}
    for name in PLAN_FIELDS:
        f = _field(name)
        for on in f.depends_on:
            # a field with no default (the recipe) also has the form's empty choice: none given
            choices = (("",) if _field(on).default is None else ()) + tuple(_field(on).allowed() or ())
            values = {v: form_text(f, schema.resolve_defaults({on: v})[name]) for v in choices}
            out[name] = {"depends_on": on, "values": values}
    return out


def seed_request(s: Mapping[str, str]) -> dict[str, Any] | None:
    n, a = _num_text(s["n"]), _num_text(s["a"])
    b = s["b"] if s["b"] in SEED_PRESETS else _num_text(s["bc"])
    if not n or not b:
        return None
    return {"params": n, "bytes_per_param": b, "activations_gb": a or "0"}


def _request_value(f: schema.Field, text: str) -> Any:
    """The form's text as the request's value (bad text goes as is: the core names the error)."""
    if f.type is bool:
        return text in _ON
    v = text.strip()
    if f.type is int:
        return int(v) if v.lstrip("-").isdigit() and len(v) < 30 else v
    if f.type is float:
        return _num_text(v)
    return text if f.type is tuple else v


def plan_request(s: Mapping[str, str], config: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for k in PLAN_FIELDS:
        f = _field(k)
        text = s.get(k, "")
        if f.type is bool or text.strip():
            body[k] = _request_value(f, text)
    body.update(modes.extra_request(s, s.get("view", modes.DEFAULT_VIEW), _request_value))
    if config is not None:
        body.pop("model", None)
        body["config"] = config
    # the form holds every field; those the chosen method does not use are not sent (the API would
    # refuse them: schema.inapplicable)
    return {k: v for k, v in body.items() if k not in PLAN_FIELDS or schema.applies(k, body)}


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
            text = i18n.t(k, lang)
            break
    return text[:1].upper() + text[1:]


def step_label(key: str, params: Mapping[str, Any], lang: str) -> str:
    k = "step." + key
    if _has(k, lang):
        try:
            return i18n.t(k, lang, **params)
        except Exception:  # a catalog entry that does not fit its params: show the key
            return key
    return key


# ------------------------------------------------------------------------------ templates


@cache
def environment() -> Any:
    """The Jinja2 environment of ``cabe/web/templates`` (autoescaped: every value is text unless
    marked as markup, as the SVG charts are)."""
    from jinja2 import Environment, PackageLoader, StrictUndefined

    return Environment(
        loader=PackageLoader("cabe.web", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _render(template: str, lang: str, **context: Any) -> str:
    def t(key: str, **params: Any) -> str:
        return i18n.t(key, lang, **params)

    return str(environment().get_template(template).render(lang=lang, t=t, **context))


def _markup(html: str) -> Any:
    from markupsafe import Markup

    return Markup(html)  # the charts and the panels escape their own text


def _error(err: CabeError, lang: str) -> dict[str, Any]:
    return err.to_dict(lang)


# ------------------------------------------------------------------------------ seed panel


def render_seed_results(s: Mapping[str, str], lang: str) -> str:
    return _render("seed_results.html", lang, **_seed_view(s, lang))


def _seed_view(s: Mapping[str, str], lang: str) -> dict[str, Any]:
    req = seed_request(s)
    if req is None:
        return {"error": None, "out": None}
    try:
        out = api.estimate_json(req, fits=False)
    except CabeError as err:
        return {"error": _error(err, lang), "out": None}
    steps = {st["key"]: st for st in out["steps"]}
    rows = [
        (label, out_id, i18n.fill(steps[key]["formula"], steps[key]["params"], lang))
        for key, out_id, label in (
            ("simple.model_states", "seed-m", "web.seed.model_states"),
            ("simple.total", "seed-v", "web.seed.total"),
        )
        if key in steps
    ]
    return {
        "error": None,
        "out": out,
        "gb": i18n.fmt_number(out["total_gb"], lang, 2),
        "gib": i18n.fmt_number(out["total_gib"], lang, 2),
        "rows": rows,
    }


# ------------------------------------------------------------------------------ planner form


def _choice_labels(f: schema.Field, lang: str) -> list[tuple[str, str]]:
    prefix = "web." + f.name
    # a field with no default (recipe, loss) starts with the empty choice: not given (``web.<name>.none``)
    empty = [("", i18n.t(f"{prefix}.none", lang))] if f.default is None and _has(f"{prefix}.none", lang) else []
    return empty + [(v, i18n.t(f"{prefix}.{v}", lang) if _has(f"{prefix}.{v}", lang) else v) for v in f.allowed() or ()]


def widget(name: str, lang: str) -> dict[str, Any]:
    """How the form shows a schema field: a select of its choices, a check box (a flag that is off
    by default: an unchecked box is not sent), a yes/no select (a flag that is on by default), or
    a text box (numeric, decimal or free text)."""
    f = _field(name)
    hint = f"web.plan.{name}_hint"
    out: dict[str, Any] = {"name": name, "label": f"web.plan.{name}", "hint": hint if _has(hint, lang) else None}
    if f.type is bool and not f.default:
        return {**out, "kind": "checkbox"}
    if f.type is bool:
        return {**out, "kind": "select", "choices": [("1", i18n.t("web.yes", lang)), ("0", i18n.t("web.no", lang))]}
    if f.allowed() is not None and f.type is not tuple:  # a list of choices (solve) is typed as a comma list
        return {**out, "kind": "select", "choices": _choice_labels(f, lang)}
    mode = {int: "numeric", float: "decimal"}.get(f.type, "text")
    return {**out, "kind": "input", "mode": mode}


def _plan_form(lang: str) -> dict[str, Any]:
    return {
        "views": modes.VIEWS,
        # the questions' own fieldsets first (several GPUs, serving), then the training setup
        "fieldsets": [
            (legend, [{**widget(n, lang), "engine": modes.ENGINE_KNOBS.get(n)} for n in keys], views)
            for legend, keys, views in modes.FIELDSETS
        ]
        + [(legend, [widget(n, lang) for n in names], modes.TRAINING_VIEWS) for legend, names in FIELDSETS],
        "models": [(n, str(models.preset(n).meta.get("display", n))) for n in models.preset_names()],
        "gpu": {
            **widget("gpu", lang),
            "kind": "select",
            "choices": [
                (g.name, f"{g.display} · {i18n.fmt_number(g.memory_gb_nominal or g.memory_bytes / GB, lang, 0)} GB")
                for g in gpu_catalog.all_gpus()
            ],
        },
        "units": list(UNITS.choices or ()),
    }


# ------------------------------------------------------------------------------ planner results


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


def _verdict(fit: Mapping[str, Any] | None, u: Units) -> dict[str, Any] | None:
    if not fit:
        return None
    ok = bool(fit["fits"])
    return {
        "fits": ok,
        "key": "web.res.fits" if ok else "web.res.not_fits",
        "margin_key": "web.res.margin" if ok else "web.res.short",
        "display": fit["display"],
        "margin": u.of(abs(fit["margin_bytes"])),
        "need": u.of(fit["needed_bytes"]),
        "have": u.of(fit["memory_bytes"]),
        "warning": fit.get("warning"),
    }


def _components(out: Mapping[str, Any], fit: Mapping[str, Any] | None, lang: str) -> list[tuple[str, str, float]]:
    """The stacked bar: the components, the allocator slack, the CUDA context of the chosen card
    (each as key, label, bytes: the key picks its colour, charts.COMPONENT_COLOURS)."""
    comps = [(k, component_label(k, lang), v) for k, v in out["components"].items() if v > 0]
    if out["allocator_slack_bytes"]:
        comps.append(("allocator_slack", i18n.t("web.component.allocator_slack", lang), out["allocator_slack_bytes"]))
    ctx = fit["needed_bytes"] - out["reserved_bytes"] if fit else out["cuda_context_bytes"]
    if ctx:
        comps.append(("cuda_context", i18n.t("web.component.cuda_context", lang), ctx))
    return comps


def _markers(card: Any, u: Units) -> list[tuple[str, float, bool]]:
    """The chosen card, then the next cards up, each clearly bigger than the last."""
    if card is None:
        return []
    markers = [(card.display, card.memory_bytes / u.div, True)]
    last = card.memory_bytes
    for g in gpu_catalog.all_gpus():
        if g.memory_bytes > last * 1.08 and len(markers) < 4:
            last = g.memory_bytes
            markers.append((g.display, g.memory_bytes / u.div, False))
    return markers


def _bar(out: Mapping[str, Any], fit: Any, card: Any, u: Units, lang: str) -> dict[str, Any]:
    comps = _components(out, fit, lang)
    title = i18n.t("web.chart.bar_title", lang, gpu=card.display if card else "")
    whole = max(sum(x for _, _, x in comps), 1)
    svg = charts.stacked_bar(
        [(lbl, v / u.div, charts.colour_index(k)) for k, lbl, v in comps],
        _markers(card, u),
        title=title,
        unit=u.name,
        fmt=u.num,
    )
    rows = [
        (f"c{charts.colour_index(k)}", lbl, u.of(v), i18n.fmt_number(100 * v / whole, lang, 1)) for k, lbl, v in comps
    ]
    return {"svg": _markup(svg), "rows": rows}


def _steps(out: Mapping[str, Any], u: Units, lang: str) -> list[tuple[str, str, str]]:
    rows = []
    for st in out["steps"]:
        params = {k: v for k, v in st["params"].items() if isinstance(v, (int, float, str))}
        val = u.label(st["bytes"]) if st.get("bytes") else ""
        rows.append((step_label(st["key"], params, lang), i18n.fill(st["formula"], params, lang), val))
    return rows


def _notes(out: Mapping[str, Any], lang: str) -> list[str]:
    # the placeholders some notes fill, as the text report fills them (cabe.report.text.format_report)
    facts = {
        "model_type": (out.get("model") or {}).get("model_type", ""),
        **(out.get("setup") or {}),
        "lora_unmatched": out.get("lora_unmatched", ""),
    }
    return [i18n.t("note." + n, lang, **facts) if _has("note." + n, lang) else n for n in out.get("notes", [])]


def _fits_on(out: Mapping[str, Any], u: Units) -> list[tuple[str, str, str]]:
    cards = [gpu_catalog.gpu(n) for n in out.get("fits_on", [])]
    return [(n, g.display, u.label(g.memory_bytes)) for n, g in zip(out.get("fits_on", []), cards)]


def _curves(body: Mapping[str, Any], out: Mapping[str, Any], fit: Any, card: Any, u: Units, lang: str) -> Any:
    """Memory against the sequence length and the micro-batch, with the card's limit (architecture only)."""
    if out["mode"] != "architecture":
        return None
    limit = fit["usable_bytes"] / u.div if fit else None
    cap = max(2.5 * fit["usable_bytes"] if fit else 0, 1.6 * out["reserved_bytes"])
    charts_html = []
    for key, grid, title, x_label in (
        ("seq", SEQ_SWEEP, "web.chart.vs_seq", "web.chart.seq"),
        ("batch", BATCH_SWEEP, "web.chart.vs_batch", "web.chart.batch"),
    ):
        pts = _clip(_sweep(body, key, _sweep_values(body.get(key), grid)), cap)
        charts_html.append(
            charts.line_chart(
                [(x, y / u.div) for x, y in pts],
                limit,
                title=i18n.t(title, lang),
                x_label=i18n.t(x_label, lang),
                y_label=u.name,
                limit_label=i18n.t("web.chart.limit", lang, gpu=card.display if card else ""),
                fmt=u.num,
                fmt_x=lambda x: _short(int(x), lang),
                chart_id=key,
            )
        )
    return _markup("".join(charts_html))


def _plan_view(s: Mapping[str, str], lang: str, config: Any) -> dict[str, Any]:
    u = Units(s.get("units", "GB"), lang)
    body = plan_request(s, config)
    try:
        out = api.estimate_json(body)
    except CabeError as err:
        return {"error": _error(err, lang)}
    fit = out.get("gpu")
    card = gpu_catalog.gpu(fit["gpu"]) if fit else None
    model = out.get("model") or {}
    return {
        "error": None,
        "out": out,
        "units": u.name,
        "total": u.label(out["total_bytes"]),
        "model_name": model.get("display") or model.get("name") or "",
        "verdict": _verdict(fit, u),
        "bar": _bar(out, fit, card, u, lang),
        "steps": _steps(out, u, lang),
        "notes": _notes(out, lang),
        "fits_on": _fits_on(out, u),
        "curves": _curves(body, out, fit, card, u, lang),
    }


def _serve(s: Mapping[str, str], lang: str, config: Any) -> dict[str, Any]:
    """The serve view: /api/infer for the form's model, card, parallel and serving fields."""
    u = Units(s.get("units", "GB"), lang)
    body = modes.serve_request(s, _request_value)
    if config is not None:
        body.pop("model", None)
        body["config"] = config
    try:
        api.check_fields(body, "api.infer")
        out = infer_json(body)
    except CabeError as err:
        return {"error": _error(err, lang)}
    view = modes.serve_view(out, u, lang)
    return {
        "error": None,
        "out": out,
        "units": u.name,
        "total": u.label(view["headline"]),
        "verdict": _verdict(view["fit"], u),
        "colour": charts.colour_index,
        **view,
    }


def _fit(s: Mapping[str, str], lang: str, config: Any) -> dict[str, Any]:
    """Make it fit: the solver (cabe.solver.plan_json, as /api/fit) on the form's training request."""
    u = Units(s.get("units", "GB"), lang)
    body = plan_request(s, config)
    try:
        api.check_fields(body, "api.fit")
        out = plan_json(body, allow_files=False)
    except CabeError as err:
        return {"error": _error(err, lang)}
    view = fit_view.fit_view(out, u.label, u.of, lang, lambda **ch: _link(s, lang=lang, **ch))
    return {
        "error": None,
        "out": out,
        "units": u.name,
        "total": u.label(out["now"]["needed_bytes"]),
        "verdict": _verdict(view["fit"], u),
        **view,
    }


def render_plan_results(s: Mapping[str, str], lang: str, config: Any = None) -> str:
    if s.get("view") == "fit":
        return _render("fit_results.html", lang, **_fit(s, lang, config))
    if s.get("view") == "serve":
        return _render("serve_results.html", lang, **_serve(s, lang, config))
    return _render("plan_results.html", lang, **_plan_view(s, lang, config))


# ------------------------------------------------------------------------------ the page


def _link(s: Mapping[str, str], **changes: str) -> str:
    q = {k: v for k, v in s.items() if k in QUERY_KEYS}
    q.update(changes)
    return "?" + urlencode(q)


def render_fragments(q: Mapping[str, str], lang: str, config: Any = None) -> dict[str, str]:
    """The two result panels, as the page shows them (what the script swaps in)."""
    s = state(q)
    return {"seed": render_seed_results(s, lang), "plan": render_plan_results(s, lang, config)}


def render_page(q: Mapping[str, str], lang: str) -> str:
    s = state(q)
    other = "en" if lang == "es" else "es"
    return _render(
        "page.html",
        lang,
        s=s,
        other=other,
        t_other=lambda key: i18n.t(key, other),
        switch_href=_link(s, lang=other),
        seed_presets=SEED_PRESETS,
        plan=_plan_form(lang),
        defaults=dependent_defaults(),
        seed_results=_markup(render_seed_results(s, lang)),
        plan_results=_markup(render_plan_results(s, lang)),
    )
