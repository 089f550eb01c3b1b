"""One request shape for every interface: a dict of snake_case fields -> a Report.

The CLI turns its options into this dict, the HTTP API takes it as JSON, the web page builds it
from its form. Fields (all optional, but a model or a parameter count is needed):

* ``params`` (billions), ``bytes_per_param``, ``activations_gb`` — the seed's simple mode;
  ``params`` without ``bytes_per_param`` is the lesson's mode (precision + optimizer).
* ``model`` (a preset name or Hugging Face id; a local path too when ``allow_files``) or
  ``config`` (a config.json object).
* every :class:`~cabe.training.TrainingSetup` field: ``method``, ``precision``, ``optimizer``,
  ``optimizer_impl``, ``batch``, ``seq``, ``grad_accum``, ``checkpointing``, ``attention``,
  ``lora_rank``, ``lora_alpha``, ``lora_targets``, ``quant``, ``double_quant``,
  ``compute_dtype``, ``trainable_layers``, ``prompt_tokens``.
* ``gpu``: a card name for the "fits?" answer.

The fields, their types, ranges and defaults are :mod:`cabe.schema`'s (``api.estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cabe import gpus as gpu_catalog
from cabe import knob_effects, models, schema, via_trace
from cabe.analytic import estimate_lesson, estimate_model, estimate_simple
from cabe.errors import CabeError, InvalidValueError
from cabe.method import LoraTarget, lora_parameters
from cabe.objectives import grpo
from cabe.report import Report
from cabe.training import TrainingSetup, parse_targets

SETUP_FIELDS = tuple(f.name for f in schema.SETUP_FIELDS)
#: what ``build`` accepts (besides ``lang`` and ``units``), in the order error messages list them
REQUEST_FIELDS = schema.names("api.estimate")


def setup_from(body: Mapping[str, Any]) -> TrainingSetup:
    """The setup of a request: the given fields over the defaults (:func:`cabe.schema.resolve_defaults`).
    A field given that would not act here is refused first (:func:`check_applicable`)."""
    check_applicable(body)
    return TrainingSetup(**schema.resolve_defaults(body))


def model_source(body: Mapping[str, Any], *, allow_files: bool) -> models.ModelSource | None:
    config = body.get("config")
    model = body.get("model")
    if config is not None and config != "":
        return models.from_mapping(config)
    if model is None or model == "":
        return None
    if not isinstance(model, str):
        raise InvalidValueError("not_string", "model", value=model)
    if not allow_files:
        text = model.strip()
        if text.lower() not in models.preset_names():
            if text.startswith((".", "/", "~")) or text.endswith(".json") or "\\" in text:
                raise InvalidValueError("no_files_here", "model", value=model)
            if "/" in text:
                return models.hub_model(text)
            return models.preset(text)
    return models.resolve(model)


def build(body: Mapping[str, Any], *, allow_files: bool = False, trace: str | None = None) -> Report:
    """Validate a request and compute its report. Raises :class:`~cabe.errors.CabeError`.

    ``trace``: where to trace a model whose architecture no family module reads (:mod:`cabe.via_trace`:
    ``process`` here, ``worker`` in the trace worker); None refuses it (``unsupported_architecture``)."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    unknown = [k for k in body if k not in REQUEST_FIELDS and k not in ("lang", "units", "explain")]
    if unknown:
        raise InvalidValueError("unknown_field", unknown[0], allowed=", ".join(REQUEST_FIELDS))
    explain = body.get("explain")
    if explain not in (None, False, True):
        raise InvalidValueError("not_bool", "explain", value=explain)
    setup = setup_from(body)
    src = model_source(body, allow_files=allow_files)
    params = body.get("params")
    if src is not None:
        if params not in (None, ""):
            raise InvalidValueError("model_and_params", "params")
        meta = {
            "source": src.kind,
            **{k: v for k, v in src.meta.items() if k in ("display", "hf_id", "gated", "family")},
        }
        if not src.known and trace is not None:
            report = via_trace.report(src.config, setup, name=src.name, meta=meta, where=trace)
            limit = (report.model or {}).get("max_positions")
            report = _with(report, notes=report.notes + beyond_limits(_Limit(limit or 0), setup.seq))
            if explain:  # a counterfactual per knob would be a trace each: said, not skipped without a word
                report = _with(report, notes=report.notes + ("knobs_not_traced",))
        else:
            spec = src.spec  # unsupported_architecture when no family module reads it and no trace is asked
            with grpo.on_card(_card(body)):  # a colocated vLLM's pool is a share of the named card
                report = estimate_model(spec, setup, model_meta=meta)
            report = _with(report, notes=report.notes + beyond_limits(spec, setup.seq))
            if explain:  # each memory knob against the request without it: one estimate each, only when asked
                knobs = knob_effects.effects(spec, setup, report, estimate_model)
                report = _with(report, extra={**report.extra, "knobs": knobs})
    elif params not in (None, ""):
        bpp = body.get("bytes_per_param")
        act = body.get("activations_gb") or 0.0
        if bpp not in (None, ""):
            report = estimate_simple(params, bpp, act)
        else:
            report = estimate_lesson(params, setup, act)
    else:
        raise InvalidValueError("missing_model", "model")
    card_name = body.get("gpu")
    if card_name:
        if not isinstance(card_name, str):  # a card is named (10**5000 would fail str() itself)
            raise InvalidValueError("not_string", "gpu", value=card_name)
        card = gpu_catalog.gpu(card_name)
        gpu_catalog.check_fp8(card, setup.fp8)  # a card without the recipe's fp8 GEMMs: a typed error
        if report.mode == "architecture":
            report = _with(report, cuda_context_bytes=card.cuda_context_bytes)
        bf16 = src is not None and gpu_catalog.needs_bf16(report)
        fit = gpu_catalog.fit(report, card, precision="bf16" if bf16 else None)
        report = _with(report, gpu=fit)
    return report


def _card(body: Mapping[str, Any]) -> Any:
    """The card a request names, or None."""
    name = body.get("gpu")
    if not name:
        return None
    if not isinstance(name, str):
        raise InvalidValueError("not_string", "gpu", value=name)
    return gpu_catalog.gpu(name)


def check_applicable(body: Mapping[str, Any]) -> None:
    """Every option acts or is refused: the first field given that would not act here
    (:func:`cabe.schema.inapplicable`) is a typed error naming it."""
    for name, code, params in schema.inapplicable(body):
        raise InvalidValueError(code, name, **{"value": body.get(name), **params})


def beyond_limits(spec: Any, seq: int) -> tuple[str, ...]:
    """Note codes for inputs past what the model was built for: a sequence longer than its
    ``max_position_embeddings`` (the memory is still computed; the model was not trained for it)."""
    limit = getattr(spec, "max_positions", 0) or 0
    return ("seq_beyond_max_positions",) if limit and seq > limit else ()


@dataclass(frozen=True)
class _Limit:
    """The one fact :func:`beyond_limits` reads, for a model without a spec (traced)."""

    max_positions: int


def _with(report: Report, **changes: Any) -> Report:
    from dataclasses import replace

    return replace(report, **changes)


def estimate_json(
    body: Mapping[str, Any], *, allow_files: bool = False, fits: bool = True, trace: str | None = None
) -> dict[str, Any]:
    """The JSON object of ``cabe estimate --json`` and ``POST /api/estimate`` (``trace``: see :func:`build`)."""
    report = build(body, allow_files=allow_files, trace=trace)
    out = report.to_json()
    if fits:
        out["fits_on"] = gpu_catalog.fits_on(report)
    return out


def error_json(err: CabeError, lang: str = "en") -> dict[str, Any]:
    return {"error": err.to_dict(lang)}


# ---- /api/lora, cabe.lora -------------------------------------------------------------------------
def check_fields(body: Any, command: str) -> None:
    """Refuse a key the endpoint's schema does not declare (``unknown_field``, with the field names
    listed as the core lists them: without ``lang`` / ``units``). Anything but an object is left to
    the endpoint's own ``body_not_object``."""
    if not isinstance(body, Mapping):
        return
    accepted = schema.accepted(command)
    for key in body:
        if key not in accepted:
            raise InvalidValueError("unknown_field", key, allowed=", ".join(schema.names(command)))


def _unaliased(body: Mapping[str, Any], command: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The body with older names (``rank``) under the field's name (``lora_rank``), and the name each
    field was sent as (errors name what the asker wrote). Both names at once: ``alias_conflict``."""
    out = dict(body)
    sent: dict[str, str] = {}
    for alias, name in schema.aliases(command).items():
        if alias not in out:
            continue
        if name in out:
            raise InvalidValueError("alias_conflict", alias, name=name)
        out[name] = out.pop(alias)
        sent[name] = alias
    return out, sent


def _int(f: schema.Field, value: Any, name: str) -> int:
    """An integer field in the schema's range, or ``not_integer`` / ``out_of_range`` about ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValueError("not_integer", name, value=value)
    lo, hi = int(f.minimum if f.minimum is not None else value), int(f.maximum if f.maximum is not None else value)
    if not lo <= value <= hi:
        raise InvalidValueError("out_of_range", name, value=value, minimum=lo, maximum=hi)
    return value


def _lora_targets(value: Any, name: str) -> tuple[str, ...]:
    """A list of module names, one comma string, or nothing given (PEFT's default for the model)."""
    if value is None or value == "":
        return tuple(schema.field("lora_targets").default)
    if isinstance(value, str):
        return parse_targets(value)
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return tuple(value)
    raise InvalidValueError("empty_list" if value == [] else "not_string", name, value=value)


def lora_json(body: Any, *, allow_files: bool = False) -> dict[str, Any]:
    """``POST /api/lora`` and ``cabe.lora``: adapter parameters per target module (``lora_rank`` / ``lora_targets``,
    or the older ``rank`` / ``targets``). The answer keeps its ``rank`` / ``targets`` keys."""
    return lora_answer(*lora_rows(body, allow_files=allow_files))


def lora_rows(body: Any, *, allow_files: bool = False) -> tuple[models.ModelSource, int, list[LoraTarget]]:
    """The model, the rank and :func:`cabe.method.lora_parameters`' rows a LoRA request asks for."""
    if not isinstance(body, Mapping):
        raise InvalidValueError("body_not_object", None)
    check_fields(body, "api.lora")
    req, sent = _unaliased(body, "api.lora")
    src = model_source(req, allow_files=allow_files)
    if src is None:
        raise InvalidValueError("missing_model", "model")
    rank_field = schema.field("lora_rank", "api.lora")
    rank = _int(rank_field, req.get("lora_rank", rank_field.default), sent.get("lora_rank", "lora_rank"))
    targets = _lora_targets(req.get("lora_targets"), sent.get("lora_targets", "lora_targets"))
    return src, rank, lora_parameters(src.spec, rank, targets)


def lora_answer(src: models.ModelSource, rank: int, rows: list[LoraTarget]) -> dict[str, Any]:
    spec = src.spec
    return {
        "model": src.name,
        "rank": rank,
        "targets": [r.name for r in rows],
        "num_layers": spec.num_layers,
        "per_target": [
            {
                "name": r.name,
                "in_features": r.in_features,
                "out_features": r.out_features,
                "per_layer": r.per_layer,
                "parameters": r.parameters,
            }
            for r in rows
        ],
        "total_parameters": sum(r.parameters for r in rows),
        "model_parameters": src.meta.get("parameters"),
    }
