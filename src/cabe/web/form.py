"""The planner's form: which schema fields it shows and where, their widgets, and the form's state.

Every field of ``api.estimate``, ``api.fit`` and ``api.infer`` is on the form (tests/web/test_form_fields.py
fails when one is not): the training fields here (:data:`FIELDSETS`), the several-GPU, serving and solver
fields in :mod:`cabe.web.modes`, the seed calculator's three (``params``, ``bytes_per_param``,
``activations_gb``: :data:`SEED_KEYS`) and ``config`` (the file input). Each fieldset shows its common
fields and keeps the rarely used ones (:data:`MORE`) in a collapsed "More options"; a field the request does
not read is hidden: the other views' fieldsets (``data-views``), a method's own fields with another method
(:attr:`cabe.schema.Field.methods`: ``data-methods``), GaLore's with another optimizer
(:attr:`~cabe.schema.Field.low_rank_only`: ``data-lowrank``), an engine's knobs with another engine, and a field
that acts only beside another one's value (the FSDP knobs without FSDP, ``cp_impl`` without context parallelism:
:func:`not_applying` asks :func:`cabe.schema.inapplicable`; ``data-probe``, refreshed with each answer).
The choices and defaults are the schema's (:func:`cabe.schema.resolve_defaults` for the ones that follow
another field).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cabe import gpus as gpu_catalog
from cabe import i18n, models, schema
from cabe.configs._base import MAX_BYTES
from cabe.errors import CabeError
from cabe.optimizer import ACCEPTED as OPTIMIZERS
from cabe.optimizer import LOW_RANK_NAMES
from cabe.units import GB
from cabe.web import compare, modes

#: the seed calculator's example (its fields are the page's own: n = params, b = bytes per parameter)
SEED_DEFAULTS = {"n": "7", "b": "16", "bc": "", "a": "0"}
SEED_PRESETS = ("16", "12", "8")
#: the schema fields the seed calculator sets, by its form key (``b``: a preset, or ``bc`` its own value)
SEED_KEYS = {"params": "n", "bytes_per_param": "b", "activations_gb": "a"}
#: what a first visit shows; every other field of the planner starts at the schema's default
EXAMPLE = {"model": "llama-3.1-8b", "method": "lora", "seq": 2048, "gpu": "rtx-4090"}
#: the planner's fieldsets of schema fields (legend key, field names); model and card have their own
FIELDSETS = (
    (
        "web.plan.group_training",
        (
            "method",
            "objective",
            "dtype",
            "autocast",
            "optimizer",
            "batch",
            "seq",
            "grad_accum",
            "checkpointing",
            "attention",
            # a method's own (hidden with the others): freeze, prompt tuning
            "trainable_layers",
            "prompt_tokens",
            "trainable_fp32",
            "precision",
            "fp8",
            "optimizer_impl",
            "optimizer_in_backward",
            "galore_rank",
            "galore_targets",
        ),
    ),
    (
        "web.plan.group_lora",
        (
            "lora_rank",
            "lora_alpha",
            "lora_targets",
            "quant",
            "double_quant",
            "dora",
            "lora_dropout",
            "modules_to_save",
            "adapter_dtype",
            "compute_dtype",
            "kbit_prep",
        ),
    ),
    # the trainer's recipe and loss kernel, and the memory savers (issue 11)
    # (and the transformers line the run uses: cabe.transformers_line)
    (
        "web.plan.group_recipe",
        ("recipe", "loss", "loss_chunks", "checkpoint_every", "offload_activations", "packing", "transformers"),
    ),
    # images in each sequence, for a vision-language model (issue 13: cabe.vision)
    ("web.plan.group_images", ("images", "image_size")),
    # TRL's trainers' knobs (issue 33: cabe.objectives.preference, cabe.objectives.grpo), each shown with the
    # objectives that read it (schema.inapplicable); the objective itself is in the training group
    (
        "web.plan.group_trl",
        (
            "prompt_length",
            "ref_model",
            "precompute_ref_log_probs",
            "loss_type",
            "use_weighting",
            "num_generations",
            "max_completion_length",
            "generation_batch_size",
            "steps_per_generation",
            "beta",
            "use_vllm",
            "vllm_mode",
            "vllm_gpu_memory_utilization",
            "vllm_enable_sleep_mode",
        ),
    ),
)
#: the fields each fieldset keeps under "More options" (collapsed): the ones few runs change
MORE = frozenset(
    (
        "precision",
        "fp8",
        "optimizer_impl",
        "optimizer_in_backward",
        "trainable_fp32",
        "dora",
        "lora_dropout",
        "modules_to_save",
        "adapter_dtype",
        "compute_dtype",
        "kbit_prep",
        "double_quant",
        "loss_chunks",
        "checkpoint_every",
        "transformers",
        # GRPO
        "generation_batch_size",
        "steps_per_generation",
        # several GPUs
        "param_dtype",
        "gpus_per_node",
        "loss_parallel",
        "sequence_parallel",
        "cpu_ram_efficient_loading",
        "reshard_after_forward",
        "cp",
        "cp_impl",
        "fsdp_wrap",
        # serving
        "mode",
        "prefill_chunk",
        "group_size",
        "gpu_memory_utilization",
        "i_images",
        "i_image_size",
        "pp_partition",
        "cache",
        "new_tokens",
        # the solver
        "mfu",
        "tokens",
        "price_per_gpu_hour",
    )
)
PLAN_FIELDS = ("model",) + tuple(n for _, names in FIELDSETS for n in names) + ("gpu",)
UNITS = schema.field("units", "api.estimate")
#: every schema field of the form: the planner's and those of the other questions (cabe.web.modes)
FORM_FIELDS = PLAN_FIELDS + modes.EXTRA_KEYS
#: Keys the page understands in its query string (anything else is ignored).
QUERY_KEYS = tuple(SEED_DEFAULTS) + FORM_FIELDS + ("lang", "units", "view") + compare.KEYS
#: the GaLore optimizers (the only ones that read ``galore_rank`` / ``galore_targets``)
LOW_RANK = tuple(sorted(n for n in LOW_RANK_NAMES if n in OPTIMIZERS))
_ON = ("1", "on", "true")


def form_key(name: str, command: str) -> str:
    """The form's key of the schema field ``name`` of ``command`` (the seed calculator's own for
    ``params`` ...; ``config`` is the file input: ``config``)."""
    if name in SEED_KEYS:
        return SEED_KEYS[name]
    if command == "api.infer" and name in ("model", "config", "gpu") + modes.PARALLEL:
        return name  # the serve view reads the training view's model, card and layout
    return modes.key(name, command)


def field_of(name: str) -> schema.Field:
    """The schema field behind a form key (a serving field's key may carry ``i_``: cabe.web.modes)."""
    return modes.field_of(name)[0]


def has(key: str, lang: str) -> bool:
    return key in i18n.catalog(lang) or key in i18n.catalog(i18n.DEFAULT_LANG)


def num_text(text: str) -> str:
    """Accept both decimal marks: '7,5' and '7.5'."""
    s = text.strip().replace(" ", "")
    if s.count(",") == 1 and "." not in s:
        s = s.replace(",", ".")
    return s


def form_text(f: schema.Field, value: Any) -> str:
    """A schema value as the form shows it (a check box or yes/no: "1" / "" or "0"; 16.0: "16")."""
    if f.type is bool:
        return "1" if value else ("0" if f.default else "")
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def _precision_given(given: dict[str, str]) -> dict[str, str]:
    """A form always sends ``dtype`` and ``autocast``: beside a ``precision`` they say it only when they
    differ from both the pair it implies and their defaults (then the conflict is the user's, and said)."""
    prec = given.get("precision", "")
    if prec not in schema.PRECISIONS:
        return given
    out = dict(given)
    for name, implied in zip(("dtype", "autocast"), schema.PRECISIONS[prec], strict=True):
        if out.get(name) in (implied, schema.field(name).default):
            out.pop(name, None)
    return out


def state(q: Mapping[str, str]) -> dict[str, str]:
    """The full form state: the query string over the page's example and the schema's defaults
    (:func:`cabe.schema.resolve_defaults`: the precision follows the method). A missing check box is
    off once the form was submitted."""
    out = {k: str(q.get(k, SEED_DEFAULTS[k])) for k in SEED_DEFAULTS}
    given = {k: str(q[k]) for k in FORM_FIELDS if k in q}
    if "model" in q or "method" in q:  # a submitted form: its unchecked boxes are off
        for k in FORM_FIELDS:
            f = field_of(k)
            if f.type is bool and not f.default and k not in q:
                given[k] = ""
    given = _precision_given(given)
    training = {k: v for k, v in given.items() if k in PLAN_FIELDS or k in modes.SHARDING + modes.PARALLEL}
    try:
        resolved = {**EXAMPLE, **schema.resolve_defaults({**EXAMPLE, **training})}
    except CabeError:  # a precision that contradicts the dtype: the result panel says so
        resolved = {**EXAMPLE, **schema.resolve_defaults({**EXAMPLE, **training, "precision": None})}
    for k in FORM_FIELDS:
        default = resolved[k] if k in resolved else field_of(k).default
        out[k] = given[k] if k in given else form_text(field_of(k), default)
    out.update(view=modes.view_of(q), **compare.slots(q))
    units = q.get("units", UNITS.default)
    out["units"] = units if units in (UNITS.choices or ()) else str(UNITS.default)
    return out


def dependent_defaults() -> dict[str, dict[str, Any]]:
    """For the script: each form field whose default depends on another, and that default for each
    value of the other (from :func:`cabe.schema.resolve_defaults`)."""
    out: dict[str, dict[str, Any]] = {}
    for name in PLAN_FIELDS:
        f = field_of(name)
        for on in f.depends_on:
            # a field with no default (the recipe) also has the form's empty choice: none given
            choices = (("",) if field_of(on).default is None else ()) + tuple(field_of(on).allowed() or ())
            values = {v: form_text(f, schema.resolve_defaults({on: v})[name]) for v in choices}
            out[name] = {"depends_on": on, "values": values}
    return out


def rules() -> dict[str, Any]:
    """For the script, as data: the dtype and autocast each ``precision`` implies (they follow it while
    the user has not chosen them: :data:`cabe.schema.PRECISIONS`), the optimizers that read GaLore's
    fields (``data-lowrank``), and the several-GPU fields' one-GPU defaults."""
    follow = {
        name: {
            "depends_on": "precision",
            "values": {"": str(schema.field(name).default), **{p: pair[i] for p, pair in schema.PRECISIONS.items()}},
        }
        for i, name in enumerate(("dtype", "autocast"))
    }
    # the several-GPU fields at their defaults (one GPU): files that set one open the several-GPU question
    one_gpu = {n: schema.field(n).default for n in ("gpus", "tp", "pp", "cp", "shard", "offload")}
    return {"follow": follow, "low_rank": list(LOW_RANK), "one_gpu": one_gpu}


def request_value(f: schema.Field, text: str) -> Any:
    """The form's text as the request's value (bad text goes as is: the core names the error)."""
    if f.type is bool:
        return text in _ON
    v = text.strip()
    if f.type is int:
        # ASCII digits only: "²".isdigit() is True and int("²") raises (found by tests/web/test_compare.py's fuzz)
        return int(v) if v.isascii() and v.lstrip("-").isdigit() and len(v) < 30 else v
    if f.type is float:
        return num_text(v)
    return text if f.type is tuple else v


def plan_request(s: Mapping[str, str], config: Any = None) -> dict[str, Any]:
    """The request of the form's state: the fields its view reads, less those that would not act (hidden on the
    page: a method's own with another method, :func:`not_applying`'s)."""
    body = _request(s, config)
    hidden = _not_applying(body)
    return {k: v for k, v in body.items() if k not in hidden}


def _request(s: Mapping[str, str], config: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    texts = _precision_given({k: s.get(k, "") for k in PLAN_FIELDS})
    for k in PLAN_FIELDS:
        f = field_of(k)
        text = texts.get(k, "")
        if f.type is bool or text.strip():
            body[k] = request_value(f, text)
    body.update(modes.extra_request(s, s.get("view", modes.DEFAULT_VIEW), request_value))
    if config is not None:
        body.pop("model", None)
        body["config"] = config
    # the form holds every field; those the chosen method does not use are not sent (the API would
    # refuse them: schema.inapplicable)
    return {k: v for k, v in body.items() if k not in PLAN_FIELDS or schema.applies(k, body)}


# ------------------------------------------------------------------------------ widgets


def _choice_labels(f: schema.Field, lang: str) -> list[tuple[str, str]]:
    prefix = "web." + f.name
    # a field with no default (recipe, loss) starts with the empty choice: not given (``web.<name>.none``)
    empty = [("", i18n.t(f"{prefix}.none", lang))] if f.default is None and has(f"{prefix}.none", lang) else []
    return empty + [(v, i18n.t(f"{prefix}.{v}", lang) if has(f"{prefix}.{v}", lang) else v) for v in f.allowed() or ()]


def widget(name: str, lang: str) -> dict[str, Any]:
    """How the form shows a schema field: a select of its choices, a check box (a flag that is off
    by default: an unchecked box is not sent), a yes/no select (a flag that is on by default), or
    a text box (numeric, decimal or free text); and when it applies (``when``: its methods, GaLore)."""
    f = field_of(name)
    hint = f"web.plan.{name}_hint"
    when = {}
    if f.methods and name in PLAN_FIELDS:
        when["methods"] = " ".join(f.methods)
    if f.low_rank_only:
        when["lowrank"] = "1"
    if name in PROBED:
        when["probe"] = name  # hidden when cabe.schema.inapplicable says it would not act (not_applying)
    out: dict[str, Any] = {
        "name": name,
        "label": f"web.plan.{name}",
        "hint": hint if has(hint, lang) else None,
        "when": when,
    }
    if f.type is bool and not f.default:
        return {**out, "kind": "checkbox"}
    if f.type is bool:
        return {**out, "kind": "select", "choices": [("1", i18n.t("web.yes", lang)), ("0", i18n.t("web.no", lang))]}
    if f.allowed() is not None and f.type is not tuple:  # a list of choices (solve) is typed as a comma list
        return {**out, "kind": "select", "choices": _choice_labels(f, lang)}
    mode = {int: "numeric", float: "decimal"}.get(f.type, "text")
    return {**out, "kind": "input", "mode": mode}


def shown(w: Mapping[str, Any], s: Mapping[str, str], hidden: Any = ()) -> bool:
    """Does the widget's field apply to the form's state (its method, its optimizer, ``hidden``: the fields
    :func:`not_applying` found)? (app.js decides the same in the browser.)"""
    when = w.get("when") or {}
    if w["name"] in hidden:
        return False
    if "methods" in when and s.get("method", "") not in when["methods"].split():
        return False
    return not ("lowrank" in when and s.get("optimizer", "") not in LOW_RANK)


def _probe(f: schema.Field) -> Any:
    """A value of ``f`` other than its default (None for a list: the schema refuses none of them by companion)."""
    if f.type is bool:
        return not f.default
    allowed = f.allowed()
    if f.type is str and allowed:
        return next((v for v in allowed if v != f.default), None)
    if f.type is int and isinstance(f.default, int):
        return f.default + 1
    return None


#: the setup fields whose acting depends on another field's value (the schema's companions: ``loss_chunks`` with
#: the chunked loss, ``cp_impl`` with context parallelism, the FSDP knobs with FSDP ...), found by asking
#: :func:`cabe.schema.inapplicable`, not listed here; a method's own fields and GaLore's are decided in the browser
PROBED = tuple(
    f.name
    for f in schema.SETUP_FIELDS
    if f.name in FORM_FIELDS and not f.methods and not f.low_rank_only and _probe(f) is not None
)


def not_applying(s: Mapping[str, str]) -> list[str]:
    """The form's fields that would not act in the state ``s``'s request: given a value other than their
    default, :func:`cabe.schema.inapplicable` would refuse them (the page hides them, and sends them not)."""
    return _not_applying(_request(s))


def _not_applying(body: Mapping[str, Any]) -> list[str]:
    out = []
    for name in PROBED:
        try:
            refused = schema.inapplicable({**body, name: _probe(schema.field(name))})
        except (CabeError, ValueError, TypeError):  # a value of another field the estimate will refuse itself
            continue
        if any(n == name for n, _, _ in refused):
            out.append(name)
    return out


def _fieldset(legend: str, widgets: list[dict[str, Any]], views: tuple[str, ...]) -> dict[str, Any]:
    """A fieldset: its common widgets, its collapsed ones, and the methods it applies to (the union of its
    fields' when each has methods: the LoRA group is hidden for full fine-tuning)."""
    methods = [w["when"].get("methods") for w in widgets]
    return {
        "legend": legend,
        "views": views,
        "main": [w for w in widgets if w["name"] not in MORE],
        "more": [w for w in widgets if w["name"] in MORE],
        "methods": " ".join(dict.fromkeys(" ".join(methods).split())) if all(methods) else "",
    }


def plan_form(lang: str) -> dict[str, Any]:
    return {
        "views": modes.VIEWS,
        # the questions' own fieldsets first (several GPUs, serving), then the training setup
        "fieldsets": [
            _fieldset(legend, [{**widget(n, lang), "engine": modes.ENGINE_KNOBS.get(n)} for n in keys], views)
            for legend, keys, views in modes.FIELDSETS
        ]
        + [_fieldset(legend, [widget(n, lang) for n in names], modes.TRAINING_VIEWS) for legend, names in FIELDSETS],
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
        # the largest config file the readers take (cabe.configs): the script says so before sending one
        "cfg_limit": MAX_BYTES,
    }
