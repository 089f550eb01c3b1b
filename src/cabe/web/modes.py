"""The page's questions (issue 32): train on one card, on several GPUs, serve, make it fit.

One query-string key, ``view``, picks the question; every field stays in the form (and in the
address), and the fields a question does not read are hidden (``data-views`` on each fieldset,
style.css) and not sent. The fields are the schema's (:mod:`cabe.schema`): the several-GPU group of
``api.estimate`` and the serving group of ``api.infer``, with the same defaults. The serving fields
whose names a training field already uses (``batch``, ``images``, ``image_size``: other meanings)
carry the prefix ``i_`` in the form and the address only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import schema
from cabe.engines import KNOBS
from cabe.i18n import fmt_number, t
from cabe.infer_parallel import parallel_lines, speed_lines

VIEWS = ("train", "gpus", "serve", "fit")
DEFAULT_VIEW = VIEWS[0]
#: the views that run the training estimate (the fit view runs the solver on the same request)
TRAINING_VIEWS = ("train", "gpus", "fit")
#: several GPUs: how many and how split (serving reads these too)
PARALLEL = ("gpus", "tp", "pp", "ep")
#: several GPUs: the schema's other fields of its ``gpus`` group, for training
SHARDING = tuple(f.name for f in schema.fields_for("api.estimate") if f.group == "gpus" and f.name not in PARALLEL)
#: the training fields that another command means otherwise: the form names serving's ``i_<name>``
_CLASH = frozenset(schema.names("api.estimate"))
SERVE = tuple(f.name for f in schema.fields_for("api.infer") if f.group == "serving" and f.name not in PARALLEL)
#: the fit view's own fields (the solver's)
FIT = tuple(f.name for f in schema.fields_for("api.fit") if f.group == "fit")


def key(name: str, command: str) -> str:
    """The form's and the address's name of a field of ``command``."""
    return f"i_{name}" if command == "api.infer" and name in _CLASH else name


def field_of(form_key: str) -> tuple[schema.Field, str]:
    """The schema field behind a form key, and its command."""
    if form_key.startswith("i_"):
        return schema.field(form_key[2:], "api.infer"), "api.infer"
    if form_key in SERVE and form_key not in _CLASH:
        return schema.field(form_key, "api.infer"), "api.infer"
    if form_key in FIT:
        return schema.field(form_key, "api.fit"), "api.fit"
    return schema.field(form_key), "api.estimate"


SERVE_KEYS = tuple(key(n, "api.infer") for n in SERVE)
#: the form keys this module adds to the planner's (the page's own fields are page.PLAN_FIELDS)
EXTRA_KEYS = PARALLEL + SHARDING + SERVE_KEYS + FIT
#: the fieldsets of each view: (legend key, form keys, the views that show it)
FIELDSETS = (
    ("web.plan.group_fit", FIT, ("fit",)),
    ("web.plan.group_parallel", PARALLEL, ("gpus", "serve", "fit")),
    ("web.plan.group_sharding", SHARDING, ("gpus", "fit")),
    ("web.plan.group_serve", SERVE_KEYS, ("serve",)),
)
#: the views that show the planner's own fieldsets (page.FIELDSETS: training fields)
PLAN_VIEWS = TRAINING_VIEWS
#: each engine's knobs (cabe.engines.KNOBS): shown and sent with that engine only
ENGINE_KNOBS = {name: owner for owner, names in KNOBS.items() for name in names}


def view_of(q: Mapping[str, str]) -> str:
    v = str(q.get("view", DEFAULT_VIEW))
    return v if v in VIEWS else DEFAULT_VIEW


def extra_request(s: Mapping[str, str], view: str, value: Any) -> dict[str, Any]:
    """What the view adds to the training request (several GPUs, the solver's fields), from the form's
    text (``value(field, text)`` converts it as the planner's fields are)."""
    keys = {"gpus": PARALLEL + SHARDING, "fit": PARALLEL + SHARDING + FIT}.get(view, ())
    return _given(s, keys, value)


def serve_request(s: Mapping[str, str], value: Any) -> dict[str, Any]:
    """The /api/infer request of the serve view: the model, the card, the parallel and serving fields;
    an engine's knobs only with that engine."""
    engine = s.get("engine") or schema.field("engine", "api.infer").default
    keys = tuple(k for k in PARALLEL + SERVE_KEYS if ENGINE_KNOBS.get(k, engine) == engine)
    out = _given(s, keys, value)
    for k in ("model", "gpu"):
        if s.get(k, "").strip():
            out[k] = s[k].strip()
    return {(k[2:] if k.startswith("i_") else k): v for k, v in out.items()}


def _given(s: Mapping[str, str], keys: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        f, _ = field_of(k)
        text = s.get(k, "")
        if f.type is bool or text.strip():
            out[k] = value(f, text)
    return out


def serve_view(out: Mapping[str, Any], u: Any, lang: str) -> dict[str, Any]:
    """What serve_results.html shows of an /api/infer answer. On a tensor- / pipeline-parallel replica:
    the fullest GPU (its components, the communication buffers, ``per_gpu_bytes`` and its fit), as the
    CLI prints it (cabe.infer_parallel.parallel_lines); else the whole model on one GPU. Then the
    engine's concurrency and the speed bounds, in the CLI's words."""
    par = out.get("parallel")
    if par:
        st = par["stages"][par["worst_stage"]]
        comps = {**st["components"], "comm": st["non_torch_bytes"]}
        # the verdict: /api/infer's, the fullest GPU's on a split replica (cabe.inference.infer_json)
        headline, key, fit = par["per_gpu_bytes"], "infer.parallel.total", out.get("fit")
        # the header and the fit sentence (the lines between are the table above)
        lines = [x.strip() for x in parallel_lines(out, lang, u.name) if x.strip() and not x.startswith("  ")]
    else:
        comps, headline, key, fit, lines = out["components"], out["total_bytes"], "infer.total", out.get("fit"), []
    whole = sum(comps.values())
    rows = [
        (name, _cap(t("infer.component." + name, lang)), u.of(v), fmt_number(100 * v / whole if whole else 0, lang, 1))
        for name, v in comps.items()
        if v > 0
    ]
    e = out.get("engine") or {}
    engine = []
    if "max_concurrent_sequences" in e:
        engine.append(
            t(
                "infer.engine.concurrency",
                lang,
                context=e.get("context", out["context"]),
                concurrency=e["max_concurrent_sequences"],
                max_context=e["max_context"],
            ).strip()
        )
    return {
        "headline": headline,
        "total_key": key,
        "fit": fit,
        "rows": rows,
        "parallel": lines,
        "engine": engine,
        "speed": [x.strip() for x in speed_lines(out, lang) if x.strip()],
    }


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]
